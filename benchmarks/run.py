"""`make bench`: run the benchmark sections and rewrite BENCHMARKS.md.

Each section is a module `benchmarks/bench_<name>.py` exposing `run(ctx: BenchContext) -> Section`.
A section's last output is kept in `benchmarks/results/<name>.md`; BENCHMARKS.md is always the
concatenation of the stored sections in SECTION_ORDER. Every section is stamped with the commit it
ran at and whether the tree was clean: a dirty tree is refused unless `--allow-dirty`, which marks
the sections "not for publication". `--quick` is a smoke run: small sizes, written under
benchmarks/.cache/quick/, never into BENCHMARKS.md. A full run takes more than an hour on 2 cores,
so the sections come in named suites (`--suite`), each of which regenerates whole sections.

    .venv/bin/python benchmarks/run.py [--suite replay,clients,tasks,tasks_15b,prefix,tool_grammar,latency,batching,memory,resume,prefill,durability,crash,quality] [--quick] [--allow-dirty]
"""

from __future__ import annotations

import argparse
import datetime as dt
import importlib
import importlib.util
import json
import logging
import os
import shlex
import subprocess
import sys
import time
import tomllib
import traceback
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # run as a script: make the project's packages importable
    sys.path.insert(0, str(ROOT))

from benchmarks.common import BenchContext, Section, machine_line

# Fixed order of BENCHMARKS.md: the headline first.
SECTION_ORDER = ["replay", "clients", "tasks", "tasks_15b", "prefix", "tool_grammar", "retention", "rag_retention", "recall", "head", "prefill", "overhead", "resume", "ttft",
                 "load", "batching", "memory", "faults", "durability", "crash"]
# Named suites, each a set of whole sections; `make bench` with no --suite runs every section.
SUITES = {
    "replay": ["replay"],
    "clients": ["clients"],
    "tasks": ["tasks"],
    "tasks_15b": ["tasks_15b"],
    "prefix": ["prefix"],
    "tool_grammar": ["tool_grammar"],
    "latency": ["overhead", "ttft", "load", "faults"],
    "batching": ["batching"],
    "memory": ["memory"],
    "resume": ["resume"],
    "prefill": ["prefill"],
    "durability": ["durability"],
    "crash": ["crash"],
    "quality": ["retention", "rag_retention", "recall", "head"],
}
OUTPUT = ROOT / "BENCHMARKS.md"
QUICK_DIR = ROOT / "benchmarks" / ".cache" / "quick"  # smoke runs: never published
# Tuning runs on the train or validation split: never published either.
SPLIT_DIR = ROOT / "benchmarks" / ".cache" / "split-{split}"
# Sections that read the frozen test split's evidence; each read is logged (honest splits).
TEST_SPLIT_READERS = frozenset(SUITES["quality"])
TEST_SPLIT_READS = ROOT / "benchmarks" / "results" / "test_split_reads.json"
# What a run itself rewrites: a tree that differs only there is still the commit it says.
OUTPUT_PATHS = ("BENCHMARKS.md", "benchmarks/results/", "benchmarks/plots/")
STAMPED = "at commit `"  # in every section's run line (`at {TreeState.stamp}`) since runs are stamped
LOAD_WAIT_S = 180  # how long a section waits for other work to finish before it is marked


@dataclass(frozen=True)
class TreeState:
    commit: str  # full SHA, or "unknown" outside a git checkout
    clean: bool

    @property
    def stamp(self) -> str:
        return f"commit `{self.commit[:12]}`, " + ("clean tree" if self.clean else
                                                 "**dirty tree: not for publication**")


