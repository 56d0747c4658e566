from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class RequestType(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    Invalid: _ClassVar[RequestType]
    Ping: _ClassVar[RequestType]
    Lock: _ClassVar[RequestType]
    Unlock: _ClassVar[RequestType]

class ResponseStatus(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    Ok: _ClassVar[ResponseStatus]
    General: _ClassVar[ResponseStatus]
    Version: _ClassVar[ResponseStatus]
    InvalidType: _ClassVar[ResponseStatus]
    TooManyKeys: _ClassVar[ResponseStatus]
    AcquireTimeout: _ClassVar[ResponseStatus]
Invalid: RequestType
Ping: RequestType
Lock: RequestType
Unlock: RequestType
Ok: ResponseStatus
General: ResponseStatus
Version: ResponseStatus
InvalidType: ResponseStatus
TooManyKeys: ResponseStatus
AcquireTimeout: ResponseStatus

class Request(_message.Message):
    __slots__ = ("version", "id", "access_token", "type", "lock")
    VERSION_FIELD_NUMBER: _ClassVar[int]
    ID_FIELD_NUMBER: _ClassVar[int]
    ACCESS_TOKEN_FIELD_NUMBER: _ClassVar[int]
    TYPE_FIELD_NUMBER: _ClassVar[int]
    LOCK_FIELD_NUMBER: _ClassVar[int]
    version: int
    id: int
    access_token: str
    type: RequestType
    lock: RequestLock
    def __init__(self, version: _Optional[int] = ..., id: _Optional[int] = ..., access_token: _Optional[str] = ..., type: _Optional[_Union[RequestType, str]] = ..., lock: _Optional[_Union[RequestLock, _Mapping]] = ...) -> None: ...

class Response(_message.Message):
    __slots__ = ("version", "request_id", "status", "error_text", "keys", "server_unix_time", "fencing_tokens")
    VERSION_FIELD_NUMBER: _ClassVar[int]
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    STATUS_FIELD_NUMBER: _ClassVar[int]
    ERROR_TEXT_FIELD_NUMBER: _ClassVar[int]
    KEYS_FIELD_NUMBER: _ClassVar[int]
    SERVER_UNIX_TIME_FIELD_NUMBER: _ClassVar[int]
    FENCING_TOKENS_FIELD_NUMBER: _ClassVar[int]
    version: int
    request_id: int
    status: ResponseStatus
    error_text: str
    keys: _containers.RepeatedScalarFieldContainer[str]
    server_unix_time: int
    fencing_tokens: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, version: _Optional[int] = ..., request_id: _Optional[int] = ..., status: _Optional[_Union[ResponseStatus, str]] = ..., error_text: _Optional[str] = ..., keys: _Optional[_Iterable[str]] = ..., server_unix_time: _Optional[int] = ..., fencing_tokens: _Optional[_Iterable[int]] = ...) -> None: ...

class RequestLock(_message.Message):
    __slots__ = ("wait_micro", "release_micro", "keys", "fencing_tokens")
    WAIT_MICRO_FIELD_NUMBER: _ClassVar[int]
    RELEASE_MICRO_FIELD_NUMBER: _ClassVar[int]
    KEYS_FIELD_NUMBER: _ClassVar[int]
    FENCING_TOKENS_FIELD_NUMBER: _ClassVar[int]
    wait_micro: int
    release_micro: int
    keys: _containers.RepeatedScalarFieldContainer[str]
    fencing_tokens: bool
    def __init__(self, wait_micro: _Optional[int] = ..., release_micro: _Optional[int] = ..., keys: _Optional[_Iterable[str]] = ..., fencing_tokens: bool = ...) -> None: ...
