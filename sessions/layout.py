"""Names and headers of the session store's files, shared by the store and the `sessions` CLI."""

from __future__ import annotations

import hashlib
import struct
from typing import Any, BinaryIO

import msgpack

FORMAT_VERSION = 3  # 3: record and KV in separate files; KV streamed with a header and a crc32 trailer
META = "meta.msgpack"  # the session record
KV = "kv.zst"  # KV_MAGIC, u32 header length, msgpack header, the planes' frames (kv_codec), u32 crc32 of them
KV_MAGIC = b"PFKV"
CURRENT = ".current"  # in <store>/sessions: the fingerprint directory the last server used


class StoreCorrupt(Exception):
    """A stored session failed validation."""


def fingerprint_dir(fingerprint: str) -> str:
    return hashlib.sha256(fingerprint.encode()).hexdigest()[:16]


def read_kv_header(data: bytes | memoryview) -> tuple[dict[str, Any], int]:
    """The KV file's header and the offset where its frames start."""
    if len(data) < 8 or bytes(data[:4]) != KV_MAGIC:
        raise StoreCorrupt("not a KV file")
    (length,) = struct.unpack("<I", data[4:8])
    if len(data) < 8 + length:
        raise StoreCorrupt("KV header truncated")
    try:
        header = msgpack.unpackb(data[8 : 8 + length], raw=False, strict_map_key=False)
    except Exception as exc:
        raise StoreCorrupt(f"unreadable KV header: {exc}") from exc
    if not isinstance(header, dict):
        raise StoreCorrupt("KV header is not a map")
    return header, 8 + length


def head_bytes(fh: BinaryIO) -> bytes:
    """Only the header of an open KV file (the frame after it can be gigabytes)."""
    start = fh.read(8)
    if len(start) < 8 or start[:4] != KV_MAGIC:
        return start
    (length,) = struct.unpack("<I", start[4:8])
    return start + fh.read(length)
