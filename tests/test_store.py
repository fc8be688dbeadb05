"""The on-disk session store: round trips, validation, budgets, crashes mid-write."""

from __future__ import annotations

import multiprocessing
import random
import os
import signal
import time
from pathlib import Path

import msgpack
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from engine.base import SavedState
from policies.kept_lines import KeptLineMap
from sessions.identity import session_hash
from sessions.record import RecallEntry, SessionRecord
from sessions import kv_codec
from sessions.layout import FORMAT_VERSION, KV_MAGIC, read_kv_header
from sessions.store import KV, META, SessionStore

FP = "model-sha|4096|f16|f16|swa_full=False|template"


def make_record(name: str = "s1", tenant: str = "t") -> SessionRecord:
    record = SessionRecord(session_id=session_hash(tenant, name), tenant=tenant, key_source="x-session-id")
    record.served_hashes = ["a" * 64, "b" * 64]
    record.kept_maps["c" * 64] = KeptLineMap("c" * 64, ((0, 3), (9, 12)), 500, 120, "d" * 64)
    record.map_labels["c" * 64] = "the output of read_file(call_1)"
    record.recall_log.append(RecallEntry("e" * 64, "[pflash: recalled]\nhi", (("c" * 64, 5, 6),)))
    return record


def make_state(n: int = 300, size: int = 50_000) -> SavedState:
    blob = random.Random(size).randbytes(size)  # incompressible, so byte budgets bite
    return SavedState(tuple(range(n)), blob)


def _decoded(blob: bytes, level: int = 1) -> tuple[list[kv_codec.Frame], memoryview]:
    frames, parts = kv_codec.encode(blob, level)
    return frames, kv_codec.decode(memoryview(b"".join(parts)), frames, np.empty(len(blob), np.uint8))


@given(st.binary(max_size=4096), st.sampled_from([1, 3]))
@settings(max_examples=200)
def test_kv_codec_round_trip(blob: bytes, level: int) -> None:
    assert _decoded(blob, level)[1] == blob


def f16_like(n_values: int) -> bytes:
    """Low bytes random, high bytes from a few values: how f16 KV looks to a compressor."""
    rng = random.Random(n_values)
    return bytes(b for _ in range(n_values) for b in (rng.randrange(256), rng.choice((0x3C, 0x3D, 0xBC, 0xBD))))


def test_kv_codec_stores_the_random_plane_raw_and_compresses_the_other() -> None:
    blob = f16_like(200_000)
    frames, decoded = _decoded(blob)
    assert decoded == blob
    assert [codec for codec, _size in frames] == ["raw", "zstd"]
    assert frames[0][1] == 200_000 and frames[1][1] < 200_000 // 2


def test_kv_codec_rejects_a_frame_table_that_does_not_fit() -> None:
    blob = f16_like(1000)
    frames, parts = kv_codec.encode(blob, 1)
    body = memoryview(b"".join(parts))
    with pytest.raises(ValueError):
        kv_codec.decode(body, [frames[0], (frames[1][0], frames[1][1] + 1)], np.empty(len(blob), np.uint8))
    with pytest.raises(ValueError):
        kv_codec.decode(body, [("lz4", frames[0][1]), frames[1]], np.empty(len(blob), np.uint8))


def test_kv_codec_checks_a_compressed_plane_to_its_last_byte() -> None:
    """The crc32 trailer is checked first, but a plane's own zstd checksum must hold by itself."""
    import zstandard

    blob = f16_like(20_000)
    frames, parts = kv_codec.encode(blob, 1)
    for offset in (frames[0][1] + 100, frames[0][1] + frames[1][1] - 2):  # mid-frame, in the checksum
        body = bytearray(b"".join(kv_codec.encode(blob, 1)[1]))
        body[offset] ^= 0x41
        with pytest.raises((ValueError, zstandard.ZstdError)):
            kv_codec.decode(memoryview(bytes(body)), frames, np.empty(len(blob), np.uint8))


