"""The KV file's body: a state's bytes as two byte planes, each stored raw or as one zstd frame.

f16 KV values split into a plane of low bytes and a plane of high bytes. The high bytes (sign,
exponent, top of the mantissa) compress about 1.4× with zstd; the low bytes are near random and
compress by well under 1 %, so they are stored raw: decompressing them would cost a resume tens of
milliseconds for nothing. Which codec a plane gets is decided on a sample of it, so a KV type
whose planes both compress (or neither) is stored as well as it can be.

Resume time is time to first token: `decode` joins the planes, a chunk at a time, into one
writable buffer that llama.cpp reads in place (no `bytes` copy, no ctypes copy). Fresh memory is
slow to touch the first time (page faults, and on a VM the host's own), so the caller passes that
buffer in (sessions/state_buffers.py reuses them) and nothing else the size of the state is
allocated.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence

import numpy as np
import zstandard

CHUNK = 1 << 20  # bytes of one plane handed to the compressor (or the file) at a time
_SAMPLES = 8  # slices of a plane, spread over it, compressed to choose its codec
_SAMPLE = 1 << 17  # bytes of one slice, from its middle (a state's first bytes are not typical)
_MIN_GAIN = 0.03  # a plane that zstd shrinks by less than this is stored raw

Frame = tuple[str, int]  # (codec "raw" | "zstd", stored bytes)


def _planes(blob: bytes | memoryview) -> tuple[np.ndarray, np.ndarray]:
    arr = np.frombuffer(blob, dtype=np.uint8)
    return arr[0::2], arr[1::2]


def plane_sizes(n: int) -> tuple[int, int]:
    return (n + 1) // 2, n // 2


def _compresses(plane: np.ndarray, level: int) -> bool:
    step = max(_SAMPLE, len(plane) // _SAMPLES)
    sample = b"".join(plane[at : at + _SAMPLE].tobytes() for at in range(step // 2, len(plane), step)) or plane.tobytes()
    if not sample:
        return False
    return len(zstandard.ZstdCompressor(level=level).compress(sample)) < (1 - _MIN_GAIN) * len(sample)


def _chunks(plane: np.ndarray) -> Iterator[bytes]:
    for at in range(0, len(plane), CHUNK):
        yield plane[at : at + CHUNK].tobytes()


def encode(blob: bytes | memoryview, level: int) -> tuple[list[Frame], Iterator[bytes]]:
    """The frames' table and their bytes in order, a chunk at a time. A compressed plane is held
    whole (it goes after the table, which needs its size); a raw plane streams from `blob`."""
    frames: list[Frame] = []
    stored: list[list[bytes] | np.ndarray] = []
    for plane in _planes(blob):
        if _compresses(plane, level):
            compressor = zstandard.ZstdCompressor(level=level, write_checksum=True).compressobj(size=len(plane))
            out = [compressor.compress(chunk) for chunk in _chunks(plane)]
            out.append(compressor.flush())
            frames.append(("zstd", sum(len(part) for part in out)))
            stored.append(out)
        else:
            frames.append(("raw", len(plane)))
            stored.append(plane)

    def parts() -> Iterator[bytes]:
        for item in stored:
            yield from (item if isinstance(item, list) else _chunks(item))

    return frames, parts()


class _PlaneReader:
    """One plane of the body, handed out a chunk at a time: a raw plane as views of the file, a
    zstd plane decompressed into one reused chunk buffer (no fresh buffer the size of the plane)."""

    def __init__(self, part: memoryview, codec: object, size: int) -> None:
        self.size = size
        self._raw = part if codec == "raw" else None
        if codec == "raw" and len(part) != size:
            raise ValueError("a plane has the wrong size")
        if codec not in ("raw", "zstd"):
            raise ValueError(f"unknown codec {codec!r}")
        self._reader = zstandard.ZstdDecompressor().stream_reader(part) if codec == "zstd" else None
        self._chunk = np.empty(min(CHUNK, size), dtype=np.uint8)
        self._at = 0

    def take(self, k: int) -> np.ndarray:
        at, self._at = self._at, self._at + k
        if self._raw is not None:
            return np.frombuffer(self._raw[at : at + k], dtype=np.uint8)
        assert self._reader is not None
        view, got = memoryview(self._chunk)[:k], 0
        while got < k and (step := self._reader.readinto(view[got:])):
            got += step
        if got != k:
            raise ValueError("a plane has the wrong size")
        return self._chunk[:k]

    def finish(self) -> None:
        if self._reader is not None:
            with self._reader:
                if self._reader.read(1):  # reading to the end also checks the frame's checksum
                    raise ValueError("a plane has the wrong size")


def decode(body: memoryview, frames: Sequence[Sequence[object]], out: np.ndarray) -> memoryview:
    """The state's bytes from the frames of `encode`, written into `out` (uint8, exactly the
    state's size) and returned as a writable view (ctypes shares a writable buffer instead of
    copying it). ValueError on a table that does not fit the body or the size;
    zstandard.ZstdError on a damaged frame (its xxh64 checksum)."""
    n = len(out)
    if len(frames) != 2:
        raise ValueError(f"{len(frames)} frames, expected 2")
    readers: list[_PlaneReader] = []
    at = 0
    for (codec, stored), size in zip(frames, plane_sizes(n)):
        if not isinstance(stored, int) or stored < 0 or at + stored > len(body):
            raise ValueError("frame table does not fit the file")
        readers.append(_PlaneReader(body[at : at + stored], codec, size))
        at += stored
    if at != len(body):
        raise ValueError("bytes after the last frame")
    low, high = readers
    pairs = out[: n - n % 2].view("<u2")  # little-endian: the low byte first, whatever the host
    for start in range(0, high.size, CHUNK):
        k = min(CHUNK, high.size - start)
        lows, dst = low.take(k), pairs[start : start + k]
        np.left_shift(high.take(k), 8, out=dst, dtype="<u2")
        np.bitwise_or(dst, lows, out=dst)
    if n % 2:
        out[-1] = low.take(1)[0]
    low.finish()
    high.finish()
    return memoryview(out)


def decode_single_frame(frame: memoryview, out: np.ndarray) -> memoryview:
    """Files written before the frame table: both planes, concatenated, in one zstd frame."""
    n = len(out)
    data = zstandard.ZstdDecompressor().decompress(frame, max_output_size=n)
    if len(data) != n:
        raise ValueError("the frame holds the wrong number of bytes")
    arr = np.frombuffer(data, dtype=np.uint8)
    low = plane_sizes(n)[0]
    out[0::2], out[1::2] = arr[:low], arr[low:]
    return memoryview(out)


def split(blob: bytes | memoryview) -> bytes:
    """Both planes concatenated (tests and the resume benchmark's plain-zstd comparison)."""
    low, high = _planes(blob)
    return low.tobytes() + high.tobytes()
