"""Prefix checkpoints: KV states of prompt prefixes, shared by every session whose prompt starts
with the same token ids (`<root>/checkpoints/<fingerprint>/<key>.kv`).

Claude Code sends the same 12K-token system prompt and tools in every session, sub-agent spawn and
side request; a checkpoint saved where they end lets each new one prefill only what follows. A
checkpoint is found by the sha256 of the token ids it covers (policies/prefix_keys.py) and used
only after its token ids compare equal to the prompt's first ones: a hash names a candidate,
never vouches for it. Nothing is truncated, so this holds for sliding-window caches too.

Who owns what: `_lock` guards the maps and counters only, never held for I/O. Disk writes (spills,
flush) and reads run on one I/O thread; the engine's worker waits for a read it asked for, the
event loop never does. RAM holds checkpoints up to `ram_budget` (LRU; the least recently used
spills to disk), the disk up to `disk_budget` (LRU; the least recently used is deleted).
"""

from __future__ import annotations

import logging
import threading
import time
from collections import OrderedDict
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import zstandard

from engine.base import SavedState
from policies.prefix_keys import is_prefix, prefix_key, prefix_keys, token_array
from sessions.files import make_private_dirs
from sessions.kv_file import read_kv, read_kv_head, write_kv
from sessions.layout import StoreCorrupt, fingerprint_dir
from sessions.state_buffers import held_bytes

log = logging.getLogger("pflash.checkpoints")

SUFFIX = ".kv"


@dataclass(eq=False)
class Checkpoint:
    key: str
    tokens: np.ndarray  # the token ids it covers (int32)
    origin: str  # "system" (where the system prompt and tools end) | "interval" | "prompt" (a turn's prompt)
    owner: str  # the session that saved it
    state: SavedState | None = None  # in RAM
    spilling: SavedState | None = None  # left RAM, being written: still served from here
    disk_bytes: int = 0  # on disk when > 0
    hits: int = 0
    last_used: float = 0.0

    @property
    def n(self) -> int:
        return len(self.tokens)

    def tier(self) -> str:
        return "+".join(t for t, held in (("ram", self.state is not None), ("disk", self.disk_bytes > 0)) if held)


