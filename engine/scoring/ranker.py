"""The learned ranker (`--scorer ranker`, the default): a logistic model over lexical evidence and,
when the sentence encoder is loaded, over meaning.

BM25 alone scores one unit at a time on one view of the words. What the agent goes on to use shows
in several views at once: the unit's best line as well as its whole text, request terms that are
rare in the message (a function's name) rather than common ones, relevance next door (the body
after a matching `def` line), and line numbers the request cites (`sed -n '130,170p'`, a
traceback's `line 142`) on the unit's numbered lines. Words that differ in form but not in meaning
(`storage limit` against `disk quota exceeded`) share no term: the sentence encoder's cosine of a
unit with the request (its rank, its share of the best, the best next door) adds that view. The
encoder reads the lexically best half of the message (MEANING_SHARE), or all of it when the words
give no evidence: it re-ranks the candidates the words found, at half its price. Each feature
is scale-free within the message (ranks, shares of the message's best), so one set of weights fits
any output of a kind.

Two kinds, two weight sets each (with and without meaning). A tool output whose producing call the
gateway found (`answers_call`) is ranked by what the call and the agent's words ask. A transcript
no call asked for (a pasted session log: policies/transcript.py) has only the task around it;
there the transcript itself shows where attention went: lines it shows more than once (the code
the agent opened again before editing it), numbered lines a later command or traceback cites, and
output of files a later command edits are further features. Weights are fitted by
`python -m benchmarks.train ranker` on the train and validation splits of benchmarks/training/splits.json (gold lines
of real coding sessions) and shipped as JSON, with the exponent the planner weighs a unit's size by
(a probability says whether a unit holds what is needed, not how many lines of it: a longer unit
that does tends to hold more, so units are kept by probability per token**size_exponent, the
exponent chosen by cross-validation). Without the encoder no model is needed (a 30K-token output
scores in milliseconds); with it a 30K-token output costs ~1.7 s on two cores, and each unit's
vector is kept for the recall gate (gateway/background_embedding.py embeds the rest after the turn).
"""

from __future__ import annotations

import itertools
import json
import logging
import math
import re
import threading
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from engine.models.files import SHIPPED_RANKER
from engine.scoring.embedder import EmbedderError, EmbeddingGate, EmbeddingScorer
from engine.scoring.ranks import mean_ranks01
from engine.scoring.scorers import Bm25Scorer, Scorer
from policies.lexical import bm25_of_counts, tokenize_for_search
from policies.line_numbers import line_number, without_line_number
from policies.rendering import split_lines
from policies.transcript import edited_later_lines

SCHEMA = "pflash.ranker"
VERSION = 5
FEATURES: tuple[str, ...] = (
    "bm25_density_rank", "bm25_rank", "bm25_of_best", "line_bm25_of_best", "line_bm25_rank", "rare_terms",
    "term_coverage", "log_terms", "neighbour_bm25", "neighbour_line_bm25", "near_bm25", "cited_line_share",
    "repeated_lines", "around_bm25", "around_line_bm25", "cited_elsewhere", "neighbour_cited_elsewhere", "edited_later",
)
# What only a transcript shows: where its author's attention went (lines shown again, lines its
# own commands or tracebacks cite by number, files it went on to edit) and the stretch of the log
# that is about the task.
TRANSCRIPT_FEATURES = ("repeated_lines", "around_bm25", "around_line_bm25", "cited_elsewhere",
                       "neighbour_cited_elsewhere", "edited_later")
