"""Training the relevance head (issues 9, 12): labelled examples from ../shared/data, numpy Adam.

Examples (one per (message, request)), built by engine.agent_data (part of the package: no
`benchmarks/` import) from the train and validation splits of engine/splits.json only:
- coding sessions (swe-dev + swe-train): one real evidence-bearing tool output per session,
  padded with same-repository outputs (~3K tokens), segmented as serving does; positives are
  units holding a gold line or a line the agent went on to use (weak labels); the request is what
  the serving request finder makes of the agent's asking turn and the task.
- MTRAG: per conversation, one long "tool output" of its gold passages among on-topic distractors
  (passages of other conversations of the same collection); each turn with gold passages is one
  example, request = that turn's question, positives = units of its gold passages.

Train on the train split, early-stop on validation retention of gold at a 27 % budget (selection by
mass per token, as serving selects); the test split is never seen. Loss: softmax cross-entropy over
the units of one message, target uniform over its positives. Deterministic: fixed seeds, float64,
fixed order; the same inputs give a byte-identical head file.

Drafter reads are the costly part: the per-unit vectors and request vectors are cached under the
cache directory, keyed by a hash of the data files, the drafter file and the build parameters. The
sentence encoder's cosines (a head feature since issue 12) are read again on every build: its units
are clipped to 128 word pieces, so a build costs it well under a minute.
"""

from __future__ import annotations

import pickle
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Literal

import numpy as np

from engine.head import (
    RelevanceHead,
    data_digest,
    gelu,
    gelu_grad,
    head_features,
    save_head,
)

CACHE_VERSION = "head-features-v2"
BUDGET = 0.27


# --- examples -------------------------------------------------------------------------------------


@dataclass
class Message:
    """One long message, read once: per-unit drafter vectors and text features."""

    units: np.ndarray  # (n, d) float32 pooled hidden states
    tokens: np.ndarray  # (n,) int
    kinds: list[str]


@dataclass
class Example:
    group: str  # session or conversation id: the split key
    source: str  # "swe" | "mtrag"
    message: int  # index into the dataset's messages
    query: np.ndarray  # (d,) float32
    bm25: np.ndarray  # (n,)
    labels: np.ndarray  # (n,) bool: units holding evidence
    items: list[list[int]]  # per gold item (line, passage): the units that show it
    embed_cos: np.ndarray | None = None  # (n,) the sentence encoder's cosine with the request (not cached)


@dataclass
class Dataset:
    messages: list[Message]
    examples: list[Example]
    notes: list[str] = field(default_factory=list)

    def features(self, ex: Example) -> np.ndarray:
        m = self.messages[ex.message]
        assert ex.embed_cos is not None, "built without the sentence encoder"
        return head_features(m.units, ex.query, ex.bm25, m.tokens, m.kinds, ex.embed_cos)


def split(examples: Sequence[Example]) -> tuple[list[int], list[int]]:
    """(train, validation) example indices from the frozen split (engine/splits.json): whole
    sessions and conversations on one side; the test split is never built into examples."""
    from engine.splits import split_of

    def side(group: str) -> str | None:
        kind, _, key = group.partition(":")
        return split_of("swe" if kind == "swe" else "mtrag", key)

    train = [i for i, e in enumerate(examples) if side(e.group) == "train"]
    val = [i for i, e in enumerate(examples) if side(e.group) == "validation"]
    return train, val


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
    from engine.drafter import cosines, fuse, to_mass

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
    from engine.drafter import to_mass

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

            bar = tqdm(total=cfg.epochs, desc="train-head", dynamic_ncols=True, file=sys.stderr)
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


# --- building the dataset from ../shared/data (needs the drafter) -------------------------------------


@dataclass
class BuildConfig:
    sessions: int = 40
    conversations: int = 60
    swe_tokens: int = 3072
    mtrag_tokens: int = 3072
    seed: int = 0
    min_segment: int = 32
    max_segment: int = 512
    request_tokens: int = 128
    # The frozen splits examples come from: training reads train and validation only; the
    # benchmark builds the test split apart, to report on it.
    sides: tuple[str, ...] = ("train", "validation")

    def takes(self, kind: str, key: str) -> bool:
        from engine.splits import split_of

        return split_of(kind, key) in self.sides  # type: ignore[arg-type]