class CheckpointStore:
    def __init__(self, root: Path, fingerprint: str, ram_budget: int, disk_budget: int, zstd_level: int = 1) -> None:
        self.fingerprint = fingerprint
        self.dir = root / "checkpoints" / fingerprint_dir(fingerprint)
        make_private_dirs(self.dir)
        self._ram_budget = ram_budget
        self._disk_budget = disk_budget
        self._level = zstd_level
        self._lock = threading.Lock()
        self._io = ThreadPoolExecutor(max_workers=1, thread_name_prefix="checkpoint-io")
        self._entries: dict[str, Checkpoint] = {}
        self._ram: OrderedDict[str, Checkpoint] = OrderedDict()  # LRU, oldest first
        self._ram_bytes = 0
        self._disk_bytes = 0
        self._prompt_of: dict[str, str] = {}  # session -> key of its latest prompt checkpoint
        self.counters: dict[str, int] = {"saved": 0, "hits_ram": 0, "hits_disk": 0, "spills": 0,
                                         "evicted_ram": 0, "evicted_disk": 0, "superseded": 0,
                                         "write_failures": 0, "read_failures": 0}
        self._scan()

    # --- lookup (the engine's worker) --------------------------------------------------------------
    def longest(self, tokens: Sequence[int], above: int = 0) -> int:
        """The length of the longest checkpoint whose token ids are a prefix of `tokens` and longer
        than `above`; 0 if none."""
        with self._lock:
            lengths = {e.n for e in self._entries.values() if above < e.n <= len(tokens)}
        keys = prefix_keys(tokens, lengths)
        for n in sorted(keys, reverse=True):
            with self._lock:
                entry = self._entries.get(keys[n])
            if entry is not None and is_prefix(entry.tokens, tokens):
                return n
        return 0

    def longest_common(self, tokens: Sequence[int], rollback: int, above: int = 0) -> tuple[tuple[int, ...], int]:
        """The checkpoint sharing the longest common prefix with `tokens` (over `above` tokens)
        among those that would be cut back by at most `rollback` tokens, and that prefix's length;
        ((), 0) if none. What a model whose cache can be truncated (no sliding window) reuses of a
        prompt that diverges inside a checkpoint: llama-server's any-prefix reuse."""
        prompt = token_array(tokens)
        with self._lock:
            entries = [e for e in self._entries.values() if e.n > above and len(prompt) > above]
        best: tuple[tuple[int, ...], int] = ((), 0)
        for entry in entries:
            n = min(entry.n, len(prompt))
            differs = np.flatnonzero(entry.tokens[:n] != prompt[:n])
            common = int(differs[0]) if len(differs) else n
            if common > max(best[1], above) and entry.n - common <= rollback:
                best = (tuple(int(t) for t in entry.tokens), common)
        return best

    def has(self, tokens: Sequence[int]) -> bool:
        """Whether a checkpoint covers exactly `tokens` (made the most recently used if so)."""
        key = prefix_key(tokens)
        with self._lock:
            entry = self._entries.get(key)
            if entry is None or not is_prefix(entry.tokens, tokens) or entry.n != len(tokens):
                return False
            self._touch(entry)
            return True

    def load(self, tokens: Sequence[int]) -> tuple[SavedState, str] | None:
        """The state covering exactly `tokens` and its tier ("ram" | "disk"). A disk read runs on
        the I/O thread while the caller (the engine's worker) waits; it comes back into RAM."""
        key = prefix_key(tokens)
        with self._lock:
            entry = self._entries.get(key)
            if entry is None or entry.n != len(tokens) or not is_prefix(entry.tokens, tokens):
                return None
            self._touch(entry)
            entry.hits += 1
            if (held := entry.state or entry.spilling) is not None:
                self.counters["hits_ram"] += 1
                return held, "ram"
            if entry.disk_bytes == 0:
                return None
        state = self._io.submit(self._read, entry).result()
        if state is None or state.tokens != tuple(int(t) for t in tokens):
            return None
        with self._lock:
            self.counters["hits_disk"] += 1
            if self._entries.get(key) is entry and entry.state is None:
                entry.state = state
                self._ram[key] = entry
                self._ram_bytes += held_bytes(state.blob)
                self._spill_over_budget()
        return state, "disk"

    # --- saving (the engine's worker) --------------------------------------------------------------
    def add(self, state: SavedState, origin: str, owner: str) -> None:
        """Keep a checkpoint the engine saved (its bytes are the store's from now on). A session's
        newer prompt checkpoint replaces its older one: the next turn starts past it."""
        key = prefix_key(state.tokens)
        with self._lock:
            if key in self._entries:
                self._touch(self._entries[key])
                return
            entry = Checkpoint(key, token_array(state.tokens), origin, owner, state, last_used=time.time())
            self._entries[key] = entry
            self._ram[key] = entry
            self._ram_bytes += held_bytes(state.blob)
            self.counters["saved"] += 1
            if origin == "prompt":
                older = self._prompt_of.get(owner)
                self._prompt_of[owner] = key
                if older is not None and older in self._entries and self._entries[older].hits == 0:
                    self._forget(self._entries[older])
                    self.counters["superseded"] += 1
            self._spill_over_budget()

    def forget_owner(self, owner: str) -> None:
        """A deleted session: its own prompt checkpoints go (shared prefixes stay: others use them)."""
        with self._lock:
            for entry in [e for e in self._entries.values() if e.owner == owner and e.origin == "prompt"]:
                self._forget(entry)
            self._prompt_of.pop(owner, None)

    def _touch(self, entry: Checkpoint) -> None:
        """Under _lock."""
        entry.last_used = time.time()
        if entry.key in self._ram:
            self._ram.move_to_end(entry.key)

    def _spill_over_budget(self) -> None:
        """Under _lock: the least recently used RAM checkpoints go to disk (or, already there,
        leave RAM) until the RAM tier fits its budget."""
        while self._ram and self._ram_bytes > self._ram_budget:
            _key, entry = self._ram.popitem(last=False)
            state, entry.state = entry.state, None
            assert state is not None
            self._ram_bytes -= held_bytes(state.blob)
            self.counters["evicted_ram"] += 1
            if entry.disk_bytes == 0 and self._disk_budget > 0:
                self.counters["spills"] += 1
                entry.spilling = state
                self._io.submit(self._write, entry, state)
            elif entry.disk_bytes == 0:
                self._entries.pop(entry.key, None)

    def _forget(self, entry: Checkpoint) -> None:
        """Under _lock: drop a checkpoint from both tiers (its file goes on the I/O thread)."""
        self._entries.pop(entry.key, None)
        if self._ram.pop(entry.key, None) is not None and entry.state is not None:
            self._ram_bytes -= held_bytes(entry.state.blob)
        entry.state = entry.spilling = None
        if entry.disk_bytes:
            self._disk_bytes -= entry.disk_bytes
            entry.disk_bytes = 0
            self._io.submit(self._path(entry.key).unlink, True)

    # --- disk (the I/O thread) ---------------------------------------------------------------------
    def _path(self, key: str) -> Path:
        return self.dir / f"{key}{SUFFIX}"

    def _write(self, entry: Checkpoint, state: SavedState) -> None:
        with self._lock:
            if self._entries.get(entry.key) is not entry or entry.disk_bytes:
                entry.spilling = None
                return  # forgotten meanwhile, or written already
        try:
            size = write_kv(self._path(entry.key), state, self.fingerprint, self._level,
                            {"origin": entry.origin, "hits": entry.hits})
        except OSError as exc:  # disk full, read-only store: the checkpoint is lost, nothing else
            log.error("checkpoint %s: write failed: %s", entry.key[:12], exc)
            with self._lock:
                self.counters["write_failures"] += 1
                entry.spilling = None
                if entry.state is None:
                    self._entries.pop(entry.key, None)
            return
        with self._lock:
            entry.spilling = None
            if self._entries.get(entry.key) is not entry:  # forgotten while it was written
                self._path(entry.key).unlink(missing_ok=True)
                return
            entry.disk_bytes = size
            self._disk_bytes += size
            self._evict_disk(keep=entry)

    def _evict_disk(self, keep: Checkpoint) -> None:
        """Under _lock: delete the least recently used files until the disk tier fits its budget."""
        if self._disk_bytes <= self._disk_budget:
            return
        for entry in sorted((e for e in self._entries.values() if e.disk_bytes), key=lambda e: e.last_used):
            if self._disk_bytes <= self._disk_budget:
                break
            if entry is keep and self._disk_bytes - entry.disk_bytes <= self._disk_budget:
                continue  # the newest file stays while anything older can go
            self._disk_bytes -= entry.disk_bytes
            entry.disk_bytes = 0
            self._path(entry.key).unlink(missing_ok=True)
            self.counters["evicted_disk"] += 1
            if entry.state is None:
                self._entries.pop(entry.key, None)

    def _read(self, entry: Checkpoint) -> SavedState | None:
        try:
            state = read_kv(self._path(entry.key), self.fingerprint, lambda n: np.empty(n, dtype=np.uint8))
        except (FileNotFoundError, StoreCorrupt, KeyError, TypeError, ValueError, zstandard.ZstdError, OSError) as exc:
            log.warning("checkpoint %s: unreadable (%s); dropped", entry.key[:12], exc)
            with self._lock:
                self.counters["read_failures"] += 1
                if self._entries.get(entry.key) is entry:
                    self._forget(entry)
            return None
        return state

    def _scan(self) -> None:
        """What an earlier run left: every valid checkpoint file (header only), its last use its mtime."""
        for path in self.dir.iterdir():
            if path.name.startswith(".") and path.name.endswith(".tmp"):
                path.unlink(missing_ok=True)  # a write a crash interrupted
                continue
            if path.suffix != SUFFIX:
                continue
            try:
                header = read_kv_head(path)
                tokens = [int(t) for t in header["tokens"]]
                if header.get("fingerprint") != self.fingerprint or prefix_key(tokens) != path.stem:
                    raise StoreCorrupt("another fingerprint, or tokens that do not match the name")
            except (StoreCorrupt, KeyError, TypeError, ValueError, OSError) as exc:
                log.warning("checkpoint file %s ignored and removed (%s)", path.name[:16], exc)
                path.unlink(missing_ok=True)
                continue
            stat = path.stat()
            entry = Checkpoint(path.stem, token_array(tokens), str(header.get("origin", "")), "",
                               disk_bytes=stat.st_size, hits=int(header.get("hits", 0)), last_used=stat.st_mtime)
            self._entries[entry.key] = entry
            self._disk_bytes += entry.disk_bytes
        with self._lock:
            newest = max(self._entries.values(), key=lambda e: e.last_used, default=None)
            if newest is not None:
                self._evict_disk(keep=newest)
        if self._entries:
            log.info("checkpoints: %d on disk (%.1f MB)", len(self._entries), self._disk_bytes / 1e6)

    # --- lifetime ------------------------------------------------------------------------------------
    def flush(self) -> None:
        """Shutdown: every checkpoint only in RAM goes to disk, so a restart finds it."""
        with self._lock:
            pending = [(e, e.state) for e in self._ram.values() if e.disk_bytes == 0 and e.state is not None]
        for entry, state in sorted(pending, key=lambda p: p[0].last_used, reverse=True):
            assert state is not None
            self._io.submit(self._write, entry, state)
        self._io.submit(lambda: None).result()

    def settle(self) -> None:
        """Wait for the disk work asked for so far (tests)."""
        self._io.submit(lambda: None).result()

    def close(self) -> None:
        self._io.shutdown(wait=True)

    def stats(self) -> dict[str, float]:
        with self._lock:
            return {"checkpoints_ram": float(len(self._ram)),
                    "checkpoints_disk": float(sum(1 for e in self._entries.values() if e.disk_bytes)),
                    "checkpoint_ram_bytes": float(self._ram_bytes), "checkpoint_disk_bytes": float(self._disk_bytes),
                    **{f"checkpoint_{k}": float(v) for k, v in self.counters.items()}}

    def listing(self) -> list[dict[str, Any]]:
        """For the status page: newest first."""
        with self._lock:
            entries = sorted(self._entries.values(), key=lambda e: -e.last_used)
            return [{"key": e.key[:12], "tokens": e.n, "origin": e.origin, "hits": e.hits, "tier": e.tier(),
                     "ram_bytes": held_bytes(e.state.blob) if e.state is not None else 0,
                     "disk_bytes": e.disk_bytes, "last_used": e.last_used} for e in entries]
