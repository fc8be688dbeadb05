"""`make bench`'s harness: every section stamped with its commit and tree state, a dirty tree
refused unless asked, smoke runs kept out of BENCHMARKS.md, suites that cover every section."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import types
from pathlib import Path

import pytest

from benchmarks import run as bench_run
from engine.scoring.bundle import bundle_of
from benchmarks.common import BenchContext, Section, spread


def git(cwd: Path, *args: str) -> str:
    return subprocess.run(["git", *args], cwd=cwd, check=True, capture_output=True, text=True).stdout


@pytest.fixture()
def repo(tmp_path: Path) -> Path:
    git(tmp_path, "init", "-q")
    git(tmp_path, "config", "user.email", "t@example.com")
    git(tmp_path, "config", "user.name", "t")
    (tmp_path / "code.py").write_text("x = 1\n")
    (tmp_path / "BENCHMARKS.md").write_text("old\n")
    (tmp_path / "benchmarks" / "results").mkdir(parents=True)
    (tmp_path / "benchmarks" / "results" / "a.md").write_text("old\n")
    git(tmp_path, "add", ".")
    git(tmp_path, "commit", "-qm", "init")
    return tmp_path


def test_a_committed_tree_is_clean_and_names_its_commit(repo: Path) -> None:
    state = bench_run.tree_state(repo)
    assert state.clean
    assert state.commit == git(repo, "rev-parse", "HEAD").strip()
    assert state.commit[:12] in state.stamp and "clean tree" in state.stamp


def test_the_benchmarks_own_outputs_do_not_make_a_tree_dirty(repo: Path) -> None:
    (repo / "BENCHMARKS.md").write_text("new\n")
    (repo / "benchmarks" / "results" / "a.md").write_text("new\n")
    (repo / "benchmarks" / "plots").mkdir()
    (repo / "benchmarks" / "plots" / "p.png").write_bytes(b"png")
    assert bench_run.tree_state(repo).clean


@pytest.mark.parametrize("change", ["edit", "untracked", "staged"])
def test_code_changes_make_a_tree_dirty(repo: Path, change: str) -> None:
    if change == "edit":
        (repo / "code.py").write_text("x = 2\n")
    elif change == "untracked":
        (repo / "new_module.py").write_text("y = 1\n")
    else:
        (repo / "code.py").write_text("x = 3\n")
        git(repo, "add", "code.py")
    state = bench_run.tree_state(repo)
    assert not state.clean
    assert "not for publication" in state.stamp


def test_outside_a_git_checkout_the_tree_is_not_clean(tmp_path: Path) -> None:
    state = bench_run.tree_state(tmp_path)
    assert not state.clean and state.commit == "unknown"


def test_a_dirty_tree_is_refused_and_nothing_is_written(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    output = tmp_path / "BENCHMARKS.md"
    monkeypatch.setattr(bench_run, "OUTPUT", output)
    monkeypatch.setattr(bench_run, "tree_state", lambda root=None: bench_run.TreeState("abc", False))
    assert bench_run.main(["--only", "faults"]) == 2
    assert not output.exists()


def fake_section(monkeypatch: pytest.MonkeyPatch, markdown: str, plots: list[Path]) -> None:
    module = types.ModuleType("benchmarks.bench_fake")
    module.run = lambda ctx: Section("Fake", markdown, plots)  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "benchmarks.bench_fake", module)
    monkeypatch.setattr(bench_run, "SECTION_ORDER", ["fake"])
    monkeypatch.setattr(bench_run, "module_exists", lambda name: name == "fake")


def test_a_quick_run_stays_out_of_benchmarks_md(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    output, quick = tmp_path / "BENCHMARKS.md", tmp_path / "quick"
    monkeypatch.setattr(bench_run, "OUTPUT", output)
    monkeypatch.setattr(bench_run, "QUICK_DIR", quick)
    monkeypatch.setattr(bench_run, "tree_state", lambda root=None: bench_run.TreeState("f" * 40, False))
    fake_section(monkeypatch, "| a |\n", [])
    assert bench_run.main(["--quick", "--only", "fake"]) == 0
    assert not output.exists()
    written = (quick / "BENCHMARKS.md").read_text()
    assert "## Fake" in written and "not for publication" in written and "--quick" in written


def test_a_clean_run_stamps_every_section_and_links_every_plot(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    output = tmp_path / "BENCHMARKS.md"
    results = tmp_path / "results"
    results.mkdir()
    monkeypatch.setattr(bench_run, "OUTPUT", output)
    monkeypatch.setattr(bench_run, "LOAD_WAIT_S", 0)
    monkeypatch.setattr(bench_run, "tree_state", lambda root=None: bench_run.TreeState("a1b2c3d4e5f6" + "0" * 28, True))
    real_context = bench_run.BenchContext
    monkeypatch.setattr(bench_run, "BenchContext",
                        lambda **kw: real_context(**kw, results_dir=results, plots_dir=tmp_path, model_error="none"))
    fake_section(monkeypatch, "body\n", [tmp_path / "fake_plot.png"])
    assert bench_run.main([]) == 0
    text = output.read_text()
    assert "commit `a1b2c3d4e5f6`, clean tree" in text
    assert text.count("commit `a1b2c3d4e5f6`") == 2  # the header and the one section
    assert "(benchmarks/plots/fake_plot.png)" in text


def test_a_tuning_split_run_stays_out_of_benchmarks_md(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    output, reads = tmp_path / "BENCHMARKS.md", tmp_path / "reads.json"
    monkeypatch.setattr(bench_run, "OUTPUT", output)
    monkeypatch.setattr(bench_run, "SPLIT_DIR", tmp_path / "split-{split}")
    monkeypatch.setattr(bench_run, "TEST_SPLIT_READS", reads)
    monkeypatch.setattr(bench_run, "LOAD_WAIT_S", 0)
    monkeypatch.setattr(bench_run, "TEST_SPLIT_READERS", frozenset({"fake"}))
    monkeypatch.setattr(bench_run, "tree_state", lambda root=None: bench_run.TreeState("f" * 40, True))
    fake_section(monkeypatch, "| a |\n", [])
    assert bench_run.main(["--split", "validation", "--only", "fake"]) == 0
    assert not output.exists() and not reads.exists()  # neither published nor a read of the test split
    assert "## Fake" in (tmp_path / "split-validation" / "BENCHMARKS.md").read_text()


def test_every_read_of_the_test_split_is_logged_and_stated(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    reads = tmp_path / "reads.json"
    reads.write_text(json.dumps({"reads": [{"section": "fake", "commit": "old", "at": "then", "published": True},
                                           {"section": "other", "commit": "old", "at": "then", "published": True}]}))
    monkeypatch.setattr(bench_run, "TEST_SPLIT_READS", reads)
    monkeypatch.setattr(bench_run, "TEST_SPLIT_READERS", frozenset({"fake"}))
    monkeypatch.setattr(bench_run, "LOAD_WAIT_S", 0)
    monkeypatch.setattr(bench_run, "OUTPUT", tmp_path / "BENCHMARKS.md")
    monkeypatch.setattr(bench_run, "tree_state", lambda root=None: bench_run.TreeState("a" * 40, True))
    real_context = bench_run.BenchContext
    monkeypatch.setattr(bench_run, "BenchContext",
                        lambda **kw: real_context(**kw, results_dir=tmp_path, plots_dir=tmp_path, model_error="none"))
    fake_section(monkeypatch, "body\n", [])
    assert bench_run.main(["--only", "fake"]) == 0
    assert bench_run.main(["--only", "fake", "--reread-test", "the goal line was cut off"]) == 0
    logged = json.loads(reads.read_text())["reads"]
    assert [r["section"] for r in logged] == ["fake", "other", "fake", "fake"]
    assert logged[-1]["why"] == "the goal line was cut off" and logged[-1]["release"] == bench_run.release()
    assert "This run is read 3 of the frozen test split" in (tmp_path / "BENCHMARKS.md").read_text()


def split_reader(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, raw: object = None) -> tuple[Path, list[str]]:
    """A fake section that reads the test split, with its ledger in tmp_path: the ledger's path, and
    the split of each run of the section."""
    reads = tmp_path / "reads.json"
    monkeypatch.setattr(bench_run, "TEST_SPLIT_READS", reads)
    monkeypatch.setattr(bench_run, "TEST_SPLIT_READERS", frozenset({"fake"}))
    monkeypatch.setattr(bench_run, "LOAD_WAIT_S", 0)
    monkeypatch.setattr(bench_run, "OUTPUT", tmp_path / "BENCHMARKS.md")
    monkeypatch.setattr(bench_run, "QUICK_DIR", tmp_path / "quick")
    monkeypatch.setattr(bench_run, "SPLIT_DIR", tmp_path / "split-{split}")
    monkeypatch.setattr(bench_run, "tree_state", lambda root=None: bench_run.TreeState("a" * 40, True))
    real_context = bench_run.BenchContext
    monkeypatch.setattr(bench_run, "BenchContext", lambda **kw: real_context(
        **{"results_dir": tmp_path, "plots_dir": tmp_path, **kw}, model_error="none"))
    seen: list[str] = []

    def run(ctx: BenchContext) -> Section:
        seen.append(ctx.split)
        return Section("Fake", "body\n", [], raw=raw)

    module = types.ModuleType("benchmarks.bench_fake")
    module.run = run  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "benchmarks.bench_fake", module)
    monkeypatch.setattr(bench_run, "SECTION_ORDER", ["fake"])
    monkeypatch.setattr(bench_run, "module_exists", lambda name: name == "fake")
    return reads, seen


def test_a_release_reads_the_test_split_once_per_section(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    reads, seen = split_reader(monkeypatch, tmp_path)
    reads.write_text(json.dumps({"reads": [{"section": "fake", "commit": "old", "at": "then", "published": True}]}))
    assert bench_run.main(["--only", "fake"]) == 0  # reads logged before releases were recorded do not count
    assert bench_run.main(["--only", "fake"]) == 2  # the second read in this release is refused...
    assert len(json.loads(reads.read_text())["reads"]) == 2
    assert bench_run.main(["--only", "fake", "--split", "validation"]) == 0  # ...tuning goes on, on validation
    assert seen == ["test", "validation"]
    assert len(json.loads(reads.read_text())["reads"]) == 2


def test_a_quick_run_tunes_on_validation_and_a_quick_test_read_is_logged(monkeypatch: pytest.MonkeyPatch,
                                                                         tmp_path: Path) -> None:
    reads, seen = split_reader(monkeypatch, tmp_path)
    assert bench_run.main(["--quick", "--only", "fake"]) == 0
    assert seen == ["validation"] and not reads.exists()
    assert bench_run.main(["--quick", "--only", "fake", "--split", "test"]) == 0
    (read,) = json.loads(reads.read_text())["reads"]
    assert read["quick"] is True and read["published"] is False
    assert bench_run.main(["--only", "fake"]) == 2  # a quick read of the test split is a read


def test_a_section_s_samples_are_written_beside_its_markdown(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    samples = [{"output": "s1#0", "session": "s1", "kept": 0.5}]
    split_reader(monkeypatch, tmp_path, raw=samples)
    assert bench_run.main(["--only", "fake"]) == 0
    written = json.loads((tmp_path / "fake.json").read_text())
    assert written["samples"] == samples and written["commit"].startswith("commit `aaaaaaaaaaaa`")
    assert (tmp_path / "fake.md").is_file()
    # A later run that kept no samples leaves none behind.
    monkeypatch.setattr(sys.modules["benchmarks.bench_fake"], "run", lambda ctx: Section("Fake", "body\n", []))
    assert bench_run.main(["--only", "fake", "--reread-test", "samples dropped"]) == 0
    assert not (tmp_path / "fake.json").exists()


def test_the_committed_ledger_counts_every_published_quality_section() -> None:
    logged = json.loads(bench_run.TEST_SPLIT_READS.read_text())["reads"]
    assert {r["section"] for r in logged} <= bench_run.TEST_SPLIT_READERS
    assert sum(r["section"] == "retention" for r in logged) >= 11  # published before the ledger existed


def test_a_busy_machine_is_marked_under_the_section() -> None:
    tree = bench_run.TreeState("0" * 40, True)
    quiet = bench_run.render_section("x", Section("X", "b"), "make bench", 1.0, 0.1, tree)
    busy = bench_run.render_section("x", Section("X", "b"), "make bench", 1.0, 99.0, tree)
    assert "exceeded" not in quiet and "exceeded" in busy


def test_suites_cover_every_section_once() -> None:
    listed = [s for sections in bench_run.SUITES.values() for s in sections]
    assert sorted(listed) == sorted(bench_run.SECTION_ORDER)
    assert bench_run.selected_sections("replay", "") == ["replay"]
    with pytest.raises(SystemExit):
        bench_run.selected_sections("nope", "")


def test_spread_shows_median_and_range() -> None:
    assert spread([3.0, 1.0, 2.0, 10.0, 2.5]) == "2.50 (1.00–10.00)"
    assert spread([4.0]) == "4.00"
    assert spread([]) == "n/a"


def test_scorers_flag_reaches_the_quality_sections(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    seen: list[tuple[bool, bool]] = []
    module = types.ModuleType("benchmarks.bench_fake")

    def run(ctx: object) -> Section:
        seen.append((ctx.runs("bm25"), ctx.runs("embed")))  # type: ignore[attr-defined]
        return Section("Fake", "x\n", [])

    module.run = run  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "benchmarks.bench_fake", module)
    monkeypatch.setattr(bench_run, "SECTION_ORDER", ["fake"])
    monkeypatch.setattr(bench_run, "module_exists", lambda name: name == "fake")
    monkeypatch.setattr(bench_run, "QUICK_DIR", tmp_path / "quick")
    monkeypatch.setattr(bench_run, "tree_state", lambda root=None: bench_run.TreeState("f" * 40, False))
    assert bench_run.main(["--quick", "--only", "fake", "--scorers", "bm25"]) == 0
    assert bench_run.main(["--quick", "--only", "fake"]) == 0
    assert seen == [(True, False), (True, True)]


def test_every_section_meets_the_shared_models_cold(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """Sections share one encoder in memory, not what it read: a later section must not time warm
    scoring as a first compression."""
    events: list[str] = []

    class Encoder:
        def forget_features(self) -> None:
            events.append("forget")

    module = types.ModuleType("benchmarks.bench_fake")

    def run(ctx: object) -> Section:
        events.append("run")
        return Section("Fake", "x\n", [])

    module.run = run  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "benchmarks.bench_fake", module)
    ctx = bench_run.BenchContext(quick=True, plots_dir=tmp_path / "p", results_dir=tmp_path / "r",
                                 cache_dir=tmp_path / "c", model_error="none here")
    ctx._scorers.update({"embed": Encoder(), "bm25": object(), "drafter": None})
    bench_run.run_section("fake", ctx)
    bench_run.run_section("fake", ctx)
    assert events == ["forget", "run", "forget", "run"]


def test_follow_up_report_gives_median_and_mean_ratios_and_the_verdict() -> None:
    from benchmarks.bench_recall import followup_report
    from benchmarks.followup_timing import GATE_OFF, GATE_ON, FollowupTimes

    timed = FollowupTimes(conversations=2)
    timed.seconds[GATE_OFF] = [0.4, 0.4, 0.4, 0.4, 0.4]
    timed.seconds[GATE_ON] = [0.5, 0.5, 0.5, 6.0, 6.0]  # two of five fired
    timed.fired = [False, False, False, True, True]
    timed.recalled_tokens = [2000, 1900]
    md = followup_report(timed)
    assert "1.25× by the median follow-up (meets the ≤ 1.5× goal), 6.75× by the mean" in md
    assert "| gate on, follow-ups where it fired | 2 | 6.00 (6.00–6.00) | 6.00 |" in md
    timed.seconds[GATE_ON] = [0.5, 0.5, 6.0, 6.0, 6.0]
    timed.fired = [False, False, True, True, True]
    assert "(misses the ≤ 1.5× goal)" in followup_report(timed)


def test_a_memoised_scorer_is_planned_as_the_scorer_itself() -> None:
    """The retention sections memoise scores across budgets; the planner must still weigh unit size
    by the scorer's own exponent (the ranker's is not per token)."""
    from benchmarks.common import MemoBundle
    from engine.scoring.ranker import RankerScorer
    from engine.scoring.scorers import Bm25Scorer, size_exponent

    ranker = RankerScorer()
    memo = MemoBundle(bundle_of(ranker))
    assert size_exponent(memo.bundle.compress) == size_exponent(memo.bundle.unasked) == ranker.size_exponent != 1.0
    assert size_exponent(MemoBundle(bundle_of(Bm25Scorer())).bundle.compress) == 1.0


def test_every_published_plot_is_linked_and_every_link_is_published() -> None:
    text = bench_run.OUTPUT.read_text(encoding="utf-8")
    linked = set(re.findall(r"\(benchmarks/plots/([^)\s]+\.png)\)", text))
    stored = {p.name for p in (bench_run.ROOT / "benchmarks" / "plots").glob("*.png")}
    assert stored - linked == set(), "plots no section links (produce and link them, or remove them)"
    assert linked - stored == set(), "links to plots that are not stored"


def test_the_memory_section_reads_a_process_footprint() -> None:
    import os

    from benchmarks.bench_memory import Footprint

    mine = Footprint.of(os.getpid())
    assert mine.peak >= mine.anon > 0 and mine.file > 0  # this interpreter has mapped files and a heap


def test_each_model_counts_tokens_in_its_own_vocabulary(tmp_path: Path, model_path: Path,
                                                        instruct_model_path: Path) -> None:
    """BenchContext.counter_for: the bench's own model counts with its own tokenizer, another model
    with that model's (loaded once), so an output sized for Qwen is sized in Qwen's tokens."""
    from engine.tokenizer import GgufTokenizer

    ctx = BenchContext(quick=True, plots_dir=tmp_path / "p", results_dir=tmp_path / "r", cache_dir=tmp_path / "c",
                       model_path=model_path)
    text = "def parse_config(path):\n    return json.loads(Path(path).read_text())\n" * 20
    assert ctx.counter_for(model_path) == ctx.count_tokens
    qwen = ctx.counter_for(instruct_model_path)
    assert qwen is ctx.counter_for(instruct_model_path)  # loaded once
    assert qwen(text) == GgufTokenizer(instruct_model_path).count_tokens(text) != ctx.count_tokens(text)