def test_a_kv_file_of_the_single_frame_layout_still_loads(tmp_path: Path) -> None:
    """Files written before the frame table (one zstd frame of both planes) resume as before."""
    import struct
    import zlib

    import zstandard

    store = SessionStore(tmp_path, FP)
    record, state = make_record(), SavedState(tuple(range(300)), f16_like(30_000))
    store.save(record, state)
    path = tmp_path / "sessions" / next(p.name for p in (tmp_path / "sessions").iterdir() if p.is_dir())
    kv = path / record.session_id / KV
    header, _start = read_kv_header(kv.read_bytes())
    assert header["frames"][0][0] == "raw"
    del header["frames"]
    packed = msgpack.packb(header, use_bin_type=True)
    frame = zstandard.ZstdCompressor(level=1, write_checksum=True).compress(kv_codec.split(state.blob))
    kv.write_bytes(KV_MAGIC + struct.pack("<I", len(packed)) + packed + frame + struct.pack("<I", zlib.crc32(frame)))
    assert header["format"] == FORMAT_VERSION
    assert SessionStore(tmp_path, FP).load_state(record.session_id) == state


def test_save_load_round_trip(tmp_path: Path) -> None:
    store = SessionStore(tmp_path, FP)
    record, state = make_record(), make_state()
    store.save(record, state)
    loaded = SessionStore(tmp_path, FP)  # as after a restart: index first, load lazily
    assert record.session_id in loaded.index()
    assert loaded.load_record(record.session_id).to_dict() == record.to_dict()  # type: ignore[union-attr]
    assert loaded.load_state(record.session_id) == state


def test_record_only_save_keeps_kv(tmp_path: Path) -> None:
    store = SessionStore(tmp_path, FP)
    record, state = make_record(), make_state()
    store.save(record, state)
    record.count("turns")
    store.save(record, None)
    assert store.load_state(record.session_id) == state
    assert store.load_record(record.session_id).counters == {"turns": 1}  # type: ignore[union-attr]


