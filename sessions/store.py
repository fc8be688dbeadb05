"""The on-disk session store: `<root>/sessions/<fingerprint>/<session id>/{meta.msgpack, kv.zst}`.

Every file is written to a temporary name, fsynced, renamed, and the directory fsynced, so a crash
leaves either the old or the new file. The metadata carries a format version, the engine
fingerprint (model sha256 + context size + KV types + chat template) and the checksum of the KV
file; anything that fails to validate is discarded with a warning and the session falls back to a
full prefill. Clients resend their history, so discarding loses time, never data.
"""

from __future__ import annotations

import hashlib
import logging
import os
import shutil
import time
import zlib
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType
from typing import Any

import msgpack
import numpy as np
import zstandard

from engine.base import SavedState
from sessions.record import SessionRecord

log = logging.getLogger("pflash.store")

FORMAT_VERSION = 2  # 2: crc32 + zstd frame checksum instead of sha256 (resume latency)
META = "meta.msgpack"
KV = "kv.zst"


class StoreCorrupt(Exception):
    """A stored session failed validation."""


@dataclass(frozen=True)
class StoreEntry:
    session_id: str
    tenant: str
    last_used: float
    kv_tokens: int
    meta_bytes: int
    kv_bytes: int
    kv_raw_bytes: int

    @property
    def total_bytes(self) -> int:
        return self.meta_bytes + self.kv_bytes


def split_planes(blob: bytes) -> bytes:
    """Group the low and high bytes of 16-bit values: f16 KV compresses far better that way."""
    arr = np.frombuffer(blob, dtype=np.uint8)
    return arr[0::2].tobytes() + arr[1::2].tobytes()


def join_planes(data: bytes, n: int) -> bytes:
    arr = np.frombuffer(data, dtype=np.uint8)
    half = (n + 1) // 2
    out = np.empty(n, dtype=np.uint8)
    out[0::2] = arr[:half]
    out[1::2] = arr[half:n]
    return out.tobytes()


def fingerprint_dir(fingerprint: str) -> str:
    return hashlib.sha256(fingerprint.encode()).hexdigest()[:16]


