"""`python -m benchmarks.train ranker`: fit the learned ranker's weights (engine/scoring/ranker.py) on real sessions.

Examples are the long outputs the retention benchmark measures (benchmarks.training.agent_data), built from the
train and validation splits of benchmarks/training/splits.json only; the test split is never read. Each output is
segmented and its request found exactly as serving does (gateway.compressor's steps), and a unit is
positive when it shows one of the session's gold lines. The sentence encoder reads every unit and
request once (the meaning features; a few minutes on two cores). Each weight set is fitted on the
outputs of its kind (engine/scoring/ranker.py, policies/transcript.py): unasked transcripts (session logs
with their task; tool outputs with the task alone, which the padding makes transcripts), and the
rest, each once on the lexical features alone and once with meaning. The
fit is checked two ways before the shipped weights are fitted on train and validation together:
weights fitted on train alone, scored on validation; and 5-fold cross-validation by session over
both (each session's outputs held out together). Each reports gold kept at 27 % and 15 % through the planner, against
BM25 on the same outputs. The planner's size exponent (how a unit's size weighs against its probability) is the one
of SIZE_EXPONENTS whose held-out scores keep the most gold over budgets of 10-30 % in the cross-validation, and
ships with the weights.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from engine.scoring.embedder import EmbeddingScorer
from engine.scoring.ranker import ANSWERS_CALL, FEATURES, MEANING_UNIT_TOKENS, SET_FEATURES, UNASKED, WITH_MEANING, RankerWeights, WeightSet, \
    columns_of, fit_weights, load_weights, meaning_candidates, meaning_features, ranker_features
from policies.segmentation import DEFAULT_MAX_SEGMENT, DEFAULT_MIN_SEGMENT, is_tight

DATA_FILES = ("swe-dev.jsonl.zst", "swe-train.jsonl.zst")
TRAIN_SPLITS = ("train", "validation")
L2 = 1.0  # chosen among 0.3 / 1 / 3 by cross-validation over train + validation sessions
CHECK_RATIO = 0.27
LOW_RATIO = 0.15  # the tighter budget issue 40 asks about, reported beside CHECK_RATIO
AT_LOW = f"_at_{int(LOW_RATIO * 100)}"  # the suffix of a result key at LOW_RATIO
FOLDS = 5
# The planner's weighing of a unit's size against its probability (RankerWeights.size_exponent):
# the one keeping most held-out gold over budgets from 10 to 30 % is shipped. Judged over many
# budgets, not two: at one budget a single output kept or lost moves the share by half a point.
SIZE_EXPONENTS = (0.0, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.8, 1.0)
TRIAL_RATIOS = (0.10, 0.12, 0.15, 0.18, 0.21, 0.24, 0.27, 0.30)


@dataclass
class Example:
    split: str
    session: str
    serving: bool  # the request as serving sees it (not the "task alone" variant)
    kind: str  # the weight set that scores it: ANSWERS_CALL or UNASKED
    features: np.ndarray  # FEATURES
    cosine: np.ndarray  # the encoder's, every unit with the request (serving reads the candidates only)
    word_pieces: np.ndarray
    sizes: list[int]  # characters per unit
    labels: np.ndarray
    plan_input: tuple[str, list[int], list[Any], int, tuple[int, int] | None]  # what the planner needs
    output: Any  # the benchmarks.training.agent_data.LongOutput, for its gold lines


def build_examples(data_dir: Path, count: Callable[[str], int], dense: EmbeddingScorer,
                   splits: Sequence[str] = TRAIN_SPLITS, progress: Callable[[str], None] = lambda _: None,
                   keep_share: float = CHECK_RATIO) -> list[Example]:
    """The outputs cut into units as serving cuts them when it keeps `keep_share` of them."""
    from benchmarks.training.agent_data import MARGIN, build_long_outputs, gold_units, load_jsonl_zst, serving_messages
    from benchmarks.training.splits import split_of
    from policies.admission import DEFAULT_THRESHOLD as threshold
    from policies.request_finding import DEFAULT_SCORED_TOKENS as request_tokens
    from policies.request_finding import find_request
    from policies.segmentation import segment
    from policies.transcript import is_unasked_transcript

    paths = [data_dir / name for name in DATA_FILES if (data_dir / name).is_file()]
    if not paths:
        raise FileNotFoundError(f"no session data ({', '.join(DATA_FILES)}) in {data_dir}")
    records = [r for p in paths for r in load_jsonl_zst(p)]
    examples: list[Example] = []
    for split in splits:
        chosen = sorted((r for r in records if split_of("swe", r["id"]) == split), key=lambda r: r["id"])
        for out in build_long_outputs(chosen, chosen, count, int(threshold * MARGIN), 32768, 0):
            lines = out.lines
            line_tokens = [count(x) for x in lines]
            tokens = count(out.text)
            units = segment(lines, line_tokens, DEFAULT_MIN_SEGMENT, DEFAULT_MAX_SEGMENT, is_tight(keep_share))
            texts = ["".join(lines[u.first : u.last + 1]) for u in units]
            labels = np.array(gold_units(out, units), dtype=np.float64)

            variants = [(True, serving_messages(out))]
            if out.kind == "tool_output":
                variants.append((False, serving_messages(out, with_turn=False)))
            for serving, messages in variants:
                request = find_request(messages, len(messages) - 1, count, request_tokens)
                kind = UNASKED if is_unasked_transcript(request.answers_call, lines) else ANSWERS_CALL
                cosine, word_pieces = dense.relevance(texts, request.scored)
                examples.append(Example(split, out.id.split("#")[0], serving, kind, ranker_features(texts, request.scored),
                                        cosine, np.asarray(word_pieces), [len(t) for t in texts], labels,
                                        (out.text, line_tokens, units, tokens, request.pinned_lines), out))
            progress(f"{len(examples)} outputs read")
    return examples


def gold_kept(examples: Sequence[Example], score: Callable[[Example], Sequence[float]],
              ratio: float = CHECK_RATIO, size_exponent: float = 1.0) -> list[float]:
    """Per serving request: the share of its gold lines kept at `ratio` through the planner."""
    from benchmarks.training.agent_data import gold_shown
    from policies.compression import plan_compression

    shares = []
    for e in examples:
        if not e.serving:
            continue
        text, line_tokens, units, tokens, pinned = e.plan_input
        plan = plan_compression(text, line_tokens, list(map(float, score(e))), units, int(tokens * ratio), pinned,
                                size_exponent=size_exponent)
        shares.append(gold_shown(e.output, plan.kept_ranges if plan.compressed else [(0, len(line_tokens) - 1)]))
    return shares


def _mean(values: Sequence[float]) -> float:
    return round(float(np.mean(values)), 4) if len(values) else float("nan")


def with_meaning(e: Example, lexical: WeightSet) -> np.ndarray:
    """FEATURES then DENSE_FEATURES, the encoder's units chosen by `lexical` as serving chooses them."""
    read = meaning_candidates(e.features, lexical, e.sizes)
    return np.hstack([e.features, meaning_features(len(e.labels), read, e.cosine[read], e.word_pieces[read])])


