"""Prefix checkpoints without a model: the lookup (used only on an exact token-id prefix), the
positions a prefill saves at, the RAM and disk budgets, a restart, and damaged files.
Model: none (states are random bytes).
"""

from __future__ import annotations

import random
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from engine.base import SavedState
from policies.prefix_keys import checkpoint_positions, prefix_key, prefix_keys
from sessions.checkpoints import CheckpointStore

FP = "model-sha|4096|f16|f16|swa_full=False|template"
MB = 1 << 20


def state(tokens: list[int], size: int = 4096) -> SavedState:
    return SavedState(tuple(tokens), random.Random(len(tokens) * 7919 + size).randbytes(size))


def open_store(root: Path, ram: int = 64 * MB, disk: int = 64 * MB) -> CheckpointStore:
    return CheckpointStore(root, FP, ram, disk)


token_lists = st.lists(st.integers(0, 5), min_size=1, max_size=24)


@given(stored=st.lists(token_lists, max_size=6), prompt=token_lists)
@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
def test_a_checkpoint_is_used_only_when_its_token_ids_are_a_prefix_of_the_prompt(
        tmp_path_factory: pytest.TempPathFactory, stored: list[list[int]], prompt: list[int]) -> None:
    store = open_store(tmp_path_factory.mktemp("cp"))
    for tokens in stored:
        store.add(state(tokens), "system", "s")
    n = store.longest(prompt)
    prefixes = [len(t) for t in stored if t == prompt[: len(t)]]
    assert n == max(prefixes, default=0)  # the longest true prefix, and only a true one
    if n:
        found = store.load(prompt[:n])
        assert found is not None and list(found[0].tokens) == prompt[:n]
    assert store.longest(prompt, above=n) == 0
    store.close()


def common_prefix(a: list[int], b: list[int]) -> int:
    return next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))


@given(stored=st.lists(token_lists, max_size=6), prompt=token_lists, rollback=st.integers(0, 30),
       above=st.integers(0, 10))
@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
def test_the_longest_common_prefix_is_offered_only_within_the_rollback_the_cache_allows(
        tmp_path_factory: pytest.TempPathFactory, stored: list[list[int]], prompt: list[int], rollback: int,
        above: int) -> None:
    store = open_store(tmp_path_factory.mktemp("lcp"))
    for i, tokens in enumerate(stored):
        store.add(state(tokens), "prompt", f"session-{i}")
    covered, common = store.longest_common(prompt, rollback, above)
    usable = [common_prefix(t, prompt) for t in stored if len(t) - common_prefix(t, prompt) <= rollback]
    assert common == max((c for c in usable if c > above), default=0)
    if common:
        assert list(covered[:common]) == prompt[:common] and len(covered) - common <= rollback
        assert store.load(covered) is not None  # what the engine restores, then cuts back to `common`
    else:
        assert covered == ()
    store.close()


@given(tokens=st.lists(st.integers(0, 2**31 - 1), max_size=200), cuts=st.lists(st.integers(0, 220), max_size=8))
def test_the_hash_chain_names_each_prefix_as_hashing_it_alone(tokens: list[int], cuts: list[int]) -> None:
    keys = prefix_keys(tokens, cuts)
    assert set(keys) == {n for n in cuts if 0 < n <= len(tokens)}
    assert all(keys[n] == prefix_key(tokens[:n]) for n in keys)


@given(n=st.integers(1, 40_000), reuse=st.integers(0, 40_000), marks=st.lists(st.integers(0, 40_000), max_size=3),
       interval=st.sampled_from([0, 4096, 8192]), min_tokens=st.sampled_from([1, 1024]))
def test_a_prefill_saves_only_where_it_passes(n: int, reuse: int, marks: list[int], interval: int,
                                              min_tokens: int) -> None:
    positions = checkpoint_positions(n, reuse, marks, interval, min_tokens)
    assert positions == sorted(set(positions))
    assert all(reuse < p <= n and p >= min_tokens for p in positions)
    assert all(p in positions for p in marks if reuse < p <= n and p >= min_tokens)
    assert (n in positions) == (reuse < n and n >= min_tokens)  # each prompt's end, for the next turn
    if interval:
        assert all(p in positions for p in range(interval, n, interval) if p > reuse and p >= min_tokens)


