"""`pflash-gateway sessions ls|rm|gc` on the store directly, with no server running.
Model: none (no model is loaded).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from sessions.store import META, SessionStore
from tests.conftest import ROOT
from tests.test_store import FP, make_record, make_state


def cli(store: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "gateway.cli", "sessions", *args, "--store-dir", str(store)],
                          cwd=ROOT, capture_output=True, text=True, timeout=60)


def test_ls_rm_gc(tmp_path: Path) -> None:
    store = SessionStore(tmp_path, FP)
    good, doomed, broken = make_record("good"), make_record("doomed"), make_record("broken")
    for record in (good, doomed, broken):
        store.save(record, make_state(size=2000))
    (store.dir / broken.session_id / META).write_bytes(b"garbage")

    listed = json.loads(cli(tmp_path, "ls", "--json").stdout)
    assert {row["id"] for row in listed} == {good.session_id, doomed.session_id, broken.session_id}
    assert {row["id"]: row["valid"] for row in listed}[broken.session_id] is False
    assert {row["id"]: row["tokens"] for row in listed if row["valid"]}[good.session_id] == 300
    text = cli(tmp_path, "ls")
    assert text.returncode == 0 and good.session_id[:16] in text.stdout

    removed = cli(tmp_path, "rm", doomed.session_id[:12])
    assert removed.returncode == 0 and doomed.session_id in removed.stdout
    assert not (store.dir / doomed.session_id).exists()
    assert cli(tmp_path, "rm", "ffffffffffff").returncode == 1  # matches nothing

    cleaned = cli(tmp_path, "gc")
    assert cleaned.returncode == 0 and "removed 1 invalid" in cleaned.stdout
    assert not (store.dir / broken.session_id).exists()
    assert (store.dir / good.session_id / META).exists()


def test_rm_and_gc_refuse_while_a_server_holds_the_store(tmp_path: Path) -> None:
    from sessions.files import StoreLock

    store = SessionStore(tmp_path, FP)
    record = make_record("live")
    store.save(record, make_state(size=2000))
    (store.dir / ("f" * 64)).mkdir()  # an invalid leftover gc would remove
    server = StoreLock(tmp_path)
    server.hold_shared()
    try:
        for args in (("gc",), ("rm", record.session_id[:12])):
            refused = cli(tmp_path, *args)
            assert refused.returncode == 1
            assert refused.stderr.count("\n") == 1 and "server holds the store" in refused.stderr
        assert (store.dir / record.session_id / META).exists() and (store.dir / ("f" * 64)).exists()
        assert cli(tmp_path, "ls").returncode == 0  # reading is fine
    finally:
        server.release()
    assert cli(tmp_path, "gc").returncode == 0
    assert not (store.dir / ("f" * 64)).exists()


def test_gc_removes_directories_of_another_model(tmp_path: Path) -> None:
    old = SessionStore(tmp_path, "another-model|8192|f16|f16|swa_full=False|template")
    old.save(make_record("old"), make_state(size=2000))
    current = SessionStore(tmp_path, FP)  # the last server to start names its directory current
    kept = make_record("kept")
    current.save(kept, make_state(size=2000))
    cleaned = cli(tmp_path, "gc")
    assert cleaned.returncode == 0 and "1 stale model directories" in cleaned.stdout
    assert not old.dir.exists()
    assert (current.dir / kept.session_id / META).exists()
