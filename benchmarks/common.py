"""What every benchmark section shares: the context (paths, sizes, the model and its tokenizer),
the Section it returns, data loading, scorer construction and small formatting helpers.

Sections never crash the run: missing data or a scorer that will not load becomes a sentence in
the section's markdown.
"""

from __future__ import annotations

import hashlib
import logging
import os
import platform
import statistics
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, TypeVar

ROOT = Path(__file__).resolve().parents[1]
BENCH_DIR = ROOT / "benchmarks"
DEFAULT_DATA_DIR = ROOT.parent / "shared" / "data"  # never copied into the repository

T = TypeVar("T")
GATEWAY_BENCH_MODEL = "Gemma 3 270M Q4_K_M (fast base model, also the drafter)"
FAST_MODEL, SERVED_DEFAULT = "Gemma 3 270M", "Qwen2.5-Coder-0.5B-Instruct"  # as rows name them
BOTH_MODELS = f"{FAST_MODEL} Q4_K_M and {SERVED_DEFAULT} Q4_K_M (the served default)"
NO_SERVED_DEFAULT = f" **{SERVED_DEFAULT} is not installed here: its rows are missing.**"
log = logging.getLogger("pflash.bench")


@dataclass
class Section:
    title: str
    markdown: str  # the section's body (tables, commentary); the runner adds heading and run line
    plots: list[Path] = field(default_factory=list)
    # The model(s) the section ran, named under its heading: most sections measure the gateway,
    # not the model, on the fast one.
    model: str = GATEWAY_BENCH_MODEL
    # Per-sample results (JSON-able), written beside the markdown so its intervals can be recomputed.
    raw: Any = None