def _write_atomic(path: Path, data: bytes) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        with tmp.open("wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except OSError:
        tmp.unlink(missing_ok=True)  # a half-written file on a full disk would keep it full
        raise
    _fsync_dir(path.parent)


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


class SessionStore:
    def __init__(self, root: Path, fingerprint: str, zstd_level: int = 1, budget_bytes: int | None = None) -> None:
        self.root = root
        self.fingerprint = fingerprint
        self.dir = root / "sessions" / fingerprint_dir(fingerprint)
        self.dir.mkdir(parents=True, exist_ok=True)
        self._level = zstd_level
        self._budget = budget_bytes
        self.counters: dict[str, int] = {"writes": 0, "reads": 0, "failures": 0, "discarded": 0, "evicted": 0}
        self._entries: dict[str, StoreEntry] | None = None  # the index, once scanned
        self._sweep()

    def _sweep(self) -> None:
        """What a crash (kill -9, power loss) leaves behind: temp files of writes that never got
        renamed, and session directories whose metadata was never written (nothing there loads)."""
        removed = 0
        try:
            for path in self.dir.iterdir():
                if not path.is_dir():
                    continue
                for tmp in path.glob(".*.tmp"):
                    tmp.unlink(missing_ok=True)
                    removed += 1
                if not (path / META).exists():
                    shutil.rmtree(path, ignore_errors=True)
                    removed += 1
        except OSError as exc:  # a read-only store still serves what it holds
            log.warning("store sweep failed: %s", exc)
        if removed:
            log.info("store: removed %d leftovers of interrupted writes", removed)

    def _session_dir(self, session_id: str) -> Path:
        if len(session_id) != 64 or any(c not in "0123456789abcdef" for c in session_id):
            raise ValueError("session ids in the store are sha256 hex digests")
        return self.dir / session_id

    # --- writing ---------------------------------------------------------------------------------
    def save(self, record: SessionRecord, state: SavedState | None) -> list[str]:
        """Persist a record and (if given) its KV state; returns the sessions evicted for space.
        Without a state, an existing KV file is kept: it still holds an exact prefix state."""
        path = self._session_dir(record.session_id)
        try:
            return self._save(path, record, state)
        except OSError:
            if not (path / META).exists():  # e.g. disk full on a first write: leave no empty shell
                shutil.rmtree(path, ignore_errors=True)
            raise

    def _save(self, path: Path, record: SessionRecord, state: SavedState | None) -> list[str]:
        path.mkdir(parents=True, exist_ok=True)
        kv_meta: dict[str, Any] | None = None
        if state is not None:
            # zstd's own frame checksum (xxh64) guards the content as it decompresses; crc32 of the
            # file catches a torn or flipped file before any work. Both cost far less than sha256
            # on the resume path, where every millisecond is time to first token.
            packed = zstandard.ZstdCompressor(level=self._level, write_checksum=True).compress(split_planes(state.blob))
            _write_atomic(path / KV, packed)
            kv_meta = {
                "tokens": list(state.tokens),
                "raw_bytes": len(state.blob),
                "zst_bytes": len(packed),
                "crc32": zlib.crc32(packed),
                "planes": 2,
            }
        else:
            kv_meta = self._existing_kv_meta(path)
        meta = {
            "format": FORMAT_VERSION,
            "fingerprint": self.fingerprint,
            "saved_at": time.time(),
            "session": record.to_dict(),
            "kv": kv_meta,
        }
        packed_meta = msgpack.packb(meta, use_bin_type=True)
        _write_atomic(path / META, packed_meta)
        if kv_meta is None and (path / KV).exists():
            (path / KV).unlink()
        self.counters["writes"] += 1
        # The index entry from what was just written (zst_bytes is the KV file's size, checked on
        # load); an index not scanned yet will read it from disk when first asked.
        if self._entries is not None:
            self._entries[record.session_id] = StoreEntry(
                session_id=record.session_id,
                tenant=record.tenant,
                last_used=record.last_used,
                kv_tokens=len(kv_meta["tokens"]) if kv_meta else 0,
                meta_bytes=len(packed_meta),
                kv_bytes=int(kv_meta["zst_bytes"]) if kv_meta else 0,
                kv_raw_bytes=int(kv_meta["raw_bytes"]) if kv_meta else 0,
            )
        return self.enforce_budget(protect={record.session_id})

    def _existing_kv_meta(self, path: Path) -> dict[str, Any] | None:
        try:
            old = self._read_meta(path)
        except (StoreCorrupt, FileNotFoundError):
            return None
        kv = old.get("kv")
        return kv if isinstance(kv, dict) else None

    # --- reading ---------------------------------------------------------------------------------
    def _read_meta(self, path: Path) -> dict[str, Any]:
        raw = (path / META).read_bytes()
        try:
            meta = msgpack.unpackb(raw, raw=False, strict_map_key=False)
        except Exception as exc:
            raise StoreCorrupt(f"unreadable metadata: {exc}") from exc
        if not isinstance(meta, dict):
            raise StoreCorrupt("metadata is not a map")
        if meta.get("format") != FORMAT_VERSION:
            raise StoreCorrupt(f"format version {meta.get('format')!r} != {FORMAT_VERSION}")
        if meta.get("fingerprint") != self.fingerprint:
            raise StoreCorrupt("fingerprint of another model, context size, KV type or chat template")
        return meta

    def load_record(self, session_id: str) -> SessionRecord | None:
        path = self._session_dir(session_id)
        if not (path / META).exists():
            return None
        try:
            meta = self._read_meta(path)
            record = SessionRecord.from_dict(meta["session"])
            if record.session_id != session_id:
                raise StoreCorrupt("metadata names another session")
        except (StoreCorrupt, KeyError, TypeError, ValueError, OSError) as exc:
            self._discard(session_id, f"metadata: {exc}")
            return None
        self.counters["reads"] += 1
        return record

    def load_state(self, session_id: str) -> SavedState | None:
        path = self._session_dir(session_id)
        try:
            meta = self._read_meta(path)
            kv = meta.get("kv")
            if not kv:
                return None
            packed = (path / KV).read_bytes()
            if len(packed) != kv["zst_bytes"] or zlib.crc32(packed) != kv["crc32"]:
                raise StoreCorrupt("KV checksum mismatch (truncated or modified)")
            blob = join_planes(zstandard.ZstdDecompressor().decompress(packed, max_output_size=kv["raw_bytes"]), kv["raw_bytes"])
            tokens = tuple(int(t) for t in kv["tokens"])
        except FileNotFoundError:
            return None
        except (StoreCorrupt, KeyError, TypeError, ValueError, zstandard.ZstdError, OSError) as exc:
            self.counters["failures"] += 1
            log.warning("session %s: stored KV discarded (%s); serving by full prefill", session_id[:12], exc)
            self._drop_kv(path)
            return None
        self.counters["reads"] += 1
        return SavedState(tokens, blob)

    def _drop_kv(self, path: Path) -> None:
        try:
            (path / KV).unlink(missing_ok=True)
        except OSError:
            pass

    def _discard(self, session_id: str, why: str) -> None:
        self.counters["discarded"] += 1
        log.warning("session %s: stored session discarded (%s); serving by full prefill", session_id[:12], why)
        self.delete(session_id)

    # --- index and housekeeping ------------------------------------------------------------------
    def entry(self, session_id: str) -> StoreEntry | None:
        path = self._session_dir(session_id)
        try:
            meta = self._read_meta(path)
            session = meta["session"]
            kv = meta.get("kv") or {}
            kv_file = path / KV
            return StoreEntry(
                session_id=session_id,
                tenant=str(session["tenant"]),
                last_used=float(session["last_used"]),
                kv_tokens=len(kv.get("tokens", [])),
                meta_bytes=(path / META).stat().st_size,
                kv_bytes=kv_file.stat().st_size if kv_file.exists() else 0,
                kv_raw_bytes=int(kv.get("raw_bytes", 0)),
            )
        except (StoreCorrupt, KeyError, TypeError, ValueError, OSError) as exc:
            if path.exists():
                log.warning("session %s: stored session ignored (%s); it will be served by full prefill",
                            session_id[:12], exc)
            return None

    def _live_index(self) -> dict[str, StoreEntry]:
        """Every valid stored session (invalid ones are left for `sessions gc`), without loading
        KV states. Scanned once, then kept current by save and delete: a budget check on every
        save must not re-read every session's metadata."""
        if self._entries is None:
            entries: dict[str, StoreEntry] = {}
            for path in sorted(self.dir.iterdir()) if self.dir.exists() else []:
                if path.is_dir() and not path.name.startswith(".") and (found := self.entry(path.name)):
                    entries[path.name] = found
            self._entries = entries
        return self._entries

    def index(self) -> Mapping[str, StoreEntry]:
        """A read-only view of the index; it follows later saves and deletes."""
        return MappingProxyType(self._live_index())

    def delete(self, session_id: str) -> bool:
        path = self._session_dir(session_id)
        if self._entries is not None:
            self._entries.pop(session_id, None)
        if not path.exists():
            return False
        shutil.rmtree(path, ignore_errors=True)
        return True

    def enforce_budget(self, protect: set[str] = frozenset()) -> list[str]:  # type: ignore[assignment]
        if self._budget is None:
            return []
        entries = sorted(self._live_index().values(), key=lambda e: e.last_used)
        total = sum(e.total_bytes for e in entries)
        evicted: list[str] = []
        for entry in entries:
            if total <= self._budget:
                break
            if entry.session_id in protect:
                continue
            self.delete(entry.session_id)
            total -= entry.total_bytes
            evicted.append(entry.session_id)
        self.counters["evicted"] += len(evicted)
        return evicted
