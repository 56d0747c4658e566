"""Kept for old imports: the key rules live in L{jesync.wire}."""

from jesync.wire import decode_key, encode_key

__all__ = ["decode_key", "encode_key"]