def _fit_sets(examples: Sequence[Example], l2: float = L2) -> dict[str, WeightSet]:
    """Every weight set of SET_FEATURES, each on the outputs of its kind: the lexical sets first,
    then the sets with meaning on the units those choose for the encoder."""
    sets: dict[str, WeightSet] = {}
    for name, names in SET_FEATURES.items():  # lexical sets come first
        kind = name.removesuffix(WITH_MEANING)
        own = [e for e in examples if e.kind == kind]
        if not own:
            raise ValueError(f"no outputs of kind {kind!r} to fit its weights on")
        cols = columns_of(names)
        rows = [with_meaning(e, sets[kind]) if name != kind else e.features for e in own]
        weights, bias = fit_weights([(x[:, cols], e.labels) for x, e in zip(rows, own)], l2)
        sets[name] = WeightSet(names, weights, bias)
    return sets


def _ranker_scores(sets: dict[str, WeightSet], e: Example, meaning: bool = True) -> np.ndarray:
    """The ranker's scores as it serves with the encoder (`meaning`) or without it."""
    if meaning:
        return sets[e.kind + WITH_MEANING].probabilities(with_meaning(e, sets[e.kind]))
    return sets[e.kind].probabilities(e.features)


def _bm25_of(e: Example) -> Sequence[float]:
    return e.features[:, FEATURES.index("bm25_of_best")]  # BM25 over its best: the same order as BM25


