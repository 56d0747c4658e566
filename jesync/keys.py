"""
How keys on the wire (bytes) become keys in the lock table (str), and back.

Keys are opaque bytes.  They are decoded as UTF-8 with any invalid bytes kept
as surrogate escapes, so every byte string is a distinct key, a UTF-8 key is
the same key a Python caller names with the same text, and every key is echoed
back exactly as it was sent.
"""


def decode_key(field: bytes) -> str:
    return field.decode("utf-8", "surrogateescape")


def encode_key(key: str) -> bytes:
    return key.encode("utf-8", "surrogateescape")