def tree_state(root: Path = ROOT) -> TreeState:
    """The commit the code under test is at, and whether the tree holds changes beyond the
    benchmark's own outputs."""
    try:
        commit = subprocess.run(["git", "rev-parse", "HEAD"], cwd=root, capture_output=True, text=True,
                                check=True).stdout.strip()
        status = subprocess.run(["git", "status", "--porcelain", "--untracked-files=all"], cwd=root,
                                capture_output=True, text=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError):
        return TreeState("unknown", False)
    changed = [line[3:].strip('"') for line in status.splitlines() if line.strip()]
    return TreeState(commit, all(path.startswith(OUTPUT_PATHS) for path in changed))


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="benchmarks/run.py", description=__doc__.splitlines()[0])
    p.add_argument("--suite", default="", metavar="SUITE[,SUITE]",
                   help=f"run only these suites (of: {', '.join(SUITES)}); the other sections keep their "
                        "stored results")
    p.add_argument("--only", default="", metavar="SECTION[,SECTION]",
                   help=f"run only these sections (of: {', '.join(SECTION_ORDER)}), for local work")
    p.add_argument("--quick", action="store_true",
                   help="smoke run: small sizes, output under benchmarks/.cache/quick/, not published")
    p.add_argument("--allow-dirty", action="store_true",
                   help="run on a tree with uncommitted changes; its sections say 'not for publication'")
    p.add_argument("--sessions", type=int, default=None, metavar="N",
                   help="at most N sessions / conversations per section (not the published configuration)")
    p.add_argument("--drafter-sessions", type=int, default=None, metavar="N",
                   help="at most N cases read by the drafter scorers (not the published configuration)")
    p.add_argument("--split", choices=["test", "validation", "train"], default=None,
                   help="data split of benchmarks/training/splits.json (default: test, or validation with "
                        "--quick; publish test only, read once per release; tune on validation)")
    p.add_argument("--reread-test", default="", metavar="WHY",
                   help="read the test split again in a release that already read it (logged with WHY)")
    p.add_argument("--scorers", default="", metavar="NAME[,NAME]",
                   help="quality sections: run only these scorers (not the published configuration)")
    p.add_argument("--data-dir", type=Path, default=None,
                   help="evaluation data (default: ../shared/data relative to the repository)")
    return p.parse_args(argv)


def selected_sections(suites: str, only: str) -> list[str]:
    if suites.strip() and only.strip():
        raise SystemExit("--suite and --only: choose one")
    if suites.strip():
        names = [n.strip() for n in suites.split(",") if n.strip()]
        unknown = [n for n in names if n not in SUITES]
        if unknown:
            raise SystemExit(f"unknown suite(s) {', '.join(unknown)}; known: {', '.join(SUITES)}")
        chosen = {section for n in names for section in SUITES[n]}
        return [s for s in SECTION_ORDER if s in chosen]
    if not only.strip():
        return list(SECTION_ORDER)
    names = [n.strip() for n in only.split(",") if n.strip()]
    unknown = [n for n in names if n not in SECTION_ORDER]
    if unknown:
        raise SystemExit(f"unknown section(s) {', '.join(unknown)}; known: {', '.join(SECTION_ORDER)}")
    return [s for s in SECTION_ORDER if s in names]


def module_exists(name: str) -> bool:
    return importlib.util.find_spec(f"benchmarks.bench_{name}") is not None


def run_section(name: str, ctx: BenchContext) -> tuple[Section, float]:
    started = time.perf_counter()
    try:
        module = importlib.import_module(f"benchmarks.bench_{name}")
        ctx.forget_features()  # every section meets its long outputs cold, as a first request would
        section = module.run(ctx)
        if not isinstance(section, Section):
            raise TypeError(f"bench_{name}.run returned {type(section).__name__}, not Section")
    except Exception as exc:  # one broken section must not lose the others
        traceback.print_exc()
        last = "".join(traceback.format_exception_only(type(exc), exc)).strip().splitlines()[-1]
        section = Section(title=name, markdown=f"**This section failed on its last run:** `{last}`\n")
    return section, time.perf_counter() - started