def _request(messages: Sequence[Any], count: Callable[[str], int], limit: int) -> str:
    """What the serving request finder ranks the last message (a tool output) against."""
    from policies.request_finding import find_request

    return find_request(messages, len(messages) - 1, count, limit).scored


def _swe_messages(records: list[dict[str, Any]], cfg: BuildConfig, count: Callable[[str], int]) -> list[dict[str, Any]]:
    """One real evidence-bearing tool output per session (of the splits `cfg.sides`), padded with
    same-repository outputs; the request is the agent's own asking turn (thought + command) and
    the task, as serving reads it. Positives: units with a gold line or a line the agent went on
    to use (weak labels, engine.agent_data.used_later); retention is measured on gold alone."""
    import json as _json

    from engine.agent_data import build_long_outputs, gold_key, stable_fraction
    from policies.conversation import Message as Msg, ToolCall
    from policies.segmentation import segment

    usable = [r for r in records if cfg.takes("swe", r["id"])]
    picked = sorted(usable, key=lambda r: stable_fraction(cfg.seed, r["id"], "head-pick"))[: cfg.sessions]
    out = []
    for case in build_long_outputs(picked, usable, count, cfg.swe_tokens, cfg.swe_tokens, cfg.seed, ("tool_output",)):
        line_tokens = [count(x) for x in case.lines]
        units = segment(case.lines, line_tokens, cfg.min_segment, cfg.max_segment)
        texts = ["".join(case.lines[u.first : u.last + 1]) for u in units]
        items = []
        for g in sorted(case.gold):
            hit = [k for k, u in enumerate(units)
                   if any(case.own[i] and gold_key(case.lines[i]) == g for i in range(u.first, u.last + 1))]
            if hit:
                items.append(hit)
        weak = [k for k, u in enumerate(units) if any(case.weak[u.first : u.last + 1])]
        messages = [Msg("user", case.task),
                    Msg("assistant", case.thought, (ToolCall("call_0", "bash", _json.dumps({"command": case.command})),)),
                    Msg("tool", case.text, tool_call_id="call_0", name="bash")]
        if items:
            out.append({"group": f"swe:{case.id.split('#')[0]}", "source": "swe", "units": texts,
                        "kinds": [u.kind for u in units], "weak": weak,
                        "turns": [(_request(messages, count, cfg.request_tokens), items)]})
    return out


def _clean(text: str) -> str:
    lines = [ln.rstrip() for ln in text.strip().splitlines()]
    out: list[str] = []
    for ln in lines:  # collapse runs of blank lines: a passage stays one or few paragraphs
        if ln or (out and out[-1]):
            out.append(ln)
    return "\n".join(out) + "\n"