DENSE_FEATURES: tuple[str, ...] = ("dense_rank", "dense_of_best", "neighbour_dense")
ALL_FEATURES = FEATURES + DENSE_FEATURES
# Share of a message's characters, its lexically best units, that the encoder reads while the
# first token waits: 5-fold cross-validation over train + validation sessions kept 92.8 / 93.2 /
# 94.2 / 94.4 / 94.4 % of gold at 27 % reading 0.4 / 0.45 / 0.5 / 0.55 / 0.7 of it, 94.0 % reading
# all (words alone 91.9 %); a 30K-token output costs the encoder ~5 s on two cores read whole.
MEANING_SHARE = 0.5
# Word pieces the encoder reads of each unit it reads (its head names what the unit is about; the
# packaged encoder's default is 128): 5-fold cross-validation kept as much gold reading 96 as 128
# (mean over budgets of 10-30 %: 89.6 against 89.0 %; 64: 89.0 %), and a 30K-token output costs the
# encoder 1.7 s instead of 2.1 s on two cores. Training reads units as serving does.
MEANING_UNIT_TOKENS = 96
ANSWERS_CALL, UNASKED = "answers_call", "unasked"
WITH_MEANING = "+dense"  # a kind's weight set over the lexical and the meaning features
# An output answering a call is not ranked by the transcript features: in training its neighbours
# are other sessions' logs, whose own repeats and citations would teach the weights to prefer them;
# inside one tool output a repeated line is boilerplate (the same warning a hundred times).
_LEXICAL_SETS: dict[str, tuple[str, ...]] = {
    ANSWERS_CALL: tuple(f for f in FEATURES if f not in TRANSCRIPT_FEATURES),
    UNASKED: FEATURES,
}
SET_FEATURES: dict[str, tuple[str, ...]] = {
    **_LEXICAL_SETS, **{kind + WITH_MEANING: names + DENSE_FEATURES for kind, names in _LEXICAL_SETS.items()},
}
EVIDENCE = [FEATURES.index(name) for name in ("bm25_of_best", "line_bm25_of_best", "cited_line_share")]
log = logging.getLogger("pflash.ranker")
RARE_TERMS_CAP = 5  # more rare request terms in one unit say no more
# A request number (2+ digits, or a range); unit lines' numbers come from policies.line_numbers.
_CITED = re.compile(r"(?<![\w.])(\d{2,6})(?:\s*[,-]\s*(\d{2,6}))?")
MAX_CITED_SPAN = 2000  # "1-100000" is not a range of lines anyone reads
REPEAT_MIN_CHARS = 9  # shorter lines (`)`, `else:`, blank) repeat everywhere and say nothing
MAX_SIZE_EXPONENT = 2.0  # beyond it size would outweigh any probability
AROUND_REACH = 3  # units each side: a log's stretch about the task (5-fold CV by session: 3 > 6 > 12)


class RankerError(RuntimeError):
    """A ranker file is missing or malformed; the caller falls back to BM25."""


def _of_best(x: np.ndarray) -> np.ndarray:
    top = float(x.max()) if len(x) else 0.0
    return x / top if top > 0 else np.zeros_like(x)


def _neighbour(x: np.ndarray, reach: int) -> np.ndarray:
    """The best value among the units within `reach` before or after each one (itself excluded)."""
    n = len(x)
    out = np.zeros(n)
    for i in range(n):
        around = np.concatenate([x[max(0, i - reach) : i], x[i + 1 : i + 1 + reach]])
        out[i] = around.max() if len(around) else 0.0
    return out


def cited_spans(request: str) -> list[tuple[int, int]]:
    """Line numbers and ranges the request names (`130,170p`, `130-170`, `line 142`)."""
    spans = []
    for m in _CITED.finditer(request):
        a = int(m.group(1))
        b = int(m.group(2)) if m.group(2) else a
        spans.append((a, b) if a <= b <= a + MAX_CITED_SPAN else (a, a))
    return spans


def _cited_share(numbers: Sequence[int | None], spans: Sequence[tuple[int, int]]) -> float:
    """The share of a unit's lines (their line numbers, None where unnumbered) that `spans` cite."""
    if not spans or not numbers:
        return 0.0
    return sum(1 for v in numbers if v is not None and any(a <= v <= b for a, b in spans)) / len(numbers)


