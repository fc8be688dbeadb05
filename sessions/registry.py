"""Live sessions: records in an LRU, KV states in a host-RAM tier, both under one byte budget, the
disk store behind them. It is the engine's StateTier: the engine stashes a session's state here
when it switches to another session and fetches it back (RAM first, then disk).

Who owns what:
- `_lock` guards the in-memory maps only: it is never held for I/O, so the event loop, which takes
  it on every turn, never waits for a disk.
- store operations run on two dedicated threads, each in the order asked for: `_records_io` writes,
  loads and deletes records (small: what a response's end waits for), `_io` KV states (a spill can
  take seconds). A record write never queues behind a spill; a spill hands its record to the record
  lane and waits for it, so a KV file never lands before its record. The batched fsync of files already renamed into place runs
  on `_sync_io`, so a record write never queues behind a second's worth of fsyncs either.
- a record is changed only through its own methods (its own lock); persistence writes a snapshot.

Records are written ahead of the response that changed them (`record_sync` "always": fsynced; "batched":
renamed into place, fsynced within a second; "off": with a spill or at shutdown). KV states: on a spill, at shutdown.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
import weakref
from collections import OrderedDict
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, Literal, TypeVar

from engine.base import SavedState
from sessions.files import StoreLock
from sessions.record import SessionRecord
from sessions.session_info import SessionInfo, session_info
from sessions.state_buffers import held_bytes
from sessions.store import SessionStore

log = logging.getLogger("pflash.sessions")

RecordSync = Literal["always", "batched", "off"]
SYNC_INTERVAL_S = 1.0  # the batched policy's longest wait before an fsync
DELETED_KEPT = 4096  # deleted ids kept (the engine forgets on delete: the latest suffice; all would only grow)
T = TypeVar("T")


class SessionRegistry:
    def __init__(self, store: SessionStore, ram_budget_bytes: int, record_sync: RecordSync = "batched",
                 lock: StoreLock | None = None) -> None:
        self.store = store
        self._store_lock = lock  # held while we serve; released by close()
        self._budget = ram_budget_bytes
        self.record_sync: RecordSync = record_sync
        self._lock = threading.Lock()
        self._io = ThreadPoolExecutor(max_workers=1, thread_name_prefix="store-kv-io")
        self._records_io = ThreadPoolExecutor(max_workers=1, thread_name_prefix="store-record-io")
        self._sync_io = ThreadPoolExecutor(max_workers=1, thread_name_prefix="store-sync")
        self._records: OrderedDict[str, SessionRecord] = OrderedDict()  # LRU, oldest first
        self._record_bytes: dict[str, int] = {}
        self._records_total = 0
        self._live: weakref.WeakValueDictionary[str, SessionRecord] = weakref.WeakValueDictionary()
        self._written: dict[str, int] = {}  # record version known to be in the store
        self._ram: OrderedDict[str, SavedState] = OrderedDict()
        self._ram_bytes = 0
        self._spilling: dict[str, SavedState] = {}  # leaving RAM, being written: still served from here
        self._in_context: dict[str, int] = {}  # session -> tokens the engine's context holds
        self._ahead: tuple[str, Future[SavedState | None]] | None = None  # a disk load started by prefetch()
        self._deleted: OrderedDict[str, None] = OrderedDict()  # the engine may still hold their state (oldest first)
        self._sync_timer: threading.Timer | None = None
        entries = self.store.index()  # scan once now (the caller runs us off the event loop)
        self.store.stale_dirs()
        # The first resume after a restart writes into memory touched now, not at its first token.
        self.store.buffers.warm(max((e.kv_raw_bytes for e in entries.values()), default=0))
        self.counters: dict[str, int] = {"spills": 0, "store_errors": 0, "records_evicted": 0,
                                         "side_states_stashed": 0, "side_states_spilled": 0,
                                         "writes_after_delete": 0}

    # --- the I/O threads ---------------------------------------------------------------------------
    async def _on_record_io(self, fn: Callable[..., T], *args: Any) -> T:
        return await asyncio.get_running_loop().run_in_executor(self._records_io, fn, *args)

    def _submit(self, fn: Callable[..., T], *args: Any) -> Future[T]:
        """KV states: spills, loads."""
        return self._io.submit(fn, *args)

    def _submit_record(self, fn: Callable[..., T], *args: Any) -> Future[T]:
        return self._records_io.submit(fn, *args)

    # --- records -----------------------------------------------------------------------------------
    async def get_or_create(self, session_id: str, tenant: str, key_source: str, parent: str = "",
                            kind: str = "main", hint: str = "") -> SessionRecord:
        """A session's record, or a branch's (`parent` names its session's root record)."""
        record = await self._resident(session_id)
        if record is not None and record.tenant != tenant:
            record = None  # a hash collision across tenants is not possible; be strict anyway
        with self._lock:
            self._deleted.pop(session_id, None)
            if record is None:
                record = self._live.get(session_id)
                if record is None or record.tenant != tenant:
                    record = SessionRecord(session_id=session_id, tenant=tenant, key_source=key_source,
                                           parent=parent, kind=kind, hint=hint)
                    self._written[session_id] = record.version  # nothing to write until it changes
            record.last_used = time.time()
            self._keep(record)
        return record

    async def find(self, session_id: str, tenant: str | None) -> SessionRecord | None:
        """A session by id, visible only to its tenant (None = admin, sees all)."""
        record = await self._resident(session_id)
        if record is None or (tenant is not None and record.tenant != tenant):
            return None
        return record

    def loaded(self, session_id: str) -> SessionRecord | None:
        """The record if it is in memory (no disk read): for listings that must stay cheap."""
        with self._lock:
            return self._live.get(session_id)

    async def _resident(self, session_id: str) -> SessionRecord | None:
        """The one in-memory record of a session, loading it from the store if it is cold."""
        with self._lock:
            record = self._live.get(session_id)
            if record is not None:
                self._keep(record)
                return record
        if not self.store.has(session_id):
            return None
        loaded = await self._on_record_io(self.store.load_record, session_id)
        if loaded is None:
            return None
        with self._lock:
            record = self._live.get(session_id)  # loaded meanwhile by another request: keep that one
            if record is None:
                record = loaded
                self._written[session_id] = record.version
            self._keep(record)
        return record

    def _keep(self, record: SessionRecord) -> None:
        """Under _lock: make the record the most recent in the LRU and account for it."""
        sid = record.session_id
        self._live[sid] = record
        self._records[sid] = record
        self._records.move_to_end(sid)
        self._account(sid, record.approx_bytes())
        self._evict_records()

    def _account(self, session_id: str, size: int | None) -> None:
        """Under _lock: a record's size in the budget (None: no longer counted)."""
        self._records_total -= self._record_bytes.pop(session_id, 0)
        if size is not None:
            self._record_bytes[session_id] = size
            self._records_total += size

    def _evict_records(self) -> None:
        """Under _lock: drop the least recently used records while over the RAM budget. A record
        in use by a turn stays reachable (weakly) until the turn ends; a dirty one is written first;
        one whose KV state is in memory stays (a spill writes the record with the state)."""
        if self._ram_bytes + self._records_total <= self._budget:
            return
        pinned = {*self._ram, *self._spilling, *self._in_context}
        for sid in [s for s in self._records if s not in pinned]:
            if self._ram_bytes + self._records_total <= self._budget:
                break
            record = self._records.pop(sid)
            self._account(sid, None)
            self.counters["records_evicted"] += 1
            if record.version != self._written.get(sid):
                self._submit_record(self._write_record, record, True)
            else:
                self._written.pop(sid, None)

    async def save_record(self, record: SessionRecord) -> None:
        """Write ahead: the record is in the store when this returns (per `record_sync`)."""
        if self.record_sync == "off":
            return
        await self._on_record_io(self._write_record, record, False)
        with self._lock:
            if record.session_id in self._records:
                self._account(record.session_id, record.approx_bytes())
                self._evict_records()

    def _write_record(self, record: SessionRecord, force: bool) -> None:
        """On the record thread: write the record's snapshot if it changed since the last write, and
        only while it is its session's live record: a turn that finishes after its session was
        deleted (or replaced) must not bring it back."""
        with self._lock:
            if record.session_id in self._deleted or self._live.get(record.session_id) is not record:
                self.counters["writes_after_delete"] += 1
                return
        version, data = record.snapshot()
        if not force and self._written.get(record.session_id) == version and self.store.has(record.session_id):
            return
        try:
            self.store.save_record(data, sync=self.record_sync == "always")
        except OSError as exc:  # disk full, read-only store: keep serving, lose only the cache
            self.counters["store_errors"] += 1
            log.error("session %s: store write failed: %s", record.session_id[:12], exc)
            return
        with self._lock:
            if record.session_id in self._records:
                self._written[record.session_id] = max(version, self._written.get(record.session_id, 0))
        if self.record_sync == "batched":
            self._schedule_sync()

    def _schedule_sync(self) -> None:
        with self._lock:
            if self._sync_timer is not None:
                return
            timer = threading.Timer(SYNC_INTERVAL_S, self._sync_soon)
            timer.daemon = True
            self._sync_timer = timer
        timer.start()

    def _sync_soon(self) -> None:
        with self._lock:
            self._sync_timer = None
        try:
            self._sync_io.submit(self.store.sync_pending)
        except RuntimeError:  # shut down: close() syncs what is left
            pass

    async def delete(self, session_id: str) -> None:
        with self._lock:
            self._deleted[session_id] = None
            while len(self._deleted) > DELETED_KEPT:
                self._deleted.popitem(last=False)
            self._records.pop(session_id, None)
            self._account(session_id, None)
            self._live.pop(session_id, None)
            self._written.pop(session_id, None)
            state = self._ram.pop(session_id, None)
            if state is not None:
                self._ram_bytes -= held_bytes(state.blob)
            self._in_context.pop(session_id, None)
            if self._ahead and self._ahead[0] == session_id:
                self._ahead = None
        # Each lane drops what it may be writing for the session now: a spill queued before the
        # delete, then a record write already past its check.
        loop = asyncio.get_running_loop()
        await loop.run_in_executor(self._io, self.store.delete, session_id)
        await self._on_record_io(self.store.delete, session_id)

    def list(self, tenant: str | None) -> list[SessionInfo]:
        disk = self.store.index()
        with self._lock:
            infos = [session_info(sid, self._live.get(sid), disk.get(sid), self._ram.get(sid) or self._spilling.get(sid),
                                  self._in_context.get(sid)) for sid in set(self._live) | set(disk)]
        return sorted((i for i in infos if tenant is None or i.tenant == tenant), key=lambda i: -i.last_used)

    # --- StateTier (called on the engine's worker thread) -------------------------------------------
    def holding(self, session_id: str | None, tokens: int) -> None:
        """The engine says what its context holds now (after each job, on its own thread)."""
        self.holding_many({session_id: tokens} if session_id is not None else {})

    def holding_many(self, sessions: dict[str, int]) -> None:
        """The same for an engine whose context holds several sessions (one per sequence)."""
        with self._lock:
            self._in_context = {sid: n for sid, n in sessions.items() if n > 0}

    def buffer(self, n: int) -> Any:
        """A writable uint8 array of `n` bytes for a state the engine saves (reused memory)."""
        return self.store.buffers.take(n)

    def stash(self, session_id: str, state: SavedState) -> None:
        with self._lock:
            self._in_context.pop(session_id, None)
            if session_id in self._deleted:
                return  # deleted meanwhile
            old = self._ram.pop(session_id, None)
            if old is not None:
                self._ram_bytes -= held_bytes(old.blob)
            self._ram[session_id] = state
            self._ram_bytes += held_bytes(state.blob)
            record = self._live.get(session_id)
            if record is not None and record.kind == "side":
                # A side request's one-shot prompt goes first when RAM runs short: it never pushes
                # an agent's conversation out to make room for itself.
                self._ram.move_to_end(session_id, last=False)
                self.counters["side_states_stashed"] += 1
            victims: list[tuple[str, SavedState]] = []
            while self._ram and self._ram_bytes > self._budget:
                victim, victim_state = self._ram.popitem(last=False)
                self._ram_bytes -= held_bytes(victim_state.blob)
                self._spilling[victim] = victim_state
                victims.append((victim, victim_state))
                self.counters["spills"] += 1
                victim_record = self._live.get(victim)
                if victim_record is not None and victim_record.kind == "side":
                    self.counters["side_states_spilled"] += 1
            self._evict_records()
        for victim, victim_state in victims:  # written on the I/O thread; the worker goes on
            self._submit(self._spill, victim, victim_state)

    def persist(self, session_id: str, state: SavedState) -> None:
        """A copy of a resident state, written on the I/O thread: a kill then costs no full prefill."""
        try:
            self._submit(self._persist, session_id, state)
        except RuntimeError:  # shutting down: the flush writes what the engine hands over
            pass

    def _spill(self, session_id: str, state: SavedState) -> None:
        try:
            self._persist(session_id, state)
        finally:
            with self._lock:
                if self._spilling.get(session_id) is state:
                    del self._spilling[session_id]

    def prefetch(self, session_id: str) -> None:
        """Start reading a session's KV state from disk now, while its turn is still being prepared:
        a resume then waits for the longer of the two, not both. The read runs on the I/O thread.
        One at a time: a newer prefetch replaces one the engine never asked for, so at most one
        state is held outside the budget. Any stored state is exact for its tokens."""
        with self._lock:
            if (session_id in self._ram or session_id in self._spilling or session_id in self._deleted
                    or (self._ahead is not None and self._ahead[0] == session_id)
                    or session_id in self._in_context):
                return
            if not self.store.has_kv(session_id):
                return
            try:
                self._ahead = (session_id, self._submit(self.store.load_state, session_id))
            except RuntimeError:  # shutting down: the engine takes no more turns anyway
                pass

    def state_ready(self, session_id: str, wake: Callable[[], None]) -> bool:
        """Whether fetch() returns without waiting for a disk; if not, the read is started and
        `wake` runs once it is done (the batched engine admits the turn then: no stream stalls)."""
        self.prefetch(session_id)
        with self._lock:
            ahead = self._ahead[1] if self._ahead is not None and self._ahead[0] == session_id else None
        if ahead is None or ahead.done():
            return True
        ahead.add_done_callback(lambda _read: wake())
        return False

    def fetch(self, session_id: str) -> tuple[SavedState, str] | None:
        with self._lock:
            state = self._ram.pop(session_id, None)
            if state is not None:
                self._ram_bytes -= held_bytes(state.blob)
            else:
                state = self._spilling.get(session_id)
            ahead = None
            if self._ahead is not None and self._ahead[0] == session_id:
                ahead, self._ahead = self._ahead[1], None
            if state is not None:
                self._in_context[session_id] = len(state.tokens)
                return state, "ram"
        if ahead is None and not self.store.has(session_id):
            return None
        # The worker waits, not the loop.
        state = (ahead or self._submit(self.store.load_state, session_id)).result()
        if state is None:
            return None
        with self._lock:
            self._in_context[session_id] = len(state.tokens)
        return state, "disk"

    # --- persistence (on the I/O thread) -------------------------------------------------------------
    def _persist(self, session_id: str, state: SavedState | None) -> None:
        """A session's record (when changed or never written) and then its KV state, if given."""
        record = self._live.get(session_id)
        if record is None and not self.store.has(session_id):
            return  # deleted, or never worth a record: its state alone could not be loaded
        if record is not None:  # on the record lane, in order with the turns' writes; waited for
            self._submit_record(self._write_record, record, False).result()
        with self._lock:
            if session_id in self._deleted:
                return
        try:
            if state is not None and self.store.has(session_id):
                self.store.save_kv(session_id, state)
        except OSError as exc:  # disk full, read-only store: keep serving, lose only the cache
            self.counters["store_errors"] += 1
            log.error("session %s: store write failed: %s", session_id[:12], exc)

    def flush(self) -> None:
        """Write every session that needs it: RAM states, and records changed since their last
        write. One failing session is logged and skipped; the rest are still written."""
        with self._lock:
            ram = dict(self._ram)
            self._ram.clear()
            self._ram_bytes = 0
            changed = [sid for sid, r in self._live.items() if r.version != self._written.get(sid)]
            ids = list(dict.fromkeys([*ram, *changed]))

        def write_all() -> None:
            for session_id in ids:
                try:
                    self._persist(session_id, ram.get(session_id))
                except Exception:
                    self.counters["store_errors"] += 1
                    log.exception("session %s: flush failed; the others are still written", session_id[:12])

        self._submit(write_all).result()
        self._submit_record(lambda: None).result()  # records the flush did not hand over itself
        self._sync_io.submit(self.store.sync_pending).result()  # after any sync already under way

    def settle(self) -> None:
        """Wait for the store I/O asked for so far (spills, writes)."""
        self._submit(lambda: None).result()
        self._submit_record(lambda: None).result()

    def close(self) -> None:
        """After flush(): no more store I/O."""
        with self._lock:
            timer, self._sync_timer = self._sync_timer, None
        if timer is not None:
            timer.cancel()
        self._io.shutdown(wait=True)
        self._records_io.shutdown(wait=True)
        self._sync_io.shutdown(wait=True)
        self.store.sync_pending()
        if self._store_lock is not None:
            self._store_lock.release()

    def stats(self) -> dict[str, float]:
        disk = self.store.index()
        with self._lock:
            return {
                "sessions_context": float(len(self._in_context)),
                "sessions_ram": float(len(self._ram) + len(self._spilling)),
                "sessions_disk": float(len(disk)),
                "sessions_records": float(len(self._records)),
                "ram_bytes": float(self._ram_bytes),
                "record_bytes": float(self._records_total),
                "state_buffer_bytes": float(self.store.buffers.pooled_bytes()),
                **{f"state_buffers_{k}": float(v) for k, v in self.store.buffers.counters.items()},
                "disk_bytes": float(sum(e.total_bytes for e in disk.values()) + self.store.stale_bytes()),
                **{k: float(v) for k, v in self.counters.items()},
                **{f"store_{k}": float(v) for k, v in self.store.counters.items()},
            }