def quiet_enough(wait_s: float = LOAD_WAIT_S) -> float:
    """The 1-minute load average once it is at or below the core count, waiting up to `wait_s`
    for other work to finish; what it is then, if it never gets there."""
    cores = os.cpu_count() or 1
    deadline = time.monotonic() + wait_s
    while os.getloadavg()[0] > cores and time.monotonic() < deadline:
        time.sleep(5)
    return os.getloadavg()[0]


def release(root: Path = ROOT) -> str:
    """The project's version: the test split is read once per section per release."""
    return str(tomllib.loads((root / "pyproject.toml").read_text(encoding="utf-8"))["project"]["version"])


def test_split_reads() -> list[dict[str, Any]]:
    path = TEST_SPLIT_READS
    return list(json.loads(path.read_text(encoding="utf-8"))["reads"]) if path.is_file() else []


def already_read(names: list[str], version: str) -> list[str]:
    """The test-split readers among `names` that this release has read before."""
    done = {r["section"] for r in test_split_reads() if r.get("release") == version}
    return [n for n in names if n in TEST_SPLIT_READERS and n in done]


def log_test_split_read(name: str, tree: TreeState, version: str, quick: bool = False, why: str = "") -> int:
    """Append this run's read of the test split by section `name`; how many reads it has had."""
    reads = test_split_reads()
    when = dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    entry: dict[str, Any] = {"section": name, "commit": tree.stamp, "at": when, "release": version,
                             "published": False if quick else None}
    if quick:
        entry["quick"] = True
    if why:
        entry["why"] = why
    reads.append(entry)
    TEST_SPLIT_READS.write_text(json.dumps({"reads": reads}, indent=1) + "\n", encoding="utf-8")
    return sum(1 for r in reads if r["section"] == name)


def render_section(name: str, section: Section, command: str, seconds: float, load: float, tree: TreeState,
                   quick: bool = False, test_reads: int | None = None) -> str:
    when = dt.datetime.now().astimezone().strftime("%Y-%m-%d %H:%M %Z")
    cores = os.cpu_count() or 1
    # The load average says whether other work shared the cores: timings depend on it.
    busy = (f" **The load average exceeded the {cores} cores when this section started: its timings "
            "shared the machine.**" if load > cores else "")
    if quick:
        busy += " **A `--quick` smoke run: small inputs, not for publication.**"
    run_line = (f"_Produced by `{command}` at {tree.stamp} on {when}; {machine_line()}; load average "
                f"{load:.2f} when it started; section took {seconds:.0f} s. Model: {section.model}._{busy}")
    if test_reads is not None:
        run_line += (f" This run is read {test_reads} of the frozen test split by this section "
                     "(benchmarks/results/test_split_reads.json lists them all).")
    body = section.markdown.strip()
    missing = [p.name for p in section.plots if f"plots/{p.name}" not in body]
    links = "".join(f"\n\n![{p.stem}](benchmarks/plots/{p.name})" for p in section.plots if p.name in missing)
    return f"<!-- section: {name} -->\n## {section.title}\n\n{run_line}\n\n{body}{links}\n"