def _repeated_share(unit_lines: Sequence[Sequence[str]]) -> np.ndarray:
    """Per unit: the share of its substantive lines (line-number prefix dropped) that the message
    shows again outside the unit: the same code opened twice."""
    keys = [[k for k in (without_line_number(line).strip() for line in lines) if len(k) >= REPEAT_MIN_CHARS]
            for lines in unit_lines]
    everywhere = Counter(k for ks in keys for k in ks)
    shares = np.zeros(len(keys))
    for i, ks in enumerate(keys):
        if ks:
            here = Counter(ks)
            shares[i] = sum(1 for k in ks if everywhere[k] > here[k]) / len(ks)
    return shares


def _around(x: np.ndarray, reach: int = AROUND_REACH) -> np.ndarray:
    """The mean over each unit and the `reach` units on either side, as a share of the message's best."""
    n = len(x)
    sums = np.concatenate([[0.0], np.cumsum(x)])
    lo, hi = np.clip(np.arange(n) - reach, 0, n), np.clip(np.arange(n) + reach + 1, 0, n)
    return _of_best((sums[hi] - sums[lo]) / (hi - lo))


def _cited_elsewhere(unit_lines: Sequence[Sequence[str]], unit_numbers: Sequence[Sequence[int | None]]) -> np.ndarray:
    """Per unit: the share of its numbered lines (a file view, grep hits) whose number a line
    outside the unit cites: a later `sed -n '1339,1341p'`, a traceback's `line 1339`. Only
    unnumbered lines cite, so a view's own numbers and the code's literals do not."""
    numbers = [[v for v in line_numbers if v is not None] for line_numbers in unit_numbers]
    spans: list[tuple[int, int, int]] = []  # (first, last, citing unit)
    for k, (lines, line_numbers) in enumerate(zip(unit_lines, unit_numbers)):
        for line, v in zip(lines, line_numbers):
            if v is None and any(ch.isdigit() for ch in line):
                spans.extend((a, b, k) for a, b in cited_spans(line))
    shares = np.zeros(len(unit_lines))
    if not spans:
        return shares
    values = np.unique(np.fromiter((v for own in numbers for v in own), dtype=np.int64))
    cover = np.zeros(len(values) + 1, dtype=np.int64)  # how many spans cite each value
    for a, b, _ in spans:
        cover[np.searchsorted(values, a)] += 1
        cover[np.searchsorted(values, b, side="right")] -= 1
    cover = np.cumsum(cover)[:-1]
    by_unit: dict[int, list[tuple[int, int]]] = {}
    for a, b, k in spans:
        by_unit.setdefault(k, []).append((a, b))
    for k, own in enumerate(numbers):
        if own:
            mine = by_unit.get(k, ())
            hits = sum(1 for v in own
                       if cover[np.searchsorted(values, v)] > sum(1 for a, b in mine if a <= v <= b))
            shares[k] = hits / len(own)
    return shares


def _edited_later_share(unit_lines: Sequence[Sequence[str]], bounds: Sequence[tuple[int, int]]) -> np.ndarray:
    """Per unit: the share of its lines shown under a command naming a file a later command edits."""
    marked = edited_later_lines([line for lines in unit_lines for line in lines])
    return np.array([sum(marked[a:b]) / (b - a) for a, b in bounds])


