"""The benchmark smoke run, as CI runs it: `benchmarks/run.py --quick` on the replay section drives
the real gateway, llama-cpp-python's own server and the floor on (shortened) real sessions, and
writes its report under benchmarks/.cache/quick/, never into BENCHMARKS.md."""

from __future__ import annotations

import hashlib
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT.parent / "shared" / "data" / "swe-dev.jsonl.zst"

pytestmark = [pytest.mark.engine, pytest.mark.timeout(900)]


def digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest() if path.exists() else ""


@pytest.mark.skipif(not DATA.is_file(), reason="../shared/data is not on this machine")
def test_quick_replay_runs_every_server_and_leaves_benchmarks_md_alone() -> None:
    published = digest(ROOT / "BENCHMARKS.md")
    run = subprocess.run([sys.executable, "benchmarks/run.py", "--quick", "--only", "replay"], cwd=ROOT,
                         capture_output=True, text=True, timeout=840)
    assert run.returncode == 0, run.stderr[-3000:]
    assert digest(ROOT / "BENCHMARKS.md") == published
    section = (ROOT / "benchmarks" / ".cache" / "quick" / "results" / "replay.md").read_text()
    assert "failed" not in section, section
    assert "not for publication" in section  # a smoke run never passes for a published one
    for server in ("| gateway |", "| llama_cpp.server |", "| gateway, compression off |", "| floor (new tokens only) |"):
        assert server in section, section
    assert (ROOT / "benchmarks" / ".cache" / "quick" / "plots" / "replay_wait.png").stat().st_size > 0


@pytest.mark.skipif(not DATA.is_file(), reason="../shared/data is not on this machine")
def test_quick_batching_section_compares_both_engines_without_errors() -> None:
    run = subprocess.run([sys.executable, "benchmarks/run.py", "--quick", "--only", "batching"], cwd=ROOT,
                         capture_output=True, text=True, timeout=840)
    assert run.returncode == 0, run.stderr[-3000:]
    section = (ROOT / "benchmarks" / ".cache" / "quick" / "results" / "batching.md").read_text()
    assert "not for publication" in section
    for engine in ("| single sequence |", "| batched, 4 sequences |"):
        rows = [line for line in section.splitlines() if engine in line]
        assert len(rows) == 2, section  # on the fast model and on the served default
        for row in rows:
            assert row.rstrip(" |").endswith("| 0"), row  # no failed turn
    assert section.count("aggregate throughput, batched over single") == 2
