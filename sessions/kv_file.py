"""One KV state as a file: the format both the session store and the prefix checkpoints write.

`KV_MAGIC`, a u32 header length, a msgpack header (format, fingerprint, token ids, raw size, the
planes' frame table), the planes' frames (sessions/kv_codec.py), and a u32 crc32 of the frames.
zstd's own frame checksum guards a compressed plane as it decompresses; the crc32 trailer covers
every frame (raw ones too) and catches a torn or flipped file before any work.
"""

from __future__ import annotations

import mmap
import os
import struct
import zlib
from collections.abc import Callable
from pathlib import Path
from typing import Any, BinaryIO

import msgpack
import numpy as np

from engine.base import SavedState
from sessions import kv_codec
from sessions.files import write_atomic
from sessions.layout import FORMAT_VERSION, KV_MAGIC, StoreCorrupt, head_bytes, read_kv_header


def write_kv(path: Path, state: SavedState, fingerprint: str, level: int, extra: dict[str, Any] | None = None) -> int:
    """Write `state` atomically to `path`; the bytes written. `extra` joins the header."""
    frames, parts = kv_codec.encode(state.blob, level)
    header = msgpack.packb({**(extra or {}), "format": FORMAT_VERSION, "fingerprint": fingerprint,
                            "tokens": list(state.tokens), "raw_bytes": len(state.blob), "planes": 2,
                            "frames": [list(f) for f in frames]}, use_bin_type=True)
    written = 0

    def fill(fh: BinaryIO) -> None:
        nonlocal written
        fh.write(KV_MAGIC + struct.pack("<I", len(header)) + header)
        crc, size = 0, 0
        for part in parts:
            crc = zlib.crc32(part, crc)
            size += len(part)
            fh.write(part)
        fh.write(struct.pack("<I", crc))
        written = 8 + len(header) + size + 4

    write_atomic(path, fill)
    return written


def map_file(path: Path) -> memoryview:
    """A read-only view of a whole file: the resume path reads the raw plane straight from the page
    cache instead of copying the file into a `bytes` first. Not MAP_POPULATE: CPython holds the
    GIL through mmap(), so populating there would stall the event loop for the whole disk read.
    The pages come in on first touch instead (the crc32 pass, which releases the GIL), after a
    read-ahead hint."""
    with path.open("rb") as fh:
        size = os.fstat(fh.fileno()).st_size
        if size == 0:
            return memoryview(b"")
        # Unmapped when the last view into it is released, after decoding has copied what it needs.
        mapped = mmap.mmap(fh.fileno(), size, flags=mmap.MAP_SHARED, prot=mmap.PROT_READ)
    if hasattr(mmap, "MADV_WILLNEED"):
        mapped.madvise(mmap.MADV_WILLNEED)
    return memoryview(mapped)


def read_kv(path: Path, fingerprint: str, take: Callable[[int], np.ndarray]) -> SavedState:
    """The state in `path`, decoded into `take(raw_bytes)`. FileNotFoundError when absent;
    StoreCorrupt, KeyError, TypeError, ValueError or zstandard.ZstdError when it fails to validate."""
    data = map_file(path)
    header, start = read_kv_header(data)
    if header.get("format") != FORMAT_VERSION or header.get("fingerprint") != fingerprint:
        raise StoreCorrupt("KV file of another format or fingerprint")
    frame = data[start:-4]
    if len(data) < start + 4 or zlib.crc32(frame) != struct.unpack("<I", data[-4:])[0]:
        raise StoreCorrupt("KV checksum mismatch (truncated or modified)")
    out = take(int(header["raw_bytes"]))
    frames = header.get("frames")
    blob = kv_codec.decode_single_frame(frame, out) if frames is None else kv_codec.decode(frame, frames, out)
    return SavedState(tuple(int(t) for t in header["tokens"]), blob)


def read_kv_head(path: Path) -> dict[str, Any]:
    """Only the header of a KV file (the frames after it can be gigabytes)."""
    with path.open("rb") as fh:
        header, _start = read_kv_header(head_bytes(fh))
    return header