def _corrupt_truncate(path: Path) -> None:
    data = (path / KV).read_bytes()
    (path / KV).write_bytes(data[: len(data) // 2])


def _corrupt_flip(path: Path) -> None:
    data = bytearray((path / KV).read_bytes())
    data[len(data) // 3] ^= 0x40
    (path / KV).write_bytes(bytes(data))


def _corrupt_version(path: Path) -> None:
    meta = msgpack.unpackb((path / META).read_bytes(), raw=False)
    meta["format"] = 0
    (path / META).write_bytes(msgpack.packb(meta))


def _corrupt_fingerprint(path: Path) -> None:
    meta = msgpack.unpackb((path / META).read_bytes(), raw=False)
    meta["fingerprint"] = "another-model|4096|f16|f16|swa_full=False|template"
    (path / META).write_bytes(msgpack.packb(meta))


def _corrupt_meta_garbage(path: Path) -> None:
    (path / META).write_bytes(b"\xc1\xc1 not msgpack")


@pytest.mark.parametrize("corrupt", [_corrupt_truncate, _corrupt_flip])
def test_bad_kv_is_discarded_record_kept(tmp_path: Path, corrupt, caplog: pytest.LogCaptureFixture) -> None:  # type: ignore[no-untyped-def]
    store = SessionStore(tmp_path, FP)
    record = make_record()
    store.save(record, make_state())
    corrupt(store.dir / record.session_id)
    assert store.load_state(record.session_id) is None
    assert "discarded" in caplog.text
    assert store.load_record(record.session_id) is not None  # the kept-line maps survive
    assert store.counters["failures"] == 1


@pytest.mark.parametrize("corrupt", [_corrupt_version, _corrupt_fingerprint, _corrupt_meta_garbage])
def test_bad_metadata_discards_session(tmp_path: Path, corrupt, caplog: pytest.LogCaptureFixture) -> None:  # type: ignore[no-untyped-def]
    store = SessionStore(tmp_path, FP)
    record = make_record()
    store.save(record, make_state())
    corrupt(store.dir / record.session_id)
    store = SessionStore(tmp_path, FP)  # as after a restart
    assert record.session_id not in store.index()
    assert store.load_record(record.session_id) is None
    assert store.load_state(record.session_id) is None
    assert "discarded" in caplog.text


def _slow_writer(root: str) -> None:
    store = SessionStore(Path(root), FP)
    record = make_record("victim")
    while True:  # rewrite forever; the parent kills us at a random point
        store.save(record, make_state(size=3_000_000))


def test_kill_9_during_writes_never_loads_a_corrupt_session(tmp_path: Path) -> None:
    store = SessionStore(tmp_path, FP)
    victim = make_record("victim")
    for delay in (0.05, 0.13, 0.31, 0.5):
        proc = multiprocessing.get_context("spawn").Process(target=_slow_writer, args=(str(tmp_path),))
        proc.start()
        time.sleep(0.8 + delay)  # spawn start-up, then a few writes
        os.kill(proc.pid, signal.SIGKILL)
        proc.join()
        state = store.load_state(victim.session_id)
        # Either a complete, valid state or nothing at all: never a torn one.
        assert state is None or state == make_state(size=3_000_000)
        record = store.load_record(victim.session_id)
        assert record is None or record.to_dict()["kept_maps"] == victim.to_dict()["kept_maps"]


def test_disk_budget_evicts_least_recently_used(tmp_path: Path) -> None:
    store = SessionStore(tmp_path, FP, budget_bytes=250_000)
    records = [make_record(f"s{i}") for i in range(4)]
    for i, record in enumerate(records):
        record.last_used = 1000.0 + i
        store.save(record, make_state(size=100_000))
    kept = set(store.index())
    assert records[-1].session_id in kept
    assert records[0].session_id not in kept
    assert sum(e.total_bytes for e in store.index().values()) <= 250_000


def test_session_ids_must_be_hashes(tmp_path: Path) -> None:
    store = SessionStore(tmp_path, FP)
    with pytest.raises(ValueError):
        store.delete("../../etc")


def test_files_0600_and_dirs_0700_under_umask_022(tmp_path: Path) -> None:
    old = os.umask(0o022)
    try:
        store = SessionStore(tmp_path / "store", FP)
        record = make_record()
        store.save(record, make_state())
    finally:
        os.umask(old)
    root = tmp_path / "store"
    for path in [root, *root.rglob("*")]:
        mode = path.stat().st_mode & 0o777
        assert mode == (0o700 if path.is_dir() else 0o600), (path, oct(mode))


def test_temp_names_are_unique_per_write(tmp_path: Path) -> None:
    from sessions.files import temp_name

    target = tmp_path / "meta.msgpack"
    names = {temp_name(target) for _ in range(1000)}
    assert len(names) == 1000 and all(str(os.getpid()) in n.name for n in names)


def test_kv_save_streams_without_whole_copies(tmp_path: Path) -> None:
    import tracemalloc

    store = SessionStore(tmp_path, FP)
    record = make_record()
    store.save_record(record.to_dict())
    state = SavedState(tuple(range(10)), bytes(range(256)) * (64 * 1024))  # 16 MiB, compressible
    tracemalloc.start()
    store.save_kv(record.session_id, state)
    _current, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    assert peak < len(state.blob) // 4, peak  # chunks of a MiB, not 4-5 copies of the state
    assert store.load_state(record.session_id) == state


def test_stale_fingerprints_count_in_the_budget_and_go_first(tmp_path: Path) -> None:
    old = SessionStore(tmp_path, "another-model|8192|f16|f16|swa_full=False|template")
    old_record = make_record("old")
    old.save(old_record, make_state(size=200_000))
    store = SessionStore(tmp_path, FP, budget_bytes=300_000)
    assert store.stale_bytes() > 200_000
    record = make_record("new")
    store.save(record, make_state(size=150_000))  # 350 KB with the stale directory: over budget
    assert not old.dir.exists()  # the other model's sessions went, not ours
    assert record.session_id in store.index()


def test_dropped_kv_leaves_the_index(tmp_path: Path) -> None:
    store = SessionStore(tmp_path, FP)
    record = make_record()
    store.save(record, make_state())
    assert store.index()[record.session_id].kv_tokens == 300
    _corrupt_flip(store.dir / record.session_id)
    assert store.load_state(record.session_id) is None
    assert store.index()[record.session_id].kv_tokens == 0