def assemble(results_dir: Path, command: str, total_seconds: float, tree: TreeState) -> str:
    when = dt.datetime.now().astimezone().strftime("%Y-%m-%d %H:%M %Z")
    parts = [
        "# Benchmarks\n",
        ("Generated by `make bench` (`benchmarks/run.py`); every number below is reproduced by the "
         "command shown under its section's heading, at the commit it names. Do not edit by hand: "
         "the next run rewrites this file. Suites: " + "; ".join(
             f"`make bench ARGS=\"--suite {n}\"` ({', '.join(s)})" for n, s in SUITES.items())
         + ". `--quick` runs are smoke tests and never land here.\n"),
        f"- Last written: {when}, by `{command}` at {tree.stamp} ({total_seconds:.0f} s)",
        f"- Machine: {machine_line()}",
        "- Data: `../shared/data/` (swe-dev, swe-train, mtrag-un-reference; see its README); published "
        "numbers use the frozen test split of `benchmarks/training/splits.json` only\n",
    ]
    missing: list[str] = []
    for name in SECTION_ORDER:
        stored = results_dir / f"{name}.md"
        text = stored.read_text(encoding="utf-8") if stored.is_file() else ""
        if STAMPED in text:
            parts.append(text.rstrip() + "\n")
        else:  # never run, or run before sections were stamped: nothing to vouch for it
            missing.append(name)
    if missing:
        suite_of = {s: n for n, sections in SUITES.items() for s in sections}
        parts.append("## Not measured at a stamped commit yet\n\n" + "\n".join(
            f"- `{n}`: `make bench ARGS=\"--suite {suite_of[n]}\"`" for n in missing) + "\n")
    return "\n".join(parts)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    args = parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    names = selected_sections(args.suite, args.only)
    tree = tree_state()
    if not tree.clean and not (args.allow_dirty or args.quick):
        print("[bench] the tree has uncommitted changes (outside BENCHMARKS.md and benchmarks/results, "
              "benchmarks/plots): commit them, or pass --allow-dirty for local work (its sections "
              "say 'not for publication')", file=sys.stderr)
        return 2
    split = args.split or ("validation" if args.quick else "test")
    version = release()
    again = already_read(names, version) if split == "test" else []
    if again and not args.reread_test:
        print(f"[bench] release {version} has read the frozen test split for {', '.join(again)} already "
              "(benchmarks/results/test_split_reads.json): tune with --split validation, or give the reason "
              "for a second read with --reread-test WHY (it is logged)", file=sys.stderr)
        return 2
    command = "make bench" + (f" ARGS={shlex.quote(shlex.join(argv))}" if argv else "")
    ctx_kwargs: dict[str, Any] = {"quick": args.quick, "sessions": args.sessions,
                                  "drafter_sessions": args.drafter_sessions, "split": split,
                                  "scorers": tuple(n for n in args.scorers.split(",") if n) or None}
    if args.data_dir is not None:
        ctx_kwargs["data_dir"] = args.data_dir.resolve()
    private = QUICK_DIR if args.quick else (Path(str(SPLIT_DIR).format(split=split)) if split != "test" else None)
    if private is not None:
        ctx_kwargs |= {"results_dir": private / "results", "plots_dir": private / "plots"}
    ctx = BenchContext(**ctx_kwargs)
    output = private / "BENCHMARKS.md" if private is not None else OUTPUT
    started = time.perf_counter()
    for name in ctx.progress(names, "sections"):
        if not module_exists(name):
            print(f"[bench] {name}: benchmarks/bench_{name}.py not written, skipped", file=sys.stderr)
            continue
        load = quiet_enough(0 if args.quick else LOAD_WAIT_S)
        print(f"[bench] {name} (load {load:.2f}) ...", file=sys.stderr, flush=True)
        section, seconds = run_section(name, ctx)
        reads = (log_test_split_read(name, tree, version, args.quick, args.reread_test)
                 if split == "test" and name in TEST_SPLIT_READERS else None)
        (ctx.results_dir / f"{name}.md").write_text(
            render_section(name, section, command, seconds, load, tree, args.quick, reads), encoding="utf-8")
        raw = ctx.results_dir / f"{name}.json"
        if section.raw is not None:
            raw.write_text(json.dumps({"section": name, "commit": tree.stamp, "command": command,
                                       "samples": section.raw}, indent=1) + "\n", encoding="utf-8")
        else:  # a section that kept no samples this time must not leave an older run's behind
            raw.unlink(missing_ok=True)
        print(f"[bench] {name}: {seconds:.1f} s", file=sys.stderr, flush=True)
    output.write_text(assemble(ctx.results_dir, command, time.perf_counter() - started, tree), encoding="utf-8")
    print(f"[bench] wrote {output}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
