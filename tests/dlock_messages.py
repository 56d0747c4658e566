"""
dlock requests and responses (L{jesync.protocols.dlock_pb2}) as the dlock
tests of every tier build and read them.
"""

from __future__ import annotations

from jesync.protocols import dlock_pb2

Request = dlock_pb2.Request
Response = dlock_pb2.Response
RequestLock = dlock_pb2.RequestLock

MAX_UINT64 = 2**64 - 1
#: The fields the reference server's responses carry (temoto/dlock,
#: dlock-server/handler.go): everything but jesync's fencing_tokens.
REFERENCE_FIELDS = {"version", "request_id", "status", "error_text", "keys", "server_unix_time"}


def ping(id: int = 1, **fields) -> Request:
    fields.setdefault("version", 2)
    return Request(id=id, type=dlock_pb2.Ping, **fields)


def lock(
    keys, id: int = 1, wait_micro: int = 0, release_micro: int = 0, fencing_tokens: bool = False, **fields
) -> Request:
    """
    A Lock request (C{wait_micro} 0: wait without limit; C{release_micro} 0:
    held until disconnect; C{fencing_tokens}: ask for the keys' tokens, which
    the reference's clients never do).
    """
    fields.setdefault("version", 2)
    body = RequestLock(
        keys=list(keys), wait_micro=wait_micro, release_micro=release_micro, fencing_tokens=fencing_tokens
    )
    return Request(id=id, type=dlock_pb2.Lock, lock=body, **fields)


def unlock(keys, id: int = 1, **fields) -> Request:
    fields.setdefault("version", 2)
    return Request(id=id, type=dlock_pb2.Unlock, lock=RequestLock(keys=list(keys)), **fields)


def status_name(response: Response) -> str:
    return dlock_pb2.ResponseStatus.Name(response.status)


def outcome(response: Response) -> tuple:
    """What a test compares first: (status, request_id, keys)."""
    return (status_name(response), response.request_id, list(response.keys))


def parse_responses(data: bytes) -> list[Response]:
    """Every response in C{data}, which must be whole frames."""
    responses = []
    while data:
        assert len(data) >= 4, data
        end = 4 + int.from_bytes(data[:4], "big")
        assert len(data) >= end, data
        responses.append(Response.FromString(data[4:end]))
        data = data[end:]
    return responses


def field_names(response: Response) -> set:
    """The fields set in C{response} (a field at its default, as proto3 sends it, is not)."""
    return {field.name for field, _ in response.ListFields()}