def ranker_features(units: Sequence[str], request: str) -> np.ndarray:
    """One row of FEATURES per unit (see the module doc); pure and deterministic."""
    n = len(units)
    if n == 0:
        return np.zeros((0, len(FEATURES)))
    unit_lines = [split_lines(u) or [""] for u in units]
    bounds = list(itertools.pairwise(itertools.accumulate((len(lines) for lines in unit_lines), initial=0)))
    # Each line tokenized once: a unit's counts are its lines' (no term spans a line break).
    line_terms = [Counter(tokenize_for_search(line)) for lines in unit_lines for line in lines]
    terms = [sum(line_terms[a:b], Counter()) for a, b in bounds]
    sizes = np.array([max(sum(t.values()), 1) for t in terms], dtype=np.float64)
    bm25 = np.array(bm25_of_counts(terms, request), dtype=np.float64)
    line_scores = bm25_of_counts(line_terms, request)
    best_line = np.array([max(line_scores[a:b]) for a, b in bounds])
    asked = set(tokenize_for_search(request))
    df = Counter(t for d in terms for t in d if t in asked)
    rare = {t for t, c in df.items() if c <= max(2, 0.02 * n)}
    idf = {t: math.log(1.0 + n / (c + 0.5)) for t, c in df.items()}
    idf_total = sum(idf.values()) or 1.0
    rare_hits = np.array([min(sum(1 for t in d if t in rare), RARE_TERMS_CAP) / RARE_TERMS_CAP for d in terms])
    coverage = np.array([sum(w for t, w in idf.items() if t in d) / idf_total for d in terms])
    # Each line's number parsed once: the request's citations and the message's own both read it.
    unit_numbers = [[found[0] if (found := line_number(line)) is not None else None for line in lines]
                    for lines in unit_lines]
    spans = cited_spans(request)
    cited = np.array([_cited_share(numbers, spans) for numbers in unit_numbers])
    bm25_best, line_best = _of_best(bm25), _of_best(best_line)
    elsewhere = _cited_elsewhere(unit_lines, unit_numbers)
    columns = [
        mean_ranks01(bm25 / sizes), mean_ranks01(bm25), bm25_best, line_best, mean_ranks01(best_line), rare_hits, coverage,
        np.log(sizes) / 6.0, _neighbour(bm25_best, 1), _neighbour(line_best, 1), _neighbour(bm25_best, 2), cited,
        _repeated_share(unit_lines), _around(bm25_best), _around(line_best), elsewhere, _neighbour(elsewhere, 1),
        _edited_later_share(unit_lines, bounds),
    ]
    return np.stack(columns, axis=1)


def meaning_candidates(x: np.ndarray, lexical: WeightSet, sizes: Sequence[int]) -> np.ndarray:
    """Indices (in message order) of the units the encoder reads: the lexical set's most probable
    units up to MEANING_SHARE of the message's characters, at least one; every unit when the words
    give no evidence, where meaning is all there is to rank by. Outside them the words decide."""
    n = len(sizes)
    if n == 0 or not x[:, EVIDENCE].any():
        return np.arange(n)
    order = np.argsort(-lexical.probabilities(x), kind="stable")
    within = np.cumsum(np.asarray(sizes, dtype=np.float64)[order]) <= MEANING_SHARE * float(sum(sizes))
    within[0] = True
    return np.sort(order[within])


def meaning_features(n_units: int, read: np.ndarray, cosine: np.ndarray, word_pieces: Sequence[int]) -> np.ndarray:
    """One row of DENSE_FEATURES per unit from the encoder's cosine with the request for the units
    it `read`: the cosine's rank among them, its share of their best above their median (the scale
    `to_mass` uses), and the best share next door. Units not read, and blank units (no word
    piece), get no meaning."""
    out = np.zeros((n_units, len(DENSE_FEATURES)))
    c = np.asarray(cosine, dtype=np.float64).copy()
    if len(c) == 0:
        return out
    c[np.asarray(word_pieces) == 0] = -1.0
    median, top = float(np.median(c)), float(c.max())
    out[read, 0] = mean_ranks01(c)
    out[read, 1] = np.clip((c - median) / (top - median), 0.0, None) if top > median else 0.0
    out[:, 2] = _neighbour(out[:, 1], 1)
    return out


def columns_of(names: Sequence[str]) -> list[int]:
    return [ALL_FEATURES.index(name) for name in names]


