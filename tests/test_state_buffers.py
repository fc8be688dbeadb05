"""Reused state buffers: a buffer is handed out again only when nothing else refers to it, the pool
stays bounded, and the RAM budget counts what a pooled state really keeps alive."""

from __future__ import annotations

import ctypes
import random
from pathlib import Path

import numpy as np

from engine.base import SavedState
from sessions.registry import SessionRegistry
from sessions.state_buffers import MIN_POOLED, StateBuffers, held_bytes
from sessions.store import SessionStore
from tests.test_store import FP, make_record

BIG = MIN_POOLED + 12345


def test_a_free_buffer_is_reused_and_a_held_one_never() -> None:
    pool = StateBuffers()
    first = pool.take(BIG)
    first[:] = 1
    second = pool.take(BIG)  # the first is still referred to: a buffer of its own
    assert not np.shares_memory(first, second)
    del first
    third = pool.take(BIG)
    assert pool.counters == {"reused": 1, "allocated": 2}
    assert not np.shares_memory(third, second)
    assert third[0] == 1  # the first's memory, not zeroed: the caller overwrites it


def test_views_memoryviews_and_ctypes_keep_a_buffer_busy() -> None:
    pool = StateBuffers(keep=1)
    for hold in (lambda a: a[10:20], memoryview, lambda a: (ctypes.c_uint8 * len(a)).from_buffer(a)):
        holder = hold(pool.take(BIG))
        other = pool.take(BIG)
        assert pool.counters["reused"] == 0, hold
        del holder, other
        pool = StateBuffers(keep=1)


def test_pool_keeps_at_most_keep_buffers() -> None:
    pool = StateBuffers(keep=2)
    held = [pool.take(BIG) for _ in range(5)]
    assert pool.pooled_bytes() <= 2 * len(held[0].base)
    assert pool.counters["allocated"] == 5
    del held
    pool.take(BIG)
    pool.take(BIG)
    assert pool.counters["reused"] == 2


def test_small_states_are_not_pooled_and_warm_gives_a_reusable_touched_buffer() -> None:
    pool = StateBuffers()
    small = pool.take(1000)
    assert small.base is None and pool.pooled_bytes() == 0
    pool.warm(BIG)
    assert pool.pooled_bytes() >= BIG
    pool.take(BIG)
    assert pool.counters["reused"] == 1
    # A state a little larger (the next turn) still fits the same buffer.
    pool.take(BIG + 100_000)
    assert pool.counters["reused"] == 2


def test_held_bytes_counts_the_whole_pooled_buffer() -> None:
    pool = StateBuffers()
    blob = memoryview(pool.take(BIG)[: BIG - 10])
    assert held_bytes(blob) == len(blob.obj.base) > BIG  # type: ignore[union-attr]
    assert held_bytes(b"x" * 100) == 100
    assert held_bytes(memoryview(np.empty(100, np.uint8))) == 100


def big_state(seed: int) -> SavedState:
    return SavedState(tuple(range(50)), random.Random(seed).randbytes(BIG))


def test_loads_never_share_a_buffer_that_is_still_held(tmp_path: Path) -> None:
    store = SessionStore(tmp_path, FP)
    a, b = make_record("a"), make_record("b")
    store.save(a, big_state(1))
    store.save(b, big_state(2))
    first = store.load_state(a.session_id)
    second = store.load_state(b.session_id)  # must not overwrite the first, still held
    assert first == big_state(1) and second == big_state(2)
    del first
    again = store.load_state(a.session_id)
    assert again == big_state(1) and second == big_state(2)
    assert store.buffers.counters["reused"] >= 1


def test_registry_warms_a_buffer_for_the_largest_stored_state(tmp_path: Path) -> None:
    store = SessionStore(tmp_path, FP)
    record = make_record("a")
    store.save(record, big_state(3))
    registry = SessionRegistry(SessionStore(tmp_path, FP), ram_budget_bytes=10**9)
    assert registry.store.buffers.pooled_bytes() >= BIG
    assert registry.fetch(record.session_id) == (big_state(3), "disk")
    assert registry.stats()["state_buffers_reused"] == 1  # the resume wrote into the warmed buffer
    registry.close()


def test_ram_budget_counts_pooled_capacity(tmp_path: Path) -> None:
    registry = SessionRegistry(SessionStore(tmp_path, FP), ram_budget_bytes=10**9)
    buf = registry.buffer(BIG)
    buf[:] = 7
    registry.stash(make_record("a").session_id, SavedState((1, 2), memoryview(buf)))
    assert registry.stats()["ram_bytes"] >= len(buf.base) > BIG  # type: ignore[arg-type]
    registry.close()
