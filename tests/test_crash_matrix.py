"""Crash matrix (benchmarks/crash_matrix.py holds the script): after each SIGKILL, a restart and
the next turn, the session's transcript equals byte for byte that of a server that never failed,
no session is lost, and where the engine state came back as on that server the answer is the same.

The record is written ahead of every response, so this holds with `record_sync = "batched"`; the
last test shows the same kill losing the compressed history with `record_sync = "off"`.

CI runs a few kill points; PFLASH_SOAK=1 runs all ten. `make bench ARGS="--suite crash"` runs
all ten at the issue's size (a 20K-token tool output, default threshold).
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from benchmarks.crash_matrix import ALL_POINTS, SEED, Run, Script, python_module, run_script
from tests.conftest import Gateway

pytestmark = pytest.mark.engine

CI_POINTS = [(2, "prefill"), (3, "spill"), (3, "after"), (4, "stream")]  # in order within a turn
POINTS = ALL_POINTS if os.environ.get("PFLASH_SOAK") == "1" else CI_POINTS
SCRIPT = Script(python_module())
FLAGS = ("--n-threads", "1")


@pytest.fixture(scope="module")
def reference(tmp_path_factory: pytest.TempPathFactory, model_path: Path) -> Run:
    """The same conversation on a server that never fails."""
    started: list[Gateway] = []

    def start(*flags: str, store: Path) -> Gateway:
        server = Gateway(store, model_path, *flags)
        started.append(server)
        return server

    run = run_script(start, SCRIPT, tmp_path_factory.mktemp("reference") / "store", [], *FLAGS)
    for server in started:
        server.stop()
    assert run.headers[2]["X-PFlash-Compressed"] == "true"
    assert run.headers[3]["X-PFlash-Recall"] == "true"
    return run


def test_crash_matrix_transcripts_equal_a_server_that_never_failed(start_gateway, tmp_path: Path,
                                                                   reference: Run) -> None:  # type: ignore[no-untyped-def]
    run = run_script(start_gateway, SCRIPT, tmp_path / "store", POINTS, *FLAGS, reference=reference)
    same = [t for t in (1, 2, 3, 4) if run.answers[t] == reference.answers[t]]
    print(f"\ncrash matrix ({len(run.kills)} kills, seed {SEED}): " + "; ".join(run.kills)
          + f"\nturns (restored from, cached tokens): {run.restored}, reference {reference.restored}; "
          f"answers equal to the reference at turns {same}")
    assert len(run.kills) == len(POINTS)
    for (answered, served), kill_point in zip(run.after_restart, run.kills):
        # Written ahead: right after the restart, the session is exactly as its last answer left it.
        assert served == reference.transcripts[answered], kill_point
    for turn in (1, 2, 3, 4):
        assert run.transcripts[turn] == reference.transcripts[turn], (turn, run.kills)
    for source, cached in run.restored.values():
        assert source in ("context", "disk", "none"), run.restored
        assert (cached > 0) == (source != "none"), run.restored  # a restore that happened saved prefill
    # The same states, the same greedy answer (a turn after one that lost its KV to a kill mid-spill
    # prefills more tokens in other batches and may round differently: not compared).
    for turn in run.same_restore_turns(reference):
        assert run.answers[turn] == reference.answers[turn], (turn, run.restored, reference.restored)
    assert run.restore_failures() == 0


def test_without_records_written_ahead_a_kill_loses_the_compressed_history(start_gateway, tmp_path: Path,
                                                                          reference: Run) -> None:  # type: ignore[no-untyped-def]
    """The matrix can fail: with record_sync = "off" and no idle write of the state (which writes
    the record before it) the kept-line map of turn 2 exists only in memory; killed right after
    turn 2's answer, the restarted server serves the tool output whole."""
    run = run_script(start_gateway, SCRIPT, tmp_path / "store", [(2, "after")], *FLAGS, "--record-sync", "off",
                     "--no-persist-idle-states", reference=reference)
    assert run.after_restart[0][1] != reference.transcripts[2]
    assert run.transcripts[3] != reference.transcripts[3]