@dataclass(frozen=True)
class WeightSet:
    """Weights for one kind of output, over the named subset of FEATURES."""

    features: tuple[str, ...]
    weights: np.ndarray  # one per feature
    bias: float

    def probabilities(self, x: np.ndarray) -> np.ndarray:
        """`x` holds the FEATURES columns (then DENSE_FEATURES for a set with meaning); this set reads its own."""
        return 1.0 / (1.0 + np.exp(-(x[:, columns_of(self.features)] @ self.weights + self.bias)))


@dataclass(frozen=True)
class RankerWeights:
    sets: dict[str, WeightSet]  # ANSWERS_CALL and UNASKED
    info: dict[str, Any]
    # The planner keeps units by probability per token**size_exponent (policies/selection.py): a
    # probability says whether a unit holds gold, not how many lines of it. Chosen by the trainer.
    size_exponent: float = 1.0

    def to_json(self) -> str:
        sets = {name: {"features": list(ws.features), "weights": [round(float(w), 6) for w in ws.weights],
                       "bias": round(ws.bias, 6)} for name, ws in self.sets.items()}
        return json.dumps({"schema": SCHEMA, "version": VERSION, "features": list(ALL_FEATURES), "sets": sets,
                           "size_exponent": self.size_exponent, "info": self.info}, indent=1) + "\n"


def _weight_set(path: Path, name: str, doc: Any) -> WeightSet:
    if not isinstance(doc, dict):
        raise RankerError(f"{path} has no {name!r} weight set")
    features = tuple(doc.get("features", ()))
    if not features or any(f not in ALL_FEATURES for f in features):
        raise RankerError(f"{path}: the {name!r} set names unknown features: {list(features)}")
    weights = np.asarray(doc.get("weights", ()), dtype=np.float64)
    bias = doc.get("bias")
    if weights.shape != (len(features),) or not np.isfinite(weights).all() or not isinstance(bias, (int, float)) \
            or not math.isfinite(bias):
        raise RankerError(f"{path} has malformed weights in its {name!r} set")
    return WeightSet(features, weights, float(bias))


def load_weights(path: Path) -> RankerWeights:
    try:
        doc = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise RankerError(f"cannot read ranker {path}: {exc}") from exc
    if not isinstance(doc, dict) or doc.get("schema") != SCHEMA or doc.get("version") != VERSION:
        raise RankerError(f"{path} is not a {SCHEMA} v{VERSION} file")
    if tuple(doc.get("features", ())) != ALL_FEATURES:
        raise RankerError(f"{path} was fitted on other features: {doc.get('features')}")
    sets = doc.get("sets") if isinstance(doc.get("sets"), dict) else {}
    exponent = doc.get("size_exponent", 1.0)  # files written before it was chosen: per token
    if not isinstance(exponent, (int, float)) or isinstance(exponent, bool) or not 0.0 <= exponent <= MAX_SIZE_EXPONENT:
        raise RankerError(f"{path}: size_exponent must be a number in [0, {MAX_SIZE_EXPONENT:g}], got {exponent!r}")
    return RankerWeights({name: _weight_set(path, name, sets.get(name)) for name in SET_FEATURES},
                         dict(doc.get("info") or {}), float(exponent))


def fit_weights(examples: Sequence[tuple[np.ndarray, np.ndarray]], l2: float = 1.0, steps: int = 50) -> tuple[np.ndarray, float]:
    """L2-regularised logistic regression by Newton's method over (features, 0/1 labels) per message."""
    x = np.concatenate([f for f, _ in examples])
    y = np.concatenate([lab for _, lab in examples]).astype(np.float64)
    x1 = np.hstack([x, np.ones((len(x), 1))])
    w = np.zeros(x1.shape[1])
    ridge = l2 * np.eye(len(w)) / len(y)
    ridge[-1, -1] = 0.0  # the bias is not shrunk
    for _ in range(steps):
        p = 1.0 / (1.0 + np.exp(-(x1 @ w)))
        grad = x1.T @ (p - y) / len(y) + ridge @ w
        hess = (x1.T * (p * (1.0 - p))) @ x1 / len(y) + ridge
        step = np.linalg.lstsq(hess, grad, rcond=None)[0]  # singular when a fold has no positive unit
        w -= step
        if float(np.abs(step).max()) < 1e-9:
            break
    return w[:-1], float(w[-1])


