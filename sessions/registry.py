"""Live sessions: records in memory, KV states in a host-RAM tier with a byte budget, the disk store
behind it. It is the engine's StateTier: the engine stashes a session's state here when it switches
to another session and fetches it back (RAM first, then disk).

Called from the engine's worker thread and from the event loop, so every method takes the lock.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import OrderedDict
from dataclasses import dataclass

from engine.base import SavedState
from sessions.record import SessionRecord
from sessions.store import SessionStore

log = logging.getLogger("pflash.sessions")


@dataclass(frozen=True)
class SessionInfo:
    session_id: str
    tenant: str
    tier: str  # "context" | "ram" | "disk" | "none"
    tokens: int
    ram_bytes: int
    disk_bytes: int
    last_used: float
    created_at: float


class SessionRegistry:
    def __init__(self, store: SessionStore, ram_budget_bytes: int) -> None:
        self.store = store
        self._budget = ram_budget_bytes
        self._lock = threading.RLock()
        self._records: dict[str, SessionRecord] = {}
        self._ram: OrderedDict[str, SavedState] = OrderedDict()
        self._ram_bytes = 0
        self._in_context: tuple[str, int] | None = None  # (session, tokens) the engine holds
        self._disk = store.index()  # the store's live index: known on disk, loaded lazily
        self.counters: dict[str, int] = {"spills": 0, "store_errors": 0}

    # --- records -------------------------------------------------------------------------------
    def get_or_create(self, session_id: str, tenant: str, key_source: str) -> SessionRecord:
        with self._lock:
            record = self._records.get(session_id)
            if record is None and session_id in self._disk:
                record = self.store.load_record(session_id)
                if record is not None and record.tenant != tenant:
                    record = None  # a hash collision across tenants is not possible; be strict anyway
            if record is None:
                record = SessionRecord(session_id=session_id, tenant=tenant, key_source=key_source)
            record.last_used = time.time()
            self._records[session_id] = record
            return record

    def find(self, session_id: str, tenant: str | None) -> SessionRecord | None:
        """A session by id, visible only to its tenant (None = admin, sees all)."""
        with self._lock:
            record = self._records.get(session_id)
            if record is None and session_id in self._disk:
                record = self.store.load_record(session_id)
                if record is not None:
                    self._records[session_id] = record
            if record is None or (tenant is not None and record.tenant != tenant):
                return None
            return record

    def loaded(self, session_id: str) -> SessionRecord | None:
        """The record if it is in memory (no disk read): for listings that must stay cheap."""
        with self._lock:
            return self._records.get(session_id)

    def delete(self, session_id: str) -> None:
        with self._lock:
            self._records.pop(session_id, None)
            state = self._ram.pop(session_id, None)
            if state is not None:
                self._ram_bytes -= len(state.blob)
            if self._in_context and self._in_context[0] == session_id:
                self._in_context = None
            self.store.delete(session_id)

    def list(self, tenant: str | None) -> list[SessionInfo]:
        with self._lock:
            ids = set(self._records) | set(self._disk)
            infos = [self._info(sid) for sid in ids]
        return sorted((i for i in infos if tenant is None or i.tenant == tenant), key=lambda i: -i.last_used)

    def _info(self, session_id: str) -> SessionInfo:
        record = self._records.get(session_id)
        disk = self._disk.get(session_id)
        ram = self._ram.get(session_id)
        if self._in_context and self._in_context[0] == session_id:
            tier, tokens = "context", self._in_context[1]
        elif ram is not None:
            tier, tokens = "ram", len(ram.tokens)
        elif disk is not None and disk.kv_tokens:
            tier, tokens = "disk", disk.kv_tokens
        else:
            tier, tokens = "none", 0
        return SessionInfo(
            session_id=session_id,
            tenant=record.tenant if record else (disk.tenant if disk else ""),
            tier=tier,
            tokens=tokens,
            ram_bytes=len(ram.blob) if ram is not None else 0,
            disk_bytes=disk.total_bytes if disk else 0,
            last_used=record.last_used if record else (disk.last_used if disk else 0.0),
            created_at=record.created_at if record else 0.0,
        )

    def note_context(self, session_id: str, tokens: int) -> None:
        with self._lock:
            self._in_context = (session_id, tokens)

    # --- StateTier ---------------------------------------------------------------------------------
    def stash(self, session_id: str, state: SavedState) -> None:
        with self._lock:
            if self._in_context and self._in_context[0] == session_id:
                self._in_context = None
            if session_id not in self._records:
                return  # deleted meanwhile
            old = self._ram.pop(session_id, None)
            if old is not None:
                self._ram_bytes -= len(old.blob)
            self._ram[session_id] = state
            self._ram_bytes += len(state.blob)
            while self._ram and self._ram_bytes > self._budget:
                victim, victim_state = self._ram.popitem(last=False)
                self._ram_bytes -= len(victim_state.blob)
                self._persist(victim, victim_state)
                self.counters["spills"] += 1

    def fetch(self, session_id: str) -> tuple[SavedState, str] | None:
        with self._lock:
            state = self._ram.pop(session_id, None)
            if state is not None:
                self._ram_bytes -= len(state.blob)
                self._in_context = (session_id, len(state.tokens))
                return state, "ram"
            if session_id not in self._disk:
                return None
            state = self.store.load_state(session_id)
            if state is None:
                return None
            self._in_context = (session_id, len(state.tokens))
            return state, "disk"

    # --- persistence -------------------------------------------------------------------------------
    def _persist(self, session_id: str, state: SavedState | None) -> None:
        record = self._records.get(session_id)
        if record is None:
            return
        try:
            self.store.save(record, state)
        except OSError as exc:  # disk full, read-only store: keep serving, lose only the cache
            self.counters["store_errors"] += 1
            log.error("session %s: store write failed: %s", session_id[:12], exc)

    def flush(self) -> None:
        """Write every session to disk: RAM states with their records, the rest as metadata."""
        with self._lock:
            ram = dict(self._ram)
            self._ram.clear()
            self._ram_bytes = 0
            for session_id in list(self._records):
                self._persist(session_id, ram.get(session_id))

    def stats(self) -> dict[str, float]:
        with self._lock:
            disk_bytes = sum(e.total_bytes for e in self._disk.values())
            return {
                "sessions_context": 1.0 if self._in_context else 0.0,
                "sessions_ram": float(len(self._ram)),
                "sessions_disk": float(len(self._disk)),
                "ram_bytes": float(self._ram_bytes),
                "disk_bytes": float(disk_bytes),
                **{k: float(v) for k, v in self.counters.items()},
                **{f"store_{k}": float(v) for k, v in self.store.counters.items()},
            }