def _mtrag_messages(records: list[dict[str, Any]], cfg: BuildConfig, count: Callable[[str], int]) -> list[dict[str, Any]]:
    from engine.agent_data import stable_fraction
    from policies.conversation import Message as Msg, ToolCall
    from policies.rendering import split_lines
    from policies.segmentation import segment

    passages: dict[str, dict[str, str]] = {}  # collection -> doc id -> text
    convs: dict[str, list[dict[str, Any]]] = {}
    for r in records:
        for c in r.get("contexts") or []:
            passages.setdefault(r["Collection"], {})[c["document_id"]] = _clean(c["text"])
        convs.setdefault(r["conversation_id"], []).append(r)
    usable = [cid for cid, rs in convs.items() if any(r.get("contexts") for r in rs) and cfg.takes("mtrag", cid)]
    chosen = sorted(usable, key=lambda cid: stable_fraction(cfg.seed, cid, "head-pick"))[: cfg.conversations]
    out = []
    for cid in chosen:
        turns = sorted(convs[cid], key=lambda r: int(r["turn"]))
        coll = turns[0]["Collection"]
        gold = sorted({c["document_id"] for r in turns for c in r.get("contexts") or []})
        docs = list(gold)
        size = sum(count(passages[coll][d]) for d in docs)
        others = sorted((d for d in passages[coll] if d not in set(gold)),
                        key=lambda d: stable_fraction(cfg.seed, cid, d, "distractor"))
        for d in others:  # on-topic distractors: same collection, other conversations
            if size >= cfg.mtrag_tokens:
                break
            docs.append(d)
            size += count(passages[coll][d])
        docs.sort(key=lambda d: stable_fraction(cfg.seed, cid, d, "order"))
        lines: list[str] = []
        span: dict[str, tuple[int, int]] = {}
        for d in docs:
            body = split_lines(passages[coll][d])
            span[d] = (len(lines), len(lines) + len(body) - 1)
            lines.extend(body)
            lines.append("\n")  # a blank line between passages
        line_tokens = [count(x) for x in lines]
        units = segment(lines, line_tokens, cfg.min_segment, cfg.max_segment)
        texts = ["".join(lines[u.first : u.last + 1]) for u in units]
        text = "".join(lines)
        examples = []
        for r in turns:
            ctx = sorted({c["document_id"] for c in r.get("contexts") or []})
            question = next((m["text"] for m in reversed(r["input"]) if m["speaker"] == "user"), "")
            if not ctx or not question.strip():
                continue
            items = [[k for k, u in enumerate(units) if u.first <= span[d][1] and u.last >= span[d][0]] for d in ctx]
            items = [it for it in items if it]
            if items:
                messages = [Msg("user", question), Msg("tool", text, tool_call_id="call_0", name="search")]
                examples.append((_request(messages, count, cfg.request_tokens), items))
        if examples:
            out.append({"group": f"mtrag:{cid}", "source": "mtrag", "units": texts,
                        "kinds": [u.kind for u in units], "turns": examples})
    return out


def build_dataset(data_dir: Path, drafter: Any, encoder: Any, drafter_sha: str, count: Callable[[str], int],
                  cfg: BuildConfig, cache_dir: Path | None, progress: bool = True) -> Dataset:
    """Read every message's units and requests through the drafter and the sentence encoder.

    Each message is read with an empty feature cache, so its vectors depend on it alone (not on
    which messages came before), and its reads are cached on disk one file per message under
    `cache_dir/head-features/<key>/`: an interrupted or resized run keeps what it read.
    """
    from engine.agent_data import load_jsonl_zst
    from engine.head import drafter_features
    from policies.lexical import bm25_scores

    swe_paths = [data_dir / "swe-dev.jsonl.zst", data_dir / "swe-train.jsonl.zst"]
    mtrag_path = data_dir / "mtrag-un-reference.jsonl.zst"
    present = [p for p in (*swe_paths, mtrag_path) if p.is_file()]
    if not present:
        raise FileNotFoundError(f"no training data in {data_dir} (see ../shared/data/README.md)")
    # The folder is keyed by the data files and the drafter; each file by its message's content.
    key = data_digest(CACHE_VERSION, drafter_sha, str(drafter.layer), str(drafter.window),
                      *(p.name + ":" + data_digest(p.read_bytes()) for p in present))
    folder = cache_dir / "head-features" / key[:20] if cache_dir else None
    specs: list[dict[str, Any]] = []
    swe_records = [r for p in swe_paths if p.is_file() for r in load_jsonl_zst(p)]
    if swe_records:
        specs += _swe_messages(swe_records, cfg, count)
    if mtrag_path.is_file():
        specs += _mtrag_messages(load_jsonl_zst(mtrag_path), cfg, count)
    n_tok, n_read, cached = 0, 0, 0
    started = time.perf_counter()
    messages: list[Message] = []
    examples: list[Example] = []
    it: Any = specs
    if progress:
        try:
            from tqdm import tqdm

            it = tqdm(specs, desc="drafter reads", dynamic_ncols=True, file=sys.stderr)
        except ImportError:
            pass
    for spec in it:
        # Keyed by the message's content: a resized or re-seeded build never reuses a stale read.
        content = data_digest(spec["group"], *spec["units"], *spec["kinds"], *(r for r, _ in spec["turns"]),
                              repr([items for _, items in spec["turns"]]))
        file = folder / (content[:24] + ".pkl") if folder else None
        if file is not None and file.is_file():
            with file.open("rb") as fh:
                msg, exs = pickle.load(fh)
            cached += 1
        else:
            drafter.forget_features()  # this message alone
            msg, exs = None, []
            for request, items in spec["turns"]:
                feats, query, n_tokens = drafter_features(drafter, spec["units"], request)
                if msg is None:
                    msg = Message(feats.astype(np.float32), np.asarray(n_tokens, dtype=np.int64), spec["kinds"])
                labels = np.zeros(len(spec["units"]), dtype=bool)
                for unit_ids in items:
                    labels[unit_ids] = True
                labels[spec.get("weak", [])] = True  # weak labels train; gold items measure
                exs.append(Example(spec["group"], spec["source"], -1, query.astype(np.float32),
                                   np.asarray(bm25_scores(spec["units"], request)), labels, items))
            n_read += 1
            n_tok += int(msg.tokens.sum()) if msg is not None else 0
            if file is not None:
                file.parent.mkdir(parents=True, exist_ok=True)
                tmp = file.with_suffix(".tmp")
                with tmp.open("wb") as fh:
                    pickle.dump((msg, exs), fh, protocol=4)
                tmp.replace(file)
        messages.append(msg)
        for ex, (request, _) in zip(exs, spec["turns"]):
            ex.message = len(messages) - 1
            ex.embed_cos = encoder.relevance(spec["units"], request)[0]
            examples.append(ex)
    notes = [(f"{len(messages)} messages, {len(examples)} requests: {cached} from the feature cache, {n_read} read "
              f"through the drafter ({n_tok:,} tokens) in {time.perf_counter() - started:.0f} s")]
    return Dataset(messages, examples, notes)


