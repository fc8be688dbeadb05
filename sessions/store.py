"""The on-disk session store: `<root>/sessions/<fingerprint>/<session id>/{meta.msgpack, kv.zst}`.

Two files per session, written independently:
- `meta.msgpack`, the session record (kept-line maps, recall log, features, transcript): small,
  written ahead of every response that depends on it (see SessionRegistry);
- `kv.zst`, the KV state: written on a RAM spill and at shutdown. A header (token ids, sizes),
  the state's two byte planes, each raw or one zstd frame (sessions/kv_codec.py), and a crc32
  trailer of those frames.

Every file is written to a unique temporary name and renamed, so a crash leaves either the old or
the new file; files are 0600 and directories 0700 whatever the umask. The metadata carries a format
version and the engine fingerprint (model sha256 + context size + KV types + chat template);
anything that fails to validate is discarded with a warning and the session falls back to a full
prefill. Clients resend their history, so discarding loses time, never data.

Not thread-safe for writes: the registry runs every write, load and delete on one I/O thread.
The index is read from other threads through `index()`, a copy taken under its own small lock.
"""

from __future__ import annotations

import logging
import shutil
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import msgpack
import zstandard

from engine.base import SavedState
from sessions.files import PendingSyncs, make_private_dirs, write_atomic
from sessions.kv_file import read_kv, read_kv_head, write_kv
from sessions.layout import CURRENT, FORMAT_VERSION, KV, META, StoreCorrupt, fingerprint_dir
from sessions.record import SessionRecord
from sessions.state_buffers import StateBuffers

log = logging.getLogger("pflash.store")

@dataclass(frozen=True)
class StoreEntry:
    session_id: str
    tenant: str
    parent: str  # "" for a session's root record, else the root's id (a branch)
    kind: str  # the branch's kind: "main" | "agent" | "side" | "fork"
    hint: str  # the agent id a branch was opened for
    last_used: float
    kv_tokens: int
    meta_bytes: int
    kv_bytes: int
    kv_raw_bytes: int

    @property
    def total_bytes(self) -> int:
        return self.meta_bytes + self.kv_bytes


def _described(session: dict[str, Any]) -> tuple[str, str, str, str, float]:
    """What the index keeps of a record: tenant, parent, kind, hint, last used."""
    return (str(session["tenant"]), str(session.get("parent", "")), str(session.get("kind", "main")),
            str(session.get("hint", "")), float(session["last_used"]))


