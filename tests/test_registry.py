"""The session registry: RAM tier and record LRU under one budget, records written ahead, store
I/O on its own thread (never under the lock the event loop takes), flush that survives failures."""

from __future__ import annotations

import asyncio
import threading
import time
from pathlib import Path

import pytest

from engine.base import SavedState
from sessions.identity import session_hash
from sessions.record import RecallEntry, SessionRecord
from sessions.registry import SessionRegistry
from sessions.store import SessionStore
from tests.test_store import FP, make_record, make_state


def sid(name: str) -> str:
    return session_hash("t", name)


def registry_at(path: Path, budget: int = 10**9, sync: str = "batched") -> SessionRegistry:
    return SessionRegistry(SessionStore(path, FP), ram_budget_bytes=budget, record_sync=sync)  # type: ignore[arg-type]


def test_ram_tier_spills_to_disk(tmp_path: Path) -> None:
    async def run() -> None:
        registry = registry_at(tmp_path, budget=130_000)
        a = await registry.get_or_create(sid("a"), "t", "x")
        b = await registry.get_or_create(sid("b"), "t", "x")
        registry.stash(a.session_id, make_state(size=100_000))
        registry.stash(b.session_id, make_state(size=100_000))  # over budget: A spills to disk
        registry.settle()
        assert {i.session_id: i.tier for i in registry.list("t")} == {a.session_id: "disk", b.session_id: "ram"}
        assert registry.fetch(a.session_id) == (make_state(size=100_000), "disk")
        assert registry.fetch(b.session_id) == (make_state(size=100_000), "ram")
        assert registry.list("other-tenant") == []

    asyncio.run(run())


def test_flush_then_new_registry_restores(tmp_path: Path) -> None:
    async def run() -> None:
        registry = registry_at(tmp_path)
        record = await registry.get_or_create(sid("a"), "t", "x")
        registry.stash(record.session_id, make_state())
        registry.flush()
        again = registry_at(tmp_path)
        assert await again.find(record.session_id, "t") is not None
        assert await again.find(record.session_id, "someone-else") is None
        assert again.fetch(record.session_id) == (make_state(), "disk")

    asyncio.run(run())