SetsOf = Callable[[Example], dict[str, WeightSet]]


@dataclass(frozen=True)
class Cuts:
    """The same outputs cut into units as serving cuts them at CHECK_RATIO and under TIGHT_SHARE
    (shorter units of code, grep and logs under a tight budget: policies.segmentation.unit_limit)."""

    full: list[Example]
    tight: list[Example]

    def at(self, ratio: float) -> list[Example]:
        """The cut serving makes when it keeps `ratio` of an output."""
        return self.tight if is_tight(ratio) else self.full

    def only(self, keep: Callable[[Example], bool]) -> Cuts:
        return Cuts([e for e in self.full if keep(e)], [e for e in self.tight if keep(e)])


def _check(held: Cuts, sets_of: SetsOf, size_exponent: float) -> dict[str, float]:
    """Gold kept by the ranker with meaning, without it (`lexical`) and by BM25 (which serves per
    token) on `held`; by kind too."""
    ranker = lambda e: _ranker_scores(sets_of(e), e)  # noqa: E731
    kept = lambda cuts, ratio=CHECK_RATIO: _mean(gold_kept(cuts.at(ratio), ranker, ratio, size_exponent))  # noqa: E731
    out = {"ranker": kept(held), f"ranker{AT_LOW}": kept(held, LOW_RATIO),
           "ranker_lexical": _mean(gold_kept(held.full, lambda e: _ranker_scores(sets_of(e), e, meaning=False),
                                             size_exponent=size_exponent)),
           "bm25": _mean(gold_kept(held.full, _bm25_of)),
           f"bm25{AT_LOW}": _mean(gold_kept(held.at(LOW_RATIO), _bm25_of, LOW_RATIO))}
    for kind in (ANSWERS_CALL, UNASKED):
        own = held.only(lambda e: e.kind == kind)
        out[f"ranker_{kind}"] = kept(own)
        out[f"ranker_{kind}{AT_LOW}"] = kept(own, LOW_RATIO)
    return out


def fold_of(session: str) -> int:
    from benchmarks.training.agent_data import stable_fraction

    return int(stable_fraction("ranker-fold", session) * FOLDS)


def fold_sets(examples: Sequence[Example], l2: float = L2) -> SetsOf:
    """Each example's weight sets fitted on the other folds' sessions: its scores are held out."""
    fitted = [_fit_sets([e for e in examples if fold_of(e.session) != k], l2) for k in range(FOLDS)]
    return lambda e: fitted[fold_of(e.session)]


def size_exponent_trials(cuts: Cuts, sets_of: SetsOf) -> dict[float, float]:
    """Per exponent of SIZE_EXPONENTS: held-out gold kept, the mean over TRIAL_RATIOS."""
    ranker = lambda e: _ranker_scores(sets_of(e), e)  # noqa: E731
    return {b: _mean([_mean(gold_kept(cuts.at(ratio), ranker, ratio, b)) for ratio in TRIAL_RATIOS])
            for b in SIZE_EXPONENTS}


def best_size_exponent(trials: dict[float, float]) -> float:
    return max(trials, key=lambda b: (trials[b], b))  # a tie goes to the larger: closer to per token


def fit_ranker(data_dir: Path, count: Callable[[str], int], dense: EmbeddingScorer,
               progress: Callable[[str], None] = lambda _: None) -> RankerWeights:
    started = time.perf_counter()
    examples = build_examples(data_dir, count, dense, progress=progress)
    # Weights are fitted on full-size units; tight budgets are checked on the shorter units serving cuts there.
    cuts = Cuts(examples, build_examples(data_dir, count, dense, progress=progress, keep_share=LOW_RATIO))
    train = [e for e in examples if e.split == "train"]
    on_train = _fit_sets(train)
    held_out = fold_sets(examples)
    trials = size_exponent_trials(cuts, held_out)
    exponent = best_size_exponent(trials)
    check = _check(cuts.only(lambda e: e.split == "validation"), lambda e: on_train, exponent)
    info = {"data": list(DATA_FILES), "splits": list(TRAIN_SPLITS), "l2": L2, "encoder": dense.model_path.name,
            "encoder_unit_tokens": dense.max_unit_tokens,
            "sessions": len({e.session for e in examples}), "outputs": sum(e.serving for e in examples), "examples": len(examples),
            "examples_by_set": {kind: sum(e.kind == kind for e in examples) for kind in (ANSWERS_CALL, UNASKED)},
            "units": int(sum(len(e.labels) for e in examples)), "positive_units": int(sum(e.labels.sum() for e in examples)),
            f"validation_gold_kept_{int(CHECK_RATIO * 100)}_fit_on_train": check,
            f"cross_validated_gold_kept_{int(CHECK_RATIO * 100)}": _check(cuts, held_out, exponent),
            "cross_validated_by_size_exponent": {str(b): kept for b, kept in trials.items()},
            "seconds": round(time.perf_counter() - started, 1)}
    return RankerWeights(_fit_sets(examples), info, exponent)


def run_train_ranker(out: Path, data_dir: Path, model_path: Path, encoder_path: Path) -> int:
    """Fit, write the JSON, read it back, print the validation check."""
    from engine.tokenizer import GgufTokenizer

    print(f"train ranker: building outputs from {data_dir} (train and validation splits; tokens counted by "
          f"{model_path.name}; meaning read by {encoder_path.name})", file=sys.stderr)
    dense = EmbeddingScorer(encoder_path, max_unit_tokens=MEANING_UNIT_TOKENS, n_threads=None)  # every core: nothing else runs
    try:
        model = fit_ranker(data_dir, GgufTokenizer(model_path).count_tokens, dense,
                           lambda line: print(f"train ranker: {line}", file=sys.stderr))
    except (FileNotFoundError, ValueError) as exc:
        print(f"train ranker: {exc}", file=sys.stderr)
        return 2
    finally:
        dense.close()
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(model.to_json())
    load_weights(out)  # read back: a file that does not load never claims success
    pct = int(CHECK_RATIO * 100)
    check = model.info[f"validation_gold_kept_{pct}_fit_on_train"]
    cv = model.info[f"cross_validated_gold_kept_{pct}"]
    print(f"train ranker: {model.info['outputs']} outputs, {model.info['units']:,} units "
          f"({model.info['positive_units']} with gold); gold kept at {pct} %: fitted on train alone, validation "
          f"keeps {100 * check['ranker']:.1f} % (without meaning {100 * check['ranker_lexical']:.1f} %, bm25 "
          f"{100 * check['bm25']:.1f} %); {FOLDS}-fold cross-validation by session {100 * cv['ranker']:.1f} % "
          f"(without meaning {100 * cv['ranker_lexical']:.1f} %, bm25 {100 * cv['bm25']:.1f} %; outputs answering a call "
          f"{100 * cv['ranker_' + ANSWERS_CALL]:.1f} %, unasked {100 * cv['ranker_' + UNASKED]:.1f} %; at "
          f"{int(LOW_RATIO * 100)} % {100 * cv[f'ranker_{ANSWERS_CALL}{AT_LOW}']:.1f} % and "
          f"{100 * cv[f'ranker_{UNASKED}{AT_LOW}']:.1f} %); planner's size exponent {model.size_exponent:g}; wrote {out}",
          file=sys.stderr)
    return 0