@dataclass
class MeaningFailures:
    """Messages a ranker (and its unasked set) ranked by words alone because the encoder failed on
    them (/metrics: pflash_ranker_meaning_failures); compression runs in worker threads."""

    count: int = 0
    lock: threading.Lock = field(default_factory=threading.Lock)

    def add(self) -> None:
        with self.lock:
            self.count += 1


class RankerScorer:
    """Relevance = the fitted probability that a unit holds what the agent needs.

    Scores an output that answers a call; `unasked_scorer` (its bundle's `unasked`) scores
    a transcript no call asked for with the other kind's weights (policies/transcript.py). With
    `dense` (the sentence encoder) and `read_meaning`, units are ranked by the weight set with
    meaning; an encoder error falls back to the lexical set for that call (counted). The recall
    gate asks another scorer (`gate_scorer`): the weights were fitted on what a first compression
    must keep of coding outputs, and a follow-up question is a different query. With `dense` and
    `gate_meaning` the gate fuses the sentence encoder's ranks with BM25's once the units are
    embedded (engine/scoring/embedder.py, EmbeddingGate; compression with meaning embeds them, else
    gateway/background_embedding.py does after the turn), else BM25. The unasked set shares the
    gate: it is asked of the top-level scorer only."""

    name = "ranker"

    def __init__(self, path: Path | None = None, kind: str = ANSWERS_CALL, model: RankerWeights | None = None,
                 dense: EmbeddingScorer | None = None, *, read_meaning: bool = True, gate_meaning: bool = True,
                 failures: MeaningFailures | None = None, gate: Scorer | None = None) -> None:
        self.path = path or SHIPPED_RANKER
        self.model = model or load_weights(self.path)
        self.weights = self.model.sets[kind]
        self.meaning_weights = self.model.sets[kind + WITH_MEANING]
        # `dense` is also where a session's unit vectors are exported and restored (FeatureStore).
        self.dense = dense
        self.meaning = dense if read_meaning else None
        self.meaning_failures = failures or MeaningFailures()
        self.gate_scorer: Scorer = gate or (EmbeddingGate(dense, Bm25Scorer()) if dense is not None and gate_meaning
                                            else Bm25Scorer())
        if kind == ANSWERS_CALL:
            self.unasked_scorer = RankerScorer(self.path, UNASKED, self.model, dense, read_meaning=read_meaning,
                                               failures=self.meaning_failures, gate=self.gate_scorer)

    @property
    def size_exponent(self) -> float:
        """How the planner weighs a unit's size (scorers.size_exponent): the weights file's."""
        return self.model.size_exponent

    def score(self, units: Sequence[str], request: str) -> list[float]:
        x = ranker_features(units, request)
        if self.meaning is not None and request.strip():
            read = meaning_candidates(x, self.weights, [len(u) for u in units])
            try:
                cosine, word_pieces = self.meaning.relevance([units[i] for i in read], request)
            except EmbedderError as exc:
                self.meaning_failures.add()
                log.warning("sentence encoder failed (%s): ranking this message by its words alone", exc)
            else:
                # Meaning ranks even a request sharing no word with the output ("storage limit"
                # against "disk quota exceeded"): then every unit was read.
                full = np.hstack([x, meaning_features(len(units), read, cosine, word_pieces)])
                return [float(v) for v in self.meaning_weights.probabilities(full)]
        if not x[:, EVIDENCE].any():  # no word and no line number in common: length alone would rank
            return [0.0] * len(units)  # all zero: the planner serves the message whole
        return [float(v) for v in self.weights.probabilities(x)]