class SessionStore:
    def __init__(self, root: Path, fingerprint: str, zstd_level: int = 1, budget_bytes: int | None = None) -> None:
        self.root = root
        self.fingerprint = fingerprint
        self.base = root / "sessions"
        self.dir = self.base / fingerprint_dir(fingerprint)
        make_private_dirs(self.dir)
        self._level = zstd_level
        self._budget = budget_bytes
        # Exported on /metrics (gateway/metrics.py) through SessionRegistry.stats().
        self.counters: dict[str, int] = {"writes": 0, "reads": 0, "failures": 0, "discarded": 0, "evicted": 0,
                                         "record_writes": 0, "syncs": 0, "sync_failures": 0, "kv_bytes_written": 0,
                                         "record_bytes_written": 0, "leftovers_removed": 0}
        self.pending = PendingSyncs()
        self.buffers = StateBuffers()  # what loaded states are decoded into
        self._index_lock = threading.Lock()
        self._entries: dict[str, StoreEntry] | None = None  # the index, once scanned
        self._stale: dict[Path, tuple[int, float]] | None = None  # other fingerprints: (bytes, mtime)
        self._sweep()
        self._mark_current()

    def _sweep(self) -> None:
        """What a crash (kill -9, power loss) leaves behind: temp files of writes that never got
        renamed, and session directories without a record (nothing there loads)."""
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
            self.counters["leftovers_removed"] += removed
            log.info("store: removed %d leftovers of interrupted writes", removed)

    def _mark_current(self) -> None:
        """Name the live fingerprint directory, so `sessions gc` knows which others are stale."""
        try:
            write_atomic(self.base / CURRENT, lambda fh: fh.write(self.dir.name.encode()))
        except OSError as exc:
            log.warning("store: cannot mark the current fingerprint: %s", exc)

    def _session_dir(self, session_id: str) -> Path:
        if len(session_id) != 64 or any(c not in "0123456789abcdef" for c in session_id):
            raise ValueError("session ids in the store are sha256 hex digests")
        return self.dir / session_id

    # --- writing ---------------------------------------------------------------------------------
    def save(self, record: SessionRecord, state: SavedState | None) -> list[str]:
        """Persist a record and (if given) its KV state; returns the sessions evicted for space.
        Without a state, an existing KV file is kept: it still holds an exact prefix state."""
        self.save_record(record.to_dict())
        return self.save_kv(record.session_id, state) if state is not None else []

    def save_record(self, data: dict[str, Any], sync: bool = True) -> None:
        """Write a record snapshot (SessionRecord.to_dict()). `sync=False` leaves the fsync to
        `sync_pending()` (the batched policy): safe against a kill, not yet against a power cut."""
        session_id = str(data["session_id"])
        path = self._session_dir(session_id)
        fresh = not path.exists()
        try:
            make_private_dirs(path)
            meta = {"format": FORMAT_VERSION, "fingerprint": self.fingerprint, "saved_at": time.time(), "session": data}
            packed = msgpack.packb(meta, use_bin_type=True)
            write_atomic(path / META, lambda fh: fh.write(packed), sync=sync)
        except OSError:
            if fresh:  # e.g. disk full on a first write: leave no empty shell
                shutil.rmtree(path, ignore_errors=True)
            raise
        if not sync:
            self.pending.add(path / META)
        self.counters["record_writes"] += 1
        self.counters["record_bytes_written"] += len(packed)
        self._index_update(session_id, lambda old: StoreEntry(
            session_id, *_described(data), old.kv_tokens if old else 0, len(packed),
            old.kv_bytes if old else 0, old.kv_raw_bytes if old else 0))

    def save_kv(self, session_id: str, state: SavedState) -> list[str]:
        """Write a KV state (the session's record must be on disk first); returns evicted sessions."""
        path = self._session_dir(session_id)
        if not (path / META).exists():
            raise FileNotFoundError(f"session {session_id[:12]} has no record on disk")
        raw = len(state.blob)
        written = write_kv(path / KV, state, self.fingerprint, self._level)
        self.counters["writes"] += 1
        self.counters["kv_bytes_written"] += written
        self._index_update(session_id, lambda old: old and replace(old, kv_tokens=len(state.tokens), kv_bytes=written,
                                                                   kv_raw_bytes=raw))
        return self.enforce_budget(protect={session_id})

    def sync_pending(self) -> int:
        """fsync what `save_record(sync=False)` left unsynced; the number of files."""
        try:
            synced = self.pending.sync()
        except OSError as exc:  # the files are renamed into place already; only durability waits
            self.counters["sync_failures"] += 1
            log.error("store: fsync failed: %s", exc)
            return 0
        if synced:
            self.counters["syncs"] += 1
        return synced

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
            state = read_kv(path / KV, self.fingerprint, self.buffers.take)
        except FileNotFoundError:
            return None
        except (StoreCorrupt, KeyError, TypeError, ValueError, zstandard.ZstdError, OSError) as exc:
            self.counters["failures"] += 1
            log.warning("session %s: stored KV discarded (%s); serving by full prefill", session_id[:12], exc)
            self._drop_kv(session_id)
            return None
        self.counters["reads"] += 1
        return state

    def _drop_kv(self, session_id: str) -> None:
        try:
            (self._session_dir(session_id) / KV).unlink(missing_ok=True)
        except OSError:
            pass
        # /v1/sessions must not keep naming a tier that is gone
        self._index_update(session_id, lambda old: old and replace(old, kv_tokens=0, kv_bytes=0, kv_raw_bytes=0))

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
            kv_tokens, kv_bytes, kv_raw = 0, 0, 0
            if (path / KV).exists():
                header = read_kv_head(path / KV)
                kv_tokens, kv_raw = len(header.get("tokens", [])), int(header.get("raw_bytes", 0))
                kv_bytes = (path / KV).stat().st_size
            return StoreEntry(session_id, *_described(session), kv_tokens, (path / META).stat().st_size, kv_bytes,
                              kv_raw)
        except (StoreCorrupt, KeyError, TypeError, ValueError, OSError) as exc:
            if path.exists():
                log.warning("session %s: stored session ignored (%s); it will be served by full prefill",
                            session_id[:12], exc)
            return None

    def _live_index(self) -> dict[str, StoreEntry]:
        """Every valid stored session (invalid ones are left for `sessions gc`), without loading
        KV states. Scanned once, then kept current by save and delete."""
        with self._index_lock:
            if self._entries is not None:
                return self._entries
        entries: dict[str, StoreEntry] = {}
        for path in sorted(self.dir.iterdir()) if self.dir.exists() else []:
            if path.is_dir() and not path.name.startswith(".") and (found := self.entry(path.name)):
                entries[path.name] = found
        with self._index_lock:
            if self._entries is None:
                self._entries = entries
            return self._entries

    def index(self) -> dict[str, StoreEntry]:
        """A copy of the index, safe to iterate while the I/O thread writes."""
        live = self._live_index()
        with self._index_lock:
            return dict(live)

    def has(self, session_id: str) -> bool:
        return self._index_get(session_id) is not None

    def has_kv(self, session_id: str) -> bool:
        entry = self._index_get(session_id)
        return entry is not None and entry.kv_tokens > 0

    def _index_get(self, session_id: str) -> StoreEntry | None:
        live = self._live_index()
        with self._index_lock:
            return live.get(session_id)

    def _index_update(self, session_id: str, change: Callable[[StoreEntry | None], StoreEntry | None]) -> None:
        """Read and replace one entry at once: records and KV states are written by two threads."""
        live = self._live_index()
        with self._index_lock:
            entry = change(live.get(session_id))
            if entry is not None:
                live[session_id] = entry

    def delete(self, session_id: str) -> bool:
        path = self._session_dir(session_id)
        live = self._live_index()
        with self._index_lock:
            live.pop(session_id, None)
        if not path.exists():
            return False
        shutil.rmtree(path, ignore_errors=True)
        return True

    def stale_dirs(self) -> dict[Path, tuple[int, float]]:
        """Directories of other fingerprints (another model or context size): (bytes, mtime).
        This server can never load them; they count against the disk budget and go first."""
        if self._stale is None:
            stale: dict[Path, tuple[int, float]] = {}
            for path in self.base.iterdir() if self.base.exists() else []:
                if path.is_dir() and path != self.dir:
                    size = sum(f.stat().st_size for f in path.rglob("*") if f.is_file())
                    stale[path] = (size, path.stat().st_mtime)
            self._stale = stale
        return self._stale

    def stale_bytes(self) -> int:
        return sum(size for size, _mtime in self.stale_dirs().values())

    def enforce_budget(self, protect: set[str] = frozenset()) -> list[str]:  # type: ignore[assignment]
        if self._budget is None:
            return []
        entries = sorted(self.index().values(), key=lambda e: e.last_used)
        total = sum(e.total_bytes for e in entries) + self.stale_bytes()
        stale = self.stale_dirs()
        for path, (size, _mtime) in sorted(stale.items(), key=lambda item: item[1][1]):
            if total <= self._budget:
                break
            shutil.rmtree(path, ignore_errors=True)
            del stale[path]
            total -= size
            log.info("store: removed %s (another model or context size) for the disk budget", path.name)
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

