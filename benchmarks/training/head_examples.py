"""Labelled examples for the relevance head from ../shared/data (train and validation splits only).

- coding sessions (swe-dev + swe-train): one real evidence-bearing tool output per session,
  padded with same-repository outputs (~3K tokens), segmented as serving does; positives are
  units holding a gold line or a line the agent went on to use (weak labels); the request is what
  the serving request finder makes of the agent's asking turn and the task.
- MTRAG: per conversation, one long "tool output" of its gold passages among on-topic distractors
  (passages of other conversations of the same collection); each turn with gold passages is one
  example, request = that turn's question, positives = units of its gold passages.

Drafter reads are the costly part: the per-unit vectors and request vectors are cached under the
cache directory, keyed by a hash of the data files, the drafter file and the build parameters. The
sentence encoder's cosines are read again on every build: its units are clipped to 128 word
pieces, so a build costs it well under a minute.
"""

from __future__ import annotations

import pickle
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from engine.scoring.head import data_digest, head_features

CACHE_VERSION = "head-features-v2"


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
    """(train, validation) example indices from the frozen split (benchmarks/training/splits.json): whole
    sessions and conversations on one side; the test split is never built into examples."""
    from benchmarks.training.splits import split_of

    def side(group: str) -> str | None:
        kind, _, key = group.partition(":")
        return split_of("swe" if kind == "swe" else "mtrag", key)

    train = [i for i, e in enumerate(examples) if side(e.group) == "train"]
    val = [i for i, e in enumerate(examples) if side(e.group) == "validation"]
    return train, val


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
        from benchmarks.training.splits import split_of

        return split_of(kind, key) in self.sides  # type: ignore[arg-type]


def _request(messages: Sequence[Any], count: Callable[[str], int], limit: int) -> str:
    """What the serving request finder ranks the last message (a tool output) against."""
    from policies.request_finding import find_request

    return find_request(messages, len(messages) - 1, count, limit).scored


def _swe_messages(records: list[dict[str, Any]], cfg: BuildConfig, count: Callable[[str], int]) -> list[dict[str, Any]]:
    """One real evidence-bearing tool output per session (of the splits `cfg.sides`), padded with
    same-repository outputs; the request is the agent's own asking turn (thought + command) and
    the task, as serving reads it. Positives: units with a gold line or a line the agent went on
    to use (weak labels, benchmarks.training.agent_data.used_later); retention is measured on gold alone."""
    import json as _json

    from benchmarks.training.agent_data import build_long_outputs, gold_key, stable_fraction
    from policies.conversation_types import Message as Msg, ToolCall
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
    from benchmarks.training.agent_data import stable_fraction
    from policies.conversation_types import Message as Msg
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
    from benchmarks.training.agent_data import load_jsonl_zst
    from engine.scoring.head import drafter_features
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