@dataclass
class BenchContext:
    quick: bool
    sessions: int | None = None  # cap on sessions / conversations per section (None: section default)
    drafter_sessions: int | None = None  # cap on cases the drafter scorers read (None: section default)
    data_dir: Path = DEFAULT_DATA_DIR
    plots_dir: Path = BENCH_DIR / "plots"
    results_dir: Path = BENCH_DIR / "results"
    cache_dir: Path = BENCH_DIR / ".cache"  # git-ignored: the assembled model lives here
    seed: int = 0
    split: str = "test"  # benchmarks/training/splits.json: published numbers come from test only
    scorers: tuple[str, ...] | None = None  # quality sections: only these scorers (None: all)
    model_path: Path | None = None
    model_error: str | None = None
    _tokenizer: Any = None
    _scorers: dict[str, Any] = field(default_factory=dict)
    _scorer_notes: dict[str, str] = field(default_factory=dict)
    _counters: dict[Path, Callable[[str], int]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        for d in (self.plots_dir, self.results_dir, self.cache_dir):
            d.mkdir(parents=True, exist_ok=True)
        if self.model_path is None and self.model_error is None:
            try:
                from engine.models.parts import GEMMA_3_270M, assemble

                # Gemma 3 270M: these sections measure the gateway, not the model (fast and small).
                self.model_path = assemble(GEMMA_3_270M, self.cache_dir / "models")
            except Exception as exc:  # the sections say so; the run goes on
                self.model_error = str(exc)

    # --- shared resources ------------------------------------------------------------------------

    def served_default(self) -> Path | None:
        """The model `make serve` serves (Qwen2.5-Coder-0.5B-Instruct), for the rows a user of the
        defaults reads; None when it is not installed (the sections say so)."""
        from engine.models.parts import QWEN_CODER_05B, ModelFileError, assemble

        try:
            return assemble(QWEN_CODER_05B, self.cache_dir / "models")
        except (ModelFileError, OSError):
            return None

    @property
    def tokenizer(self) -> Any:
        """The target's vocabulary-only tokenizer (GgufTokenizer), loaded once for all sections."""
        if self._tokenizer is None:
            if self.model_path is None:
                raise RuntimeError(f"no model for the tokenizer: {self.model_error}")
            from engine.tokenizer import GgufTokenizer

            self._tokenizer = GgufTokenizer(self.model_path)
        return self._tokenizer

    def count_tokens(self, text: str) -> int:
        return int(self.tokenizer.count_tokens(text))

    def counter_for(self, model: Path) -> Callable[[str], int]:
        """Counts in `model`'s own vocabulary, loaded once: Qwen counts the same log ~10 % shorter than
        Gemma, so an output sized in Gemma's tokens can fall under the threshold on Qwen."""
        if model == self.model_path:
            return self.count_tokens
        if model not in self._counters:
            from engine.tokenizer import GgufTokenizer

            self._counters[model] = GgufTokenizer(model).count_tokens
        return self._counters[model]

    def data_file(self, name: str) -> Path | None:
        path = self.data_dir / name
        return path if path.is_file() else None

    def scorer(self, name: str) -> Any | None:
        """bm25 | drafter | fusion | head, built once and shared between sections (one drafter model in
        memory: fusion wraps the same DrafterScorer, as gateway/scorer_factory does). None when it
        cannot be built; `scorer_note(name)` says why."""
        if name in self._scorers:
            return self._scorers[name]
        scorer: Any | None = None
        try:
            if name == "bm25":
                from engine.scoring.scorers import Bm25Scorer

                scorer = Bm25Scorer()
            elif name == "ranker":  # as it serves: meaning read by the sentence encoder when one loads
                from engine.scoring.ranker import MEANING_UNIT_TOKENS, RankerScorer

                try:
                    # Its own encoder: the embed rows' unit cache must stay theirs (cold compressions).
                    scorer = RankerScorer(dense=self._sentence_encoder(MEANING_UNIT_TOKENS))
                except Exception as exc:  # noqa: BLE001 - as the gateway does: lexical weights, BM25 gate
                    self._scorer_notes["ranker"] = f"words alone: the sentence encoder did not load ({exc})"
                    scorer = RankerScorer()
            elif name == "ranker-words":  # the ranker without an encoder (ranker_embedder off, or no encoder)
                from engine.scoring.ranker import RankerScorer

                scorer = RankerScorer()
            elif name in ("embed", "hybrid"):
                from engine.scoring.fusion import FusionScorer

                dense = self._scorers.get("embed") if name == "hybrid" else None
                if dense is None:
                    dense = self._sentence_encoder()
                    self._scorers["embed"] = dense
                scorer = FusionScorer(dense, name="hybrid") if name == "hybrid" else dense
            elif name in ("drafter", "fusion"):
                if self.model_path is None:
                    raise RuntimeError(f"no model: {self.model_error}")
                from engine.scoring.drafter import DrafterScorer
                from engine.scoring.fusion import FusionScorer

                drafter = self.scorer("drafter") if name == "fusion" else None
                if name == "fusion" and drafter is None:
                    raise RuntimeError(self._scorer_notes.get("drafter", "drafter unavailable"))
                scorer = FusionScorer(drafter) if name == "fusion" else DrafterScorer(self.model_path)
            elif name == "head":  # the shipped learned head on the shared drafter instance
                from engine.scoring.head import (
                    SHIPPED_HEAD,
                    HeadScorer,
                    drafter_sha256,
                    load_head,
                )

                drafter = self.scorer("drafter")
                if drafter is None or self.model_path is None:
                    raise RuntimeError(self._scorer_notes.get("drafter", "drafter unavailable"))
                encoder = self.scorer("embed")  # the shared encoder, as hybrid shares it
                if encoder is None:
                    raise RuntimeError(self._scorer_notes.get("embed", "sentence encoder unavailable"))
                scorer = HeadScorer(load_head(SHIPPED_HEAD, drafter_sha256(self.model_path)), drafter, encoder)
            else:
                raise ValueError(f"unknown scorer {name!r}")
        except Exception as exc:
            self._scorer_notes[name] = f"{type(exc).__name__}: {exc}".splitlines()[0][:200]
            scorer = None
        self._scorers[name] = scorer
        return scorer

    def runs(self, scorer: str) -> bool:
        """Whether a quality section runs this scorer (`--scorers`)."""
        return self.scorers is None or scorer in self.scorers

    def forget_features(self) -> None:
        """Empty the unit caches of the shared models (encoder, drafter): sections share one model in
        memory but must not share what it read, or a later section would time warm scoring as cold."""
        for scorer in self._scorers.values():
            # The ranker's encoder is its own (`dense`), not one of the shared models.
            forget = getattr(scorer, "forget_features", None) or getattr(getattr(scorer, "dense", None), "forget_features", None)
            if forget is not None:
                forget()

    def _sentence_encoder(self, unit_tokens: int | None = None) -> Any:
        """A new EmbeddingScorer on the packaged encoder, converted into the cache once, reading
        `unit_tokens` word pieces of a unit (the encoder's default when None)."""
        from engine.scoring.embedder import DEFAULT_UNIT_TOKENS, EmbeddingScorer
        from engine.models.embedder_convert import embedder_path

        return EmbeddingScorer(embedder_path(None, self.cache_dir / "models"), max_unit_tokens=unit_tokens or DEFAULT_UNIT_TOKENS)

    def scorer_note(self, name: str) -> str:
        return self._scorer_notes.get(name, "")

    # --- output helpers --------------------------------------------------------------------------

    def plot_path(self, name: str) -> Path:
        return self.plots_dir / name

    def progress(self, items: Iterable[T], desc: str, total: int | None = None) -> Iterable[T]:
        try:
            from tqdm import tqdm

            return tqdm(items, desc=desc, total=total, leave=False, dynamic_ncols=True)
        except ImportError:  # progress bars are a comfort, not a requirement
            return items


# --- data ----------------------------------------------------------------------------------------


def coding_sessions(ctx: BenchContext, title: str) -> list[dict[str, Any]] | Section:
    """The swe-dev sessions a timed section stitches its histories from, or the Section saying
    why it cannot run (no model, no data)."""
    if ctx.model_path is None:
        return Section(title, f"Skipped: no model ({ctx.model_error}).")
    data = ctx.data_file("swe-dev.jsonl.zst")
    if data is None:
        return Section(title, "Skipped: ../shared/data/swe-dev.jsonl.zst is missing.")
    return load_jsonl_zst(data)


# One loader and one seeded fraction for benchmarks and `benchmarks.train head` alike (benchmarks.training.agent_data).
from benchmarks.training.agent_data import load_jsonl_zst, stable_fraction  # noqa: E402,F401


def window_around(tokens: Sequence[int], hit: int, depth: float, cap: int) -> tuple[int, int]:
    """[start, end) of a window of at most `cap` tokens holding line `hit`, with about `depth`
    (0..1) of the window before it: long logs are cut to the part with the evidence, the evidence
    at a chosen depth rather than always at an edge."""
    start, before = hit, 0
    while start > 0 and before + tokens[start - 1] <= depth * cap:
        start -= 1
        before += tokens[start]
    end, total = start, 0
    while end < len(tokens) and total + tokens[end] <= cap:
        total += tokens[end]
        end += 1
    return start, end


# --- scoring -------------------------------------------------------------------------------------


class MemoScorer:
    """Wraps a scorer so identical (units, request) calls are answered from memory.

    Scores do not depend on the budget or on θ, so sweeping those re-uses one scoring pass; the
    first (real) call's time is what the sections report.
    """

    def __init__(self, inner: Any) -> None:
        from engine.scoring.scorers import size_exponent

        self.inner = inner
        self.name: str = inner.name
        self.size_exponent = size_exponent(inner)  # the planner weighs units as it would for the scorer itself
        self._memo: dict[str, Any] = {}

    @staticmethod
    def _key(units: Sequence[str], request: str) -> str:
        h = hashlib.sha256()
        for text in (request, *units):
            h.update(text.encode("utf-8", "surrogatepass"))
            h.update(b"\x00")
        return h.hexdigest()

    def remembered(self, units: Sequence[str], request: str, compute: Any) -> Any:
        key = self._key(units, request)
        if key not in self._memo:
            self._memo[key] = compute(units, request)
        return self._memo[key]

    def score(self, units: Sequence[str], request: str) -> list[float]:
        return list(self.remembered(units, request, self.inner.score))

    def clear(self) -> None:
        self._memo.clear()


class MemoBundle:
    """A scorer's bundle (engine/scoring/bundle.py) with every scoring role memoised: `bundle` is
    what a compressor or recall gate is given, `inner` what the scorer itself offers."""

    def __init__(self, inner: Any) -> None:
        from engine.scoring.bundle import ScorerBundle

        self.inner: ScorerBundle = inner
        self.name = inner.name
        compress, unasked, gate, split = (MemoScorer(s) for s in (inner.compress, inner.unasked, inner.gate, inner.gate))
        self._memos = [compress, unasked, gate, split]
        readings = inner.gate_readings  # the gate's two readings, as serving asks for them
        self.bundle = replace(inner, compress=compress, unasked=unasked, gate=gate,
                              gate_readings=None if readings is None else
                              (lambda units, request: split.remembered(units, request, readings)))

    def clear(self) -> None:
        for memo in self._memos:
            memo.clear()


class TokenCountCache:
    """A token counter that can answer repeated texts from memory once `warm` is set.

    The first pass over a case runs cold (what the gateway pays: it keeps no per-line counts
    between calls); budget and θ sweeps that re-run the same texts then turn it warm, so they
    cost what they measure rather than repeated tokenizing.
    """

    def __init__(self, count: Any) -> None:
        self._count = count
        self._memo: dict[str, int] = {}
        self.warm = False

    def __call__(self, text: str) -> int:
        if self.warm:
            n = self._memo.get(text)
            if n is not None:
                return n
        n = self._memo[text] = int(self._count(text))
        return n


def default_compression_settings() -> Any:
    """The shipped defaults (Settings' field defaults, not the environment: a benchmark must not
    change because PFLASH_* happens to be set in the shell)."""
    from gateway.compressor import CompressionSettings
    from gateway.config import Settings

    f = Settings.model_fields
    return CompressionSettings(
        threshold=f["threshold"].default,
        budget_curve=f["budget_curve"].default,
        min_segment=f["min_segment"].default,
        max_segment=f["max_segment"].default,
        request_tokens=f["request_tokens"].default,
        fallback_spread=f["fallback_spread"].default,
        recall_theta=f["recall_theta"].default,
        recall_budget=f["recall_budget"].default,
        recall_context=f["recall_context"].default,
    )


# --- formatting ----------------------------------------------------------------------------------


def md_table(headers: Sequence[str], rows: Sequence[Sequence[object]], align: str | None = None) -> str:
    """A GitHub markdown table; `align` is one of l/r per column (default: first left, rest right)."""
    align = align or ("l" + "r" * (len(headers) - 1))
    sep = ["---:" if a == "r" else "---" for a in align]
    lines = ["| " + " | ".join(map(str, headers)) + " |", "| " + " | ".join(sep) + " |"]
    lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return "\n".join(lines) + "\n"


def pct(x: float | None, digits: int = 1) -> str:
    return "n/a" if x is None else f"{100 * x:.{digits}f} %"


def spread(values: Sequence[float], digits: int = 2) -> str:
    """A repeated timing as `median (min–max)`; a single sample is shown alone."""
    if not values:
        return "n/a"
    med = statistics.median(values)
    if len(values) == 1:
        return f"{med:.{digits}f}"
    return f"{med:.{digits}f} ({min(values):.{digits}f}–{max(values):.{digits}f})"


def mean(values: Sequence[float]) -> float | None:
    return sum(values) / len(values) if values else None


def machine_info() -> dict[str, str]:
    """Cores and CPU model from /proc/cpuinfo (what the numbers depend on), memory, versions."""
    cpu = platform.processor() or "unknown"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.lower().startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    mem = "unknown"
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                mem = f"{int(line.split()[1]) / 1024 / 1024:.1f} GiB"
                break
    except OSError:
        pass
    try:
        import llama_cpp

        llama_version = str(llama_cpp.__version__)
    except Exception:
        llama_version = "not installed"
    return {
        "cpu": cpu,
        "cores": str(os.cpu_count() or "?"),
        "memory": mem,
        "python": platform.python_version(),
        "llama_cpp_python": llama_version,
        "os": f"{platform.system()} {platform.release()}",
    }


def machine_line() -> str:
    m = machine_info()
    return (f"{m['cores']} cores, {m['cpu']}, {m['memory']} RAM, Python {m['python']}, "
            f"llama-cpp-python {m['llama_cpp_python']}")


def plot_repeated(ax: Any, xs: Sequence[float], repeated: Sequence[Sequence[float]], label: str) -> None:
    """One line of medians with min–max bars: a repeated timing per x."""
    med = [statistics.median(v) for v in repeated]
    ax.errorbar(xs, med, yerr=[[m - min(v) for m, v in zip(med, repeated)], [max(v) - m for m, v in zip(med, repeated)]],
                fmt="o-", capsize=3, label=label)


def savefig(fig: Any, path: Path) -> Path:
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    import matplotlib.pyplot as plt

    plt.close(fig)
    return path


def pyplot() -> Any:
    """matplotlib's pyplot on the file-only backend (no display on a build machine)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt
