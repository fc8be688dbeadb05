"""Training the relevance head (issues 9, 12) on benchmarks.training.head_examples, numpy Adam.

Train on the train split, early-stop on validation retention of gold at a 27 % budget (selection by
mass per token, as serving selects); the test split is never seen. Loss: softmax cross-entropy over
the units of one message, target uniform over its positives. Deterministic: fixed seeds, float64,
fixed order; the same inputs give a byte-identical head file.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Literal

import numpy as np

from benchmarks.training.head_examples import BuildConfig, Dataset, Example, build_dataset, split
from engine.scoring.head import (
    RelevanceHead,
    gelu,
    gelu_grad,
    save_head,
)

BUDGET = 0.27


# --- retention --------------------------------------------------------------------------------------


def retention(scores: Sequence[float], tokens: Sequence[int], items: Sequence[Sequence[int]], ratio: float = BUDGET) -> float:
    """Share of gold items shown when units are chosen as serving chooses them (policies'
    select_units: by score per token, within `ratio` of the message's tokens)."""
    from policies.segmentation import Unit
    from policies.selection import select_units

    units = [Unit(i, i, int(t), "prose") for i, t in enumerate(tokens)]
    kept = set(select_units(units, list(scores), int(sum(int(t) for t in tokens) * ratio)))
    return sum(1 for it in items if kept.intersection(it)) / max(len(items), 1)


def baseline_scores(ds: Dataset, ex: Example, name: str) -> list[float]:
    """Scores the existing scorers would give, from the same cached features."""
    from engine.scoring.drafter import cosines, fuse, to_mass

    m = ds.messages[ex.message]
    toks = [int(t) for t in m.tokens]
    if name == "bm25":
        return [float(s) for s in ex.bm25]
    if name == "embed":
        assert ex.embed_cos is not None, "built without the sentence encoder"
        return to_mass(ex.embed_cos, toks)
    cos = cosines(m.units, ex.query, False)
    if name == "drafter":
        return to_mass(cos, toks)
    density = np.array([s / n if n else 0.0 for s, n in zip(ex.bm25, toks)])
    return to_mass(fuse(density, cos), toks)


# --- the trainer ---------------------------------------------------------------------------------------


@dataclass
class TrainConfig:
    hidden: int = 32
    epochs: int = 40
    patience: int = 8
    lr: float = 5e-4
    weight_decay: float = 1e-3
    batch: int = 8
    seed: int = 0
    budget: float = BUDGET


@dataclass
class TrainResult:
    head: RelevanceHead
    best_epoch: int
    val_retention: float
    history: list[tuple[float, float]]  # (train loss, val retention) per epoch
    seconds: float


def _softmax_ce(s: np.ndarray, labels: np.ndarray, valid: np.ndarray) -> tuple[float, np.ndarray]:
    """Loss and d loss / d s for softmax over valid units, target uniform over positives."""
    s = np.where(valid, s, -np.inf)
    s = s - s[valid].max()
    p = np.exp(s)
    p /= p.sum()
    t = (labels & valid).astype(np.float64)
    t /= t.sum()
    loss = -float((t[t > 0] * np.log(np.maximum(p[t > 0], 1e-300))).sum())
    return loss, p - t


def train(xs: Sequence[np.ndarray], labels: Sequence[np.ndarray], tokens: Sequence[np.ndarray],
          items: Sequence[Sequence[Sequence[int]]], train_idx: Sequence[int], val_idx: Sequence[int],
          cfg: TrainConfig, meta: dict[str, Any], progress: bool = True) -> TrainResult:
    """Fit standardize → Linear → GELU → Linear on per-message feature matrices `xs`.

    `meta`: tap_layer, n_embd, drafter_sha256, drafter_name, encoder_name, encoder_n_embd (copied into
    the head).
    """
    from engine.scoring.drafter import to_mass

    started = time.perf_counter()
    rng = np.random.default_rng(cfg.seed)
    use = [i for i in train_idx if labels[i].any() and (tokens[i] > 0).any()]
    rows = np.concatenate([xs[i] for i in use], axis=0)
    mean = rows.mean(axis=0)
    std = rows.std(axis=0)
    std = np.where(std < 1e-6, 1.0, std)  # constant columns (an absent kind) pass through as 0
    del rows
    z = {i: (xs[i] - mean) / std for i in use}
    f_dim = len(mean)
    params = {
        "w1": rng.normal(0.0, 1.0 / np.sqrt(f_dim), (f_dim, cfg.hidden)),
        "b1": np.zeros(cfg.hidden),
        "w2": rng.normal(0.0, 1.0 / np.sqrt(cfg.hidden), cfg.hidden),
    }
    m1 = {k: np.zeros_like(v) for k, v in params.items()}
    m2 = {k: np.zeros_like(v) for k, v in params.items()}
    beta1, beta2, eps = 0.9, 0.999, 1e-8
    step = 0

    def head_of(p: dict[str, np.ndarray]) -> RelevanceHead:
        return RelevanceHead(mean.copy(), std.copy(), p["w1"].copy(), p["b1"].copy(), p["w2"].copy(), 0.0,
                             int(meta["tap_layer"]), int(meta["n_embd"]), str(meta["drafter_sha256"]),
                             str(meta.get("drafter_name", "")), str(meta.get("encoder_name", "")),
                             int(meta.get("encoder_n_embd", 0)))

    def val_retention(p: dict[str, np.ndarray]) -> float:
        h = head_of(p).as_float32()  # judge the weights as they will be stored
        vals = []
        for i in val_idx:
            if not items[i]:
                continue
            s = h.logits(xs[i])
            vals.append(retention(to_mass(s, [int(t) for t in tokens[i]]), tokens[i], items[i], cfg.budget))
        return float(np.mean(vals)) if vals else 0.0

    best = (-1.0, 0, {k: v.copy() for k, v in params.items()})
    history: list[tuple[float, float]] = []
    bar: Any = None
    if progress:
        try:
            from tqdm import tqdm

            bar = tqdm(total=cfg.epochs, desc="train head", dynamic_ncols=True, file=sys.stderr)
        except ImportError:
            bar = None
    since_best = 0
    for epoch in range(1, cfg.epochs + 1):
        order = rng.permutation(len(use))
        total_loss = 0.0
        for start in range(0, len(order), cfg.batch):
            batch = [use[j] for j in order[start : start + cfg.batch]]
            grads = {k: np.zeros_like(v) for k, v in params.items()}
            for i in batch:
                zi = z[i]
                pre = zi @ params["w1"] + params["b1"]
                h = gelu(pre)
                s = h @ params["w2"]
                loss, ds = _softmax_ce(s, labels[i], tokens[i] > 0)
                total_loss += loss
                ds = ds / len(batch)
                grads["w2"] += h.T @ ds
                gpre = np.outer(ds, params["w2"]) * gelu_grad(pre)
                grads["w1"] += zi.T @ gpre
                grads["b1"] += gpre.sum(axis=0)
            step += 1
            for k, value in params.items():
                g = grads[k] + (cfg.weight_decay * value if k != "b1" else 0.0)
                m1[k] = beta1 * m1[k] + (1 - beta1) * g
                m2[k] = beta2 * m2[k] + (1 - beta2) * g * g
                mh = m1[k] / (1 - beta1**step)
                vh = m2[k] / (1 - beta2**step)
                params[k] = params[k] - cfg.lr * mh / (np.sqrt(vh) + eps)
        ret = val_retention(params)
        history.append((total_loss / max(len(use), 1), ret))
        if ret > best[0]:
            best = (ret, epoch, {k: v.copy() for k, v in params.items()})
            since_best = 0
        else:
            since_best += 1
        if bar is not None:
            bar.update(1)
            bar.set_postfix(loss=f"{history[-1][0]:.3f}", val_ret27=f"{ret:.3f}", best=f"{best[0]:.3f}@{best[1]}")
        if since_best >= cfg.patience:
            break
    if bar is not None:
        bar.close()
    head = head_of(best[2]).as_float32()
    return TrainResult(head, best[1], best[0], history, time.perf_counter() - started)


# --- the command ----------------------------------------------------------------------------------------


def evaluate(ds: Dataset, idx: Sequence[int], head: RelevanceHead, ratios: Sequence[float] = (0.15, 0.27, 0.40)) -> dict[str, dict[str, dict[float, float]]]:
    """Mean retention per source and scorer (head, bm25, embed, drafter, fusion) at each ratio."""
    from engine.scoring.drafter import to_mass

    out: dict[str, dict[str, dict[float, list[float]]]] = {}
    for i in idx:
        ex = ds.examples[i]
        m = ds.messages[ex.message]
        toks = [int(t) for t in m.tokens]
        scored = {"head": to_mass(head.logits(ds.features(ex)), toks)}
        for name in ("bm25", "embed", "drafter", "fusion"):
            scored[name] = baseline_scores(ds, ex, name)
        for src in (ex.source, "all"):
            for name, s in scored.items():
                for r in ratios:
                    out.setdefault(src, {}).setdefault(name, {}).setdefault(r, []).append(retention(s, toks, ex.items, r))
    return {src: {n: {r: float(np.mean(v)) for r, v in d.items()} for n, d in by.items()} for src, by in out.items()}


@dataclass
class HeadRun:
    """One training run: the head, its evaluation on one split and what it cost."""

    head: RelevanceHead
    scores: dict[str, dict[str, dict[float, float]]]  # source -> scorer -> budget -> retention, on `report_split`
    report_split: str  # "validation" (it also chose the epoch) or "test" (never seen by training)
    report_groups: int
    report_examples: int
    notes: list[str]
    extract_seconds: float
    train_seconds: float
    best_epoch: int
    train_groups: int
    val_groups: int
    train_examples: int
    val_examples: int
    units_per_second: float  # head inference over the reported units, features included


def fit_head(data_dir: Path, model_path: Path, encoder_path: Path, *, sessions: int = 40, conversations: int = 60,
             epochs: int = 40, seed: int = 0, layer: int = 8, n_threads: int | None = None,
             cache_dir: Path | None = None, report_split: Literal["validation", "test"] = "validation") -> HeadRun:
    """Build (or load) the features, train with early stopping on validation, and evaluate on
    `report_split`: validation by default; "test" builds the test split's messages apart (the
    benchmark's report), which neither training nor early stopping ever reads."""
    from engine.scoring.drafter import DrafterScorer
    from engine.scoring.embedder import EmbeddingScorer
    from engine.scoring.head import drafter_sha256
    from engine.tokenizer import GgufTokenizer

    started = time.perf_counter()
    sha = drafter_sha256(model_path)
    drafter = DrafterScorer(model_path, layer=layer, n_threads=n_threads)
    encoder = EmbeddingScorer(encoder_path, n_threads=n_threads)
    tok = GgufTokenizer(model_path)
    bcfg = BuildConfig(sessions=sessions, conversations=conversations, seed=seed)
    try:
        ds = build_dataset(data_dir, drafter, encoder, sha, tok.count_tokens, bcfg, cache_dir)
        held_out = (build_dataset(data_dir, drafter, encoder, sha, tok.count_tokens, replace(bcfg, sides=("test",)),
                                  cache_dir)
                    if report_split == "test" else None)
    finally:
        drafter.close()
        encoder.close()
    extract_s = time.perf_counter() - started
    tr, va = split(ds.examples)
    xs = [ds.features(e) for e in ds.examples]
    labels = [e.labels for e in ds.examples]
    tokens = [ds.messages[e.message].tokens for e in ds.examples]
    items = [e.items for e in ds.examples]
    meta = {"tap_layer": drafter.layer, "n_embd": ds.messages[0].units.shape[1], "drafter_sha256": sha,
            "drafter_name": model_path.name, "encoder_name": Path(encoder_path).name,
            "encoder_n_embd": encoder.encoder.n_embd}
    cfg = TrainConfig(epochs=epochs, seed=seed)
    result = train(xs, labels, tokens, items, tr, va, cfg, meta)
    head = result.head
    report, report_idx = (held_out, list(range(len(held_out.examples)))) if held_out is not None else (ds, va)
    timed = time.perf_counter()
    n_units = sum(len(head.logits(report.features(report.examples[i]))) for i in report_idx)
    rate = n_units / max(time.perf_counter() - timed, 1e-9)

    def groups(d: Dataset, ix: Sequence[int]) -> int:
        return len({d.examples[i].group for i in ix})

    val_scores = evaluate(ds, va, head)
    head.info = {
        "seed": seed, "sessions": sessions, "conversations": conversations, "epochs_max": epochs,
        "best_epoch": result.best_epoch, "hidden": cfg.hidden, "train_groups": groups(ds, tr),
        "val_groups": groups(ds, va), "train_examples": len(tr), "val_examples": len(va),
        "val_retention_27": {src: {n: round(v[0.27], 4) for n, v in by.items()} for src, by in val_scores.items()},
    }
    scores = evaluate(report, report_idx, head) if held_out is not None else val_scores
    notes = list(ds.notes) + (list(held_out.notes) if held_out is not None else [])
    return HeadRun(head, scores, report_split, groups(report, report_idx), len(report_idx), notes, extract_s,
                   result.seconds, result.best_epoch, groups(ds, tr), groups(ds, va), len(tr), len(va), rate)


def run_train_head(out: Path, data_dir: Path, model_path: Path, encoder_path: Path, *, sessions: int = 40,
                   conversations: int = 60, epochs: int = 40, seed: int = 0, layer: int = 8,
                   n_threads: int | None = None, cache_dir: Path | None = None) -> int:
    """`python -m benchmarks.train head`: fit, write the head GGUF, read it back, print the evaluation."""
    from engine.scoring.head import drafter_sha256, load_head

    print(f"train head: {sessions} swe-dev sessions + {conversations} MTRAG conversations through drafter "
          f"{model_path.name} layer {layer} and encoder {encoder_path.name}. The first run reads them all through "
          "the drafter (minutes); later runs use the feature cache.", file=sys.stderr)
    try:
        run = fit_head(data_dir, model_path, encoder_path, sessions=sessions, conversations=conversations,
                       epochs=epochs, seed=seed, layer=layer, n_threads=n_threads, cache_dir=cache_dir)
    except FileNotFoundError as exc:
        print(f"train head: {exc}", file=sys.stderr)
        return 2
    for note in run.notes:
        print(f"train head: {note}", file=sys.stderr)
    save_head(run.head, out)
    load_head(out, drafter_sha256(model_path))  # read back: a file that does not load never claims success
    print(f"train head: {run.train_examples} train / {run.val_examples} validation examples ({run.train_groups} / "
          f"{run.val_groups} sessions+conversations); best epoch {run.best_epoch}; {run.head.n_params:,} parameters",
          file=sys.stderr)
    print("held-out retention (selection at the budget, no pipeline fallbacks):", file=sys.stderr)
    for src, by in run.scores.items():
        for name, v in by.items():
            print(f"  {src:5s} {name:7s} " + "  ".join(f"{int(r * 100)} %: {x:.3f}" for r, x in v.items()),
                  file=sys.stderr)
    print(f"train head: features {run.extract_seconds:.0f} s, training {run.train_seconds:.0f} s; wrote {out}",
          file=sys.stderr)
    return 0