# --- the command ----------------------------------------------------------------------------------------


def evaluate(ds: Dataset, idx: Sequence[int], head: RelevanceHead, ratios: Sequence[float] = (0.15, 0.27, 0.40)) -> dict[str, dict[str, dict[float, float]]]:
    """Mean retention per source and scorer (head, bm25, embed, drafter, fusion) at each ratio."""
    from engine.drafter import to_mass

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
    from engine.drafter import DrafterScorer
    from engine.embedder import EmbeddingScorer
    from engine.head import drafter_sha256
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
    """`pflash-gateway train-head`: fit, write the head GGUF, read it back, print the evaluation."""
    from engine.head import drafter_sha256, load_head

    print(f"train-head: {sessions} swe-dev sessions + {conversations} MTRAG conversations through drafter "
          f"{model_path.name} layer {layer} and encoder {encoder_path.name}. The first run reads them all through "
          "the drafter (minutes); later runs use the feature cache.", file=sys.stderr)
    try:
        run = fit_head(data_dir, model_path, encoder_path, sessions=sessions, conversations=conversations,
                       epochs=epochs, seed=seed, layer=layer, n_threads=n_threads, cache_dir=cache_dir)
    except FileNotFoundError as exc:
        print(f"pflash-gateway train-head: {exc}", file=sys.stderr)
        return 2
    for note in run.notes:
        print(f"train-head: {note}", file=sys.stderr)
    save_head(run.head, out)
    load_head(out, drafter_sha256(model_path))  # read back: a file that does not load never claims success
    print(f"train-head: {run.train_examples} train / {run.val_examples} validation examples ({run.train_groups} / "
          f"{run.val_groups} sessions+conversations); best epoch {run.best_epoch}; {run.head.n_params:,} parameters",
          file=sys.stderr)
    print("held-out retention (selection at the budget, no pipeline fallbacks):", file=sys.stderr)
    for src, by in run.scores.items():
        for name, v in by.items():
            print(f"  {src:5s} {name:7s} " + "  ".join(f"{int(r * 100)} %: {x:.3f}" for r, x in v.items()),
                  file=sys.stderr)
    print(f"train-head: features {run.extract_seconds:.0f} s, training {run.train_seconds:.0f} s; wrote {out}",
          file=sys.stderr)
    return 0