def test_store_write_failure_is_counted_not_raised(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    async def run() -> None:
        registry = registry_at(tmp_path, budget=0)
        record = await registry.get_or_create(sid("a"), "t", "x")
        record.count("turns")

        def disk_full(*_args: object, **_kw: object) -> None:
            raise OSError(28, "No space left on device")

        monkeypatch.setattr("sessions.store.write_atomic", disk_full)
        registry.stash(record.session_id, make_state())  # spills at once and fails
        registry.settle()
        assert registry.counters["store_errors"] == 1
        assert registry.fetch(record.session_id) is None

    asyncio.run(run())


@pytest.mark.parametrize("sync", ["always", "batched"])
def test_records_are_written_ahead(tmp_path: Path, sync: str) -> None:
    """A changed record is in the store as soon as save_record returns: a process killed right
    after (no flush, no spill) restarts with it."""
    async def run() -> None:
        registry = registry_at(tmp_path, sync=sync)
        record = await registry.get_or_create(sid("a"), "t", "x")
        record.add_recall(RecallEntry("e" * 64, "recalled text", (("c" * 64, 1, 2),)))
        await registry.save_record(record)
        fresh = SessionStore(tmp_path, FP).load_record(record.session_id)
        assert fresh is not None and fresh.to_dict() == record.to_dict()

    asyncio.run(run())


def test_record_sync_off_writes_nothing_ahead(tmp_path: Path) -> None:
    async def run() -> None:
        registry = registry_at(tmp_path, sync="off")
        record = await registry.get_or_create(sid("a"), "t", "x")
        record.count("turns")
        await registry.save_record(record)
        assert SessionStore(tmp_path, FP).load_record(record.session_id) is None
        registry.flush()  # ... only at shutdown (or a spill)
        assert SessionStore(tmp_path, FP).load_record(record.session_id) is not None

    asyncio.run(run())


def test_batched_sync_fsyncs_within_a_second(tmp_path: Path) -> None:
    async def run() -> None:
        registry = registry_at(tmp_path, sync="batched")
        for name in ("a", "b", "c"):
            record = await registry.get_or_create(sid(name), "t", "x")
            record.count("turns")
            await registry.save_record(record)
        assert len(registry.store.pending) == 3
        deadline = time.time() + 3
        while not registry.store.counters["syncs"] and time.time() < deadline:
            await asyncio.sleep(0.05)
        assert len(registry.store.pending) == 0
        assert registry.store.counters["syncs"] == 1  # one batch for the three writes

    asyncio.run(run())


def test_a_record_write_never_waits_behind_a_slow_batched_fsync(tmp_path: Path) -> None:
    """The batched fsync runs beside the store's I/O thread: a turn's record write (what the end
    of its response waits for) does not queue behind a second's worth of slow fsyncs."""
    async def run() -> None:
        registry = registry_at(tmp_path, sync="batched")
        syncing, release = threading.Event(), threading.Event()
        real_sync = registry.store.pending.sync

        def slow_sync() -> int:
            syncing.set()
            release.wait(10)  # a disk that takes its time
            return real_sync()

        registry.store.pending.sync = slow_sync  # type: ignore[method-assign]
        first = await registry.get_or_create(sid("a"), "t", "x")
        first.count("turns")
        await registry.save_record(first)
        assert await asyncio.to_thread(syncing.wait, 5)  # the batch is being synced now
        second = await registry.get_or_create(sid("b"), "t", "x")
        second.count("turns")
        started = time.perf_counter()
        await registry.save_record(second)
        waited = time.perf_counter() - started
        release.set()
        assert waited < 1.0, waited
        assert SessionStore(tmp_path, FP).load_record(second.session_id) is not None
        registry.flush()
        assert len(registry.store.pending) == 0  # flush waits for the sync under way, then syncs the rest
        registry.close()

    asyncio.run(run())


def test_a_record_write_never_waits_behind_another_sessions_spill(tmp_path: Path) -> None:
    """Records have their own lane: while one session's KV state takes 10 s to write, another's
    turn writes its record at once; the spill's own record still lands before its KV file."""
    async def run() -> None:
        registry = registry_at(tmp_path, budget=130_000, sync="always")
        spilling, release = threading.Event(), threading.Event()
        real_save_kv = registry.store.save_kv

        def slow_save_kv(session_id: str, state: SavedState) -> list[str]:
            assert registry.store.has(session_id)  # its record went first
            spilling.set()
            release.wait(10)  # a large state on a slow disk
            return real_save_kv(session_id, state)

        registry.store.save_kv = slow_save_kv  # type: ignore[method-assign]
        a = await registry.get_or_create(sid("a"), "t", "x")
        b = await registry.get_or_create(sid("b"), "t", "x")
        registry.stash(a.session_id, make_state(size=100_000))
        registry.stash(b.session_id, make_state(size=100_000))  # over budget: A's state spills
        assert await asyncio.to_thread(spilling.wait, 5)
        b.count("turns")
        started = time.perf_counter()
        await registry.save_record(b)
        waited = time.perf_counter() - started
        assert registry.store.has(b.session_id)
        release.set()
        assert waited < 1.0, waited
        registry.settle()  # (a second store on the directory would sweep the spill's temp file)
        assert SessionStore(tmp_path, FP).load_record(b.session_id) is not None
        assert registry.fetch(a.session_id) == (make_state(size=100_000), "disk")
        registry.close()

    asyncio.run(run())


def test_a_session_deleted_while_its_state_spills_leaves_nothing_on_disk(tmp_path: Path) -> None:
    async def run() -> None:
        registry = registry_at(tmp_path, budget=130_000, sync="always")
        spilling, release = threading.Event(), threading.Event()
        real_save_kv = registry.store.save_kv

        def slow_save_kv(session_id: str, state: SavedState) -> list[str]:
            spilling.set()
            release.wait(10)
            return real_save_kv(session_id, state)

        registry.store.save_kv = slow_save_kv  # type: ignore[method-assign]
        a = await registry.get_or_create(sid("a"), "t", "x")
        await registry.save_record(a)
        registry.stash(a.session_id, make_state(size=100_000))
        registry.stash(sid("b"), make_state(size=100_000))
        assert await asyncio.to_thread(spilling.wait, 5)
        deleting = asyncio.ensure_future(registry.delete(a.session_id))
        await asyncio.sleep(0.2)
        release.set()
        await deleting
        registry.settle()
        assert SessionStore(tmp_path, FP).load_record(a.session_id) is None
        assert not (registry.store.dir / a.session_id).exists()
        registry.close()

    asyncio.run(run())


def test_records_stay_under_the_ram_budget_and_reload_from_the_store(tmp_path: Path) -> None:
    async def run() -> None:
        registry = registry_at(tmp_path, budget=100_000)
        for i in range(400):
            record = await registry.get_or_create(sid(f"s{i}"), "t", "x")
            record.note_served(["a" * 64], [{"role": "user", "content": f"question {i} " * 40}], [("turns", 1)])
            await registry.save_record(record)
            del record
        stats = registry.stats()
        assert stats["record_bytes"] <= 100_000
        assert stats["sessions_records"] < 400 and stats["records_evicted"] > 0
        again = await registry.find(sid("s3"), "t")  # long evicted: read back from the store
        assert again is not None and again.transcript[0]["content"].startswith("question 3 ")
        assert len(registry.list("t")) == 400

    asyncio.run(run())


def test_a_record_in_use_keeps_one_identity_through_eviction(tmp_path: Path) -> None:
    async def run() -> None:
        registry = registry_at(tmp_path, budget=0)
        held = await registry.get_or_create(sid("held"), "t", "x")
        await registry.get_or_create(sid("other"), "t", "x")  # evicts "held" from the LRU
        assert await registry.get_or_create(sid("held"), "t", "x") is held

    asyncio.run(run())


def test_flush_writes_only_changed_records_and_survives_a_failing_one(tmp_path: Path,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    async def run() -> None:
        registry = registry_at(tmp_path, sync="off")
        records = [await registry.get_or_create(sid(f"s{i}"), "t", "x") for i in range(4)]
        for record in records[:3]:
            record.count("turns")  # s3 is untouched: nothing to write
        save = registry.store.save_record

        def failing(data: dict, sync: bool = True) -> None:  # type: ignore[type-arg]
            if data["session_id"] == records[0].session_id:
                raise RuntimeError("a bug in one record")
            save(data, sync)

        monkeypatch.setattr(registry.store, "save_record", failing)
        registry.flush()
        on_disk = set(SessionStore(tmp_path, FP).index())
        assert on_disk == {records[1].session_id, records[2].session_id}
        assert registry.counters["store_errors"] == 1

    asyncio.run(run())


def test_snapshots_while_another_thread_changes_the_record(tmp_path: Path) -> None:
    """The recall gate appends from a worker thread while a spill snapshots the record: never a
    'dictionary changed size during iteration'."""
    record = make_record()
    stop = threading.Event()

    def mutate() -> None:
        for i in range(3000):
            record.add_recall(RecallEntry(f"{i:064x}", "r", ((f"{i:064x}", i, i),)))
            record.add_kept_map(record.kept_maps["c" * 64].__class__(f"{i:064x}", ((0, 1),), 10, 5, "d" * 64), "l",
                                {f"u{i}": (b"x", 1)})
        stop.set()

    thread = threading.Thread(target=mutate)
    thread.start()
    snapshots = 0
    while not stop.is_set():
        _version, data = record.snapshot()
        assert len(data["kept_maps"]) == len(data["map_labels"])
        snapshots += 1
    thread.join()
    assert snapshots > 1
    assert SessionRecord.from_dict(record.to_dict()).to_dict() == record.to_dict()


def test_the_event_loop_never_waits_for_store_io(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A slow KV write (a big model's state) runs on the I/O thread: turns keep being admitted
    and listed meanwhile, the engine's worker is not held either."""
    async def run() -> None:
        registry = registry_at(tmp_path, budget=0)
        a = await registry.get_or_create(sid("a"), "t", "x")
        a.count("turns")
        save_kv = registry.store.save_kv

        def slow_save_kv(session_id: str, state: SavedState) -> list[str]:
            time.sleep(1.0)
            return save_kv(session_id, state)

        monkeypatch.setattr(registry.store, "save_kv", slow_save_kv)
        started = time.perf_counter()
        registry.stash(a.session_id, make_state())  # the engine's worker: returns at once
        assert time.perf_counter() - started < 0.2
        started = time.perf_counter()
        await registry.get_or_create(sid("b"), "t", "x")
        registry.list("t")
        registry.stats()
        assert time.perf_counter() - started < 0.2
        assert {i.session_id: i.tier for i in registry.list("t")}[a.session_id] == "ram"  # still spilling
        assert registry.fetch(a.session_id) == (make_state(), "ram")  # and served from memory meanwhile
        registry.settle()

    asyncio.run(run())


def test_tier_follows_the_engine_and_dropped_files(tmp_path: Path) -> None:
    async def run() -> None:
        registry = registry_at(tmp_path, budget=0)
        a = await registry.get_or_create(sid("a"), "t", "x")
        a.count("turns")
        registry.holding(a.session_id, 300)
        assert registry.list("t")[0].tier == "context"
        registry.stash(a.session_id, make_state())
        registry.settle()
        assert registry.list("t")[0].tier == "disk"
        path = registry.store.dir / a.session_id / "kv.zst"
        path.write_bytes(path.read_bytes()[:100])
        assert registry.fetch(a.session_id) is None  # fails its checksum: dropped
        assert registry.list("t")[0].tier == "none"

    asyncio.run(run())


async def restarted_with_a_stored_state(path: Path) -> tuple[SessionRegistry, SessionRecord]:
    """A session whose state was flushed to disk, and a new registry (a restart) over the store."""
    registry = registry_at(path)
    record = await registry.get_or_create(sid("a"), "t", "x")
    registry.stash(record.session_id, make_state())
    registry.flush()
    again = registry_at(path)
    await again.get_or_create(record.session_id, "t", "x")
    return again, record


def test_prefetch_reads_a_stored_state_once_and_the_engine_gets_it(tmp_path: Path,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    async def run() -> None:
        again, record = await restarted_with_a_stored_state(tmp_path)
        loads: list[str] = []
        real = again.store.load_state
        monkeypatch.setattr(again.store, "load_state", lambda s: loads.append(s) or real(s))
        again.prefetch(record.session_id)
        again.prefetch(record.session_id)  # asked twice while the first read runs: one read
        again.prefetch(sid("never-stored"))  # nothing on disk: nothing to read, the first stays
        again.settle()
        assert loads == [record.session_id]
        assert again.fetch(record.session_id) == (make_state(), "disk")
        assert loads == [record.session_id]  # the engine took the state read ahead, not a second read
        assert again.fetch(record.session_id) == (make_state(), "disk")  # consumed: a later fetch reads again
        assert len(loads) == 2

    asyncio.run(run())


def test_a_deleted_session_is_never_served_from_a_prefetch(tmp_path: Path) -> None:
    async def run() -> None:
        again, record = await restarted_with_a_stored_state(tmp_path)
        again.prefetch(record.session_id)
        again.settle()
        await again.delete(record.session_id)
        assert again.fetch(record.session_id) is None

    asyncio.run(run())


def test_prefetch_skips_a_state_in_ram(tmp_path: Path) -> None:
    async def run() -> None:
        registry = registry_at(tmp_path)
        record = await registry.get_or_create(sid("a"), "t", "x")
        registry.stash(record.session_id, make_state())
        registry.prefetch(record.session_id)
        assert registry.fetch(record.session_id) == (make_state(), "ram")

    asyncio.run(run())