def test_the_ram_budget_holds_and_what_leaves_ram_is_found_on_disk(tmp_path: Path) -> None:
    store = open_store(tmp_path, ram=3 * 100_000, disk=64 * MB)
    prompts = [[i] * 50 + list(range(100)) for i in range(8)]
    for tokens in prompts:
        store.add(state(tokens, 100_000), "system", "s")
        assert store.stats()["checkpoint_ram_bytes"] <= 3 * 100_000
    store.settle()
    stats = store.stats()
    assert stats["checkpoints_ram"] == 3 and stats["checkpoints_disk"] == 5 and stats["checkpoint_spills"] == 5
    found = store.load(prompts[0])  # the oldest: read back from disk, byte for byte
    assert found is not None and found[1] == "disk"
    assert bytes(found[0].blob) == bytes(state(prompts[0], 100_000).blob)
    assert store.stats()["checkpoint_ram_bytes"] <= 3 * 100_000
    store.close()


def test_the_disk_budget_holds_by_deleting_the_least_recently_used(tmp_path: Path) -> None:
    store = open_store(tmp_path, ram=0, disk=350_000)  # nothing stays in RAM: every checkpoint goes to disk
    prompts = [[i] * 60 for i in range(1, 9)]
    for tokens in prompts:
        store.add(state(tokens, 100_000), "interval", "s")
        store.settle()
        assert store.stats()["checkpoint_disk_bytes"] <= 350_000
        assert sum(p.stat().st_size for p in store.dir.glob("*.kv")) <= 350_000
    assert store.longest(prompts[-1]) == 60 and store.longest(prompts[0]) == 0
    assert store.stats()["checkpoint_evicted_disk"] >= 5
    store.close()


def test_checkpoints_survive_a_restart_and_a_damaged_file_is_dropped(tmp_path: Path) -> None:
    store = open_store(tmp_path)
    kept, damaged = list(range(300)), list(range(1, 301))
    store.add(state(kept), "system", "s")
    store.add(state(damaged), "system", "s")
    store.flush()
    store.close()
    path = store.dir / f"{prefix_key(damaged)}.kv"
    data = bytearray(path.read_bytes())
    data[-10] ^= 0xFF  # a flipped byte in the frames: the crc32 trailer catches it
    path.write_bytes(bytes(data))
    (store.dir / ".junk.kv.1.2.tmp").write_bytes(b"half a write")

    again = open_store(tmp_path)
    assert again.longest(kept + [7, 7]) == 300
    found = again.load(kept)
    assert found is not None and found[1] == "disk" and bytes(found[0].blob) == bytes(state(kept).blob)
    assert again.longest(damaged + [1]) == 300  # its header is fine: it is a candidate ...
    assert again.load(damaged) is None  # ... until the body fails its checksum
    again.settle()
    assert again.longest(damaged + [1]) == 0 and not path.exists()
    assert not list(again.dir.glob(".*.tmp"))
    again.close()


def test_a_file_whose_tokens_do_not_match_its_name_is_never_offered(tmp_path: Path) -> None:
    store = open_store(tmp_path)
    store.add(state(list(range(100))), "system", "s")
    store.flush()
    store.close()
    (store.dir / f"{prefix_key(list(range(100)))}.kv").rename(store.dir / f"{prefix_key([9] * 100)}.kv")
    again = open_store(tmp_path)
    assert again.longest([9] * 120) == 0 and again.longest(list(range(120))) == 0
    again.close()


def test_a_sessions_newer_prompt_checkpoint_replaces_its_older_unused_one(tmp_path: Path) -> None:
    store = open_store(tmp_path)
    first, second = list(range(200)), list(range(260))
    store.add(state(first), "prompt", "session-a")
    store.add(state(second), "prompt", "session-a")
    assert store.longest(first) == 0 and store.longest(second) == 260
    store.add(state([5] * 200), "prompt", "session-b")  # another session's stays
    assert store.longest([5] * 200) == 200 and store.longest(second) == 260
    assert store.stats()["checkpoint_superseded"] == 1
    store.close()


def test_the_listing_names_tokens_hits_and_tier(tmp_path: Path) -> None:
    store = open_store(tmp_path)
    store.add(state(list(range(128))), "system", "s")
    assert store.load(list(range(128))) is not None
    (row,) = store.listing()
    assert (row["tokens"], row["hits"], row["tier"], row["origin"]) == (128, 1, "ram", "system")
    store.flush()
    assert store.listing()[0]["tier"] == "ram+disk"
    store.close()


def test_tokens_are_compared_not_only_their_hash(tmp_path: Path) -> None:
    """A checkpoint whose recorded tokens differ from the prompt's is refused even under its key."""
    store = open_store(tmp_path)
    store.add(state(list(range(64))), "system", "s")
    entry = next(iter(store._entries.values()))
    entry.tokens = np.asarray([1] * 64, dtype="<i4")  # as if two prefixes shared a digest
    assert store.longest(list(range(80))) == 0
    assert store.load(list(range(64))) is None
    store.close()
