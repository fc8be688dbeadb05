"""Which drafter signal ranks the units of a real tool output best? Gold-line retention at 27 %.

Data: ../shared/data/swe-dev.jsonl.zst relative to the repository (real mini-swe-agent sessions
with the lines their verified patch removes: the evidence an agent needed); skipped if absent. Per
session, the tool outputs are joined as one terminal log (`$ command` then its output), cut to at
most --cap tokens around a gold line, segmented as the gateway does (min 32, max 512 tokens,
counts from the model tokenizer), and ranked against the issue text (its first 128 tokens). Units
are kept with policies.selection.select_units at 27 % of the tokens; a session's retention is the
share of its distinct gold lines with at least one kept occurrence. "flat" counts the messages the
gateway's flatness gate (spread < 0.11) would have served whole.

Phases (one model loaded at a time; each pass over 44 sessions is 1.5-4 minutes on 2 busy cores):
  (default)   the production scorers of engine/scoring/drafter.py and engine/scoring/fusion.py (drafter, fusion) against BM25, with
              reading speed and the cost of re-scoring cached units;
  --signals   raw signals: mean-pooled `l_out-L` cosine (raw and centred) for several layers, alone
              and fused with BM25; --attention adds request->unit attention at global layer 5;
              --features DIR saves per-session features so a long run can be split;
  --speed     tokens/s reading one window: whole graph vs early exit, full vs truncated model.
Every phase covers the full model and a --blocks truncation (written next to the model once).

    .venv/bin/python benchmarks/drafter_signals.py [--signals | --speed] [--sessions 44] [--cap 2048]
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import re
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from engine.scoring.drafter import (
    ActivationReader,
    DrafterScorer,
    cosines,
    fuse,
    pack_windows,
    read_pooled,
    to_mass,
)
from benchmarks.training.agent_data import terminal_log  # noqa: E402
from engine.scoring.ranks import ranks  # noqa: E402
from engine.scoring.fusion import FusionScorer  # noqa: E402
from benchmarks.common import window_around  # noqa: E402
from benchmarks.intervals import bootstrap  # noqa: E402
from engine.scoring.scorers import Bm25Scorer
from policies.lexical import bm25_scores
from policies.segmentation import Unit, segment
from policies.selection import relevance_spread, select_units

DATA = ROOT.parent / "shared" / "data" / "swe-dev.jsonl.zst"
KEEP = 0.27
REQUEST_TOKENS = 128


@dataclass
class Case:
    id: str
    lines: list[str]
    line_tokens: list[int]
    units: list[Unit]
    unit_texts: list[str]
    request: str
    gold: set[str]  # distinct gold lines present in the log (rstripped)

    @property
    def tokens(self) -> int:
        return sum(self.line_tokens)


# --- data -----------------------------------------------------------------------------------------



def load_records(path: Path) -> list[dict]:
    import zstandard

    raw = zstandard.ZstdDecompressor().decompress(path.read_bytes(), max_output_size=1 << 31)
    return [json.loads(line) for line in raw.splitlines() if line.strip()]


def issue_text(record: dict) -> str:
    text = record["issue"]
    m = re.search(r"<pr_description>(.*?)</pr_description>", text, re.DOTALL)
    body = m.group(1) if m else text
    return re.sub(r"^\s*Consider the following PR description:\s*", "", body).strip()


def build_cases(records: list[dict], tokenize: Callable[[str], list[int]], detokenize: Callable[[list[int]], str],
                n_sessions: int, cap: int) -> list[Case]:
    cases: list[Case] = []
    for record in records:
        if len(cases) >= n_sessions:
            break
        lines = terminal_log(record)
        golds = {g.rstrip() for g in record["gold_lines"] if g.strip()}
        hits = [i for i, line in enumerate(lines) if line.rstrip() in golds]
        if not hits:
            continue
        toks = [len(tokenize(line)) for line in lines]
        if sum(toks) > cap:
            # A window of `cap` tokens holding the first gold line at a pseudo-random depth.
            depth = int(hashlib.sha256(record["id"].encode()).hexdigest(), 16) % 1000 / 1000
            start, end = window_around(toks, hits[0], depth, cap)
            lines, toks = lines[start:end], toks[start:end]
        present = {line.rstrip() for line in lines} & golds
        if not present or sum(toks) < 1024:
            continue  # too short to be worth compressing
        units = segment(lines, toks, 32, 512)
        request = detokenize(tokenize(issue_text(record))[:REQUEST_TOKENS])
        cases.append(Case(record["id"], lines, toks, units,
                          ["".join(lines[u.first : u.last + 1]) for u in units], request, present))
    return cases


# --- evaluation -------------------------------------------------------------------------------------


def retention(case: Case, scores: Sequence[float]) -> float:
    kept = select_units(case.units, scores, int(KEEP * case.tokens))
    shown = {case.lines[i].rstrip() for k in kept for i in range(case.units[k].first, case.units[k].last + 1)}
    return len(case.gold & shown) / len(case.gold)


def report(cases: list[Case], methods: dict[str, list[list[float]]], baseline: str = "bm25") -> None:
    """Mean retention, paired difference to BM25 with a bootstrap CI over sessions, and how many
    messages the gateway's flatness gate (spread < 0.11) would have served whole."""
    base = [retention(c, s) for c, s in zip(cases, methods[baseline])]
    print(f"{'ranking':<34} {'gold kept':>9} {'vs bm25':>8} {'95% CI':>17} {'flat':>5}")
    for name, all_scores in methods.items():
        vals = [retention(c, s) for c, s in zip(cases, all_scores)]
        diffs = [v - b for v, b in zip(vals, base)]
        lo, hi = bootstrap(diffs)
        flat = sum(relevance_spread(s, [u.tokens for u in c.units], KEEP) < 0.11 for c, s in zip(cases, all_scores))
        print(f"{name:<34} {np.mean(vals):9.3f} {np.mean(diffs):+8.3f} {f'[{lo:+.3f}, {hi:+.3f}]':>17} {flat:5d}")


# --- raw signals (phase --signals) --------------------------------------------------------------------


def attention_l5(reader: ActivationReader, unit_ids: list[list[int]], request_ids: list[int]) -> np.ndarray:
    """Request->unit attention mass at global layer 5, the request appended to each window of units
    (post-RoPE Q and K, softmax(q.k/16) over the causal prefix, mean over heads and request tokens)."""
    capacity = reader.window - 1 - len(request_ids)
    ids = [u[:capacity] for u in unit_ids]
    attn = np.zeros(len(ids))
    for group in pack_windows([len(u) for u in ids], capacity):
        tokens = [t for u in group for t in ids[u]] + request_ids
        out = reader.read(tokens, {"Qcur-5": 3, "Kcur-5": 3}, "Kcur-5")
        q = out["Qcur-5"][-len(request_ids):].astype(np.float64)  # (R, heads, dim)
        keys = out["Kcur-5"][:, 0, :].astype(np.float64)  # (N, dim): one KV head
        n = keys.shape[0]
        logits = np.matmul(q, keys.T) / math.sqrt(q.shape[-1])  # (R, heads, N)
        qpos = np.arange(n - len(request_ids), n)
        logits = np.where(np.arange(n)[None, None, :] > qpos[:, None, None], -np.inf, logits)
        logits -= logits.max(axis=-1, keepdims=True)
        probs = np.exp(logits)
        probs /= probs.sum(axis=-1, keepdims=True)
        mass = probs.mean(axis=(0, 1))
        pos = 1
        for u in group:
            attn[u] = mass[pos : pos + len(ids[u])].sum()
            pos += len(ids[u])
    return attn


def run_signals(cases: list[Case], models: list[tuple[str, Path, list[int]]], window: int, attention: bool,
                features: Path | None) -> None:
    methods: dict[str, list[list[float]]] = {"bm25": [bm25_scores(c.unit_texts, c.request) for c in cases]}
    for tag, path, layers in models:
        reader = ActivationReader(path, window=window)
        unit_ids = [[reader.tokenize(t) for t in c.unit_texts] for c in cases]
        req_ids = [reader.tokenize(c.request) for c in cases]
        pooled, alone = [], []
        started, n_tok = time.perf_counter(), 0
        for case, ids, req in zip(cases, unit_ids, req_ids):
            # Features are saved per session, so a long comparison can run in several short passes.
            key = hashlib.sha256("\x00".join([path.name, str(path.stat().st_size), str(window), case.request,
                                              *case.unit_texts]).encode()).hexdigest()[:16]
            saved = features / f"{case.id}-{key}.npz" if features else None
            if saved is not None and saved.is_file():
                with np.load(saved) as z:
                    if all(f"pooled{L}" in z for L in layers):
                        pooled.append({L: z[f"pooled{L}"] for L in layers})
                        alone.append({L: z[f"req{L}"] for L in layers})
                        continue
            pooled.append(read_pooled(reader, ids, layers))
            alone.append(read_pooled(reader, [req], layers))
            n_tok += sum(len(t) for t in ids) + len(req)
            if saved is not None:
                saved.parent.mkdir(parents=True, exist_ok=True)
                np.savez(saved, **{f"pooled{L}": pooled[-1][L] for L in layers},
                         **{f"req{L}": alone[-1][L] for L in layers})
        elapsed = time.perf_counter() - started
        print(f"[{tag or 'full'}] read {n_tok} tokens to layer {max(layers)} in {elapsed:.1f} s "
              f"({n_tok / max(elapsed, 1e-9):.0f} tok/s; the rest from saved features)", flush=True)
        tokens = [[len(t) for t in ids] for ids in unit_ids]
        bm_density = [np.array([s / max(n, 1) for s, n in zip(b, tk)]) for b, tk in zip(methods["bm25"], tokens)]
        for L in layers:
            for centre in (False, True):
                label = f"L{L}{' centred' if centre else ''}"
                cos = [cosines(p[L], a[L][0], centre) for p, a in zip(pooled, alone)]
                methods[f"{tag}cos {label}"] = [to_mass(c, tk) for c, tk in zip(cos, tokens)]
                methods[f"{tag}rrf bm25 + cos {label}"] = [
                    to_mass(fuse(d, c), tk) for d, c, tk in zip(bm_density, cos, tokens)]
                if L == max(layers) and not centre:  # the fusion rule's alternative: BM25 zeros share a rank
                    methods[f"{tag}  (zeros ranked, not skipped)"] = [
                        to_mass(1 / (60 + ranks(d)) + 1 / (60 + ranks(c)), tk)
                        for d, c, tk in zip(bm_density, cos, tokens)]
        if attention and 5 in layers:
            started = time.perf_counter()
            sep = reader.tokenize("\n\nRequest: ")
            attn = [attention_l5(reader, ids, sep + r) for ids, r in zip(unit_ids, req_ids)]
            print(f"[{tag or 'full'}] attention pass {time.perf_counter() - started:.1f} s", flush=True)
            dens = [a / np.maximum(np.array(tk), 1) for a, tk in zip(attn, tokens)]
            methods[f"{tag}attn L5"] = [to_mass(d, tk) for d, tk in zip(dens, tokens)]
            methods[f"{tag}rrf bm25 + attn L5"] = [
                to_mass(fuse(b, d), tk) for b, d, tk in zip(bm_density, dens, tokens)]
        reader.close()
    report(cases, methods)


# --- production scorers (default phase) ---------------------------------------------------------------


def run_scorers(cases: list[Case], models: list[tuple[str, Path]], window: int) -> None:
    methods: dict[str, list[list[float]]] = {"bm25": [Bm25Scorer().score(c.unit_texts, c.request) for c in cases]}
    for tag, path in models:
        drafter = DrafterScorer(path, window=window)
        fusion = FusionScorer(drafter)
        d_scores = [drafter.score(c.unit_texts, c.request) for c in cases]
        reading = drafter.stats()
        started = time.perf_counter()
        # Every unit is cached now: fusion reads only the request (what the recall gate pays).
        f_scores = [fusion.score(c.unit_texts, c.request) for c in cases]
        cached_s = time.perf_counter() - started
        print(f"[{tag or 'full'}] drafter (layer {drafter.layer}) read {reading['tokens_read']:.0f} tokens, "
              f"{reading['units_read']:.0f} units, in {reading['seconds']:.1f} s "
              f"({reading['tokens_read'] / reading['seconds']:.0f} tok/s); re-scoring cached units: "
              f"{1000 * cached_s / len(cases):.0f} ms/message; cache {drafter.cache_bytes / 1e6:.2f} MB", flush=True)
        drafter.close()
        methods[f"{tag}drafter"] = d_scores
        methods[f"{tag}fusion"] = f_scores
    report(cases, methods)


def run_speed(models: list[tuple[str, Path, list[int]]], window: int, text_tokens: list[int], threads: int | None,
              rounds: int = 3) -> None:
    """Tokens/s reading one full window: the whole graph vs stopping after the tap block (early
    exit). Configurations are interleaved and the best of `rounds` kept, because a shared machine's
    load swings by 2x within a minute."""
    readers = [(tag or "full", ActivationReader(path, window=window, n_threads=threads)) for tag, path, _ in models]
    tokens = text_tokens[: window - 1]
    configs: list[tuple[str, ActivationReader, str, str]] = []
    for tag, reader in readers:
        last = reader.n_layer - 2  # the last block keeps no rows without logits (see DrafterScorer)
        configs.append((f"{tag.strip()} whole graph ({reader.n_layer} blocks)", reader, f"l_out-{last}", ""))
        for tap in sorted({min(8, last), min(4, last)}, reverse=True):
            configs.append((f"{tag.strip()} early exit after block {tap}", reader, f"l_out-{tap}", f"l_out-{tap}"))
    best = {label: math.inf for label, *_ in configs}
    for _ in range(rounds):
        for label, reader, tap, stop in configs:
            started = time.perf_counter()
            reader.read(tokens, {tap: 1}, stop)
            best[label] = min(best[label], time.perf_counter() - started)
    for label, seconds in best.items():
        print(f"{label:<36} {(len(tokens) + 1) / seconds:6.0f} tok/s  (best of {rounds}, {len(tokens) + 1} tokens, "
              f"{threads or 'all'} threads)", flush=True)
    for _, reader in readers:
        reader.close()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--signals", action="store_true", help="compare raw signals instead of the scorers")
    parser.add_argument("--sessions", type=int, default=44)
    parser.add_argument("--cap", type=int, default=2048, help="tokens per terminal log at most")
    parser.add_argument("--window", type=int, default=2048)
    parser.add_argument("--blocks", type=int, default=6, help="blocks of the truncated drafter (0: skip it)")
    parser.add_argument("--model", type=Path, default=None, help="GGUF (default: the embedded Gemma 3 270M)")
    parser.add_argument("--features", type=Path, default=None, help="with --signals: save/reuse features here")
    parser.add_argument("--truncated-only", action="store_true", help="skip the full model")
    parser.add_argument("--speed", action="store_true", help="only time reading (whole graph vs early exit)")
    parser.add_argument("--threads", type=int, default=None, help="with --speed: CPU threads (default: all)")
    parser.add_argument("--attention", action="store_true", help="with --signals: also layer-5 attention")
    args = parser.parse_args(argv)
    if not DATA.is_file():
        print(f"skipped: {DATA} not found")
        return 0
    import llama_cpp

    from engine.models.parts import GEMMA_3_270M, assemble
    from engine.models.truncate_gguf import truncate_gguf

    full = args.model or assemble(GEMMA_3_270M, Path("/tmp/pf-models"))  # the default drafter's model
    vocab = llama_cpp.Llama(model_path=str(full), vocab_only=True, verbose=False)

    def tokenize(text: str) -> list[int]:
        return vocab.tokenize(text.encode("utf-8"), add_bos=False, special=False)

    def detokenize(ids: list[int]) -> str:
        return vocab.detokenize(ids).decode("utf-8", "replace")

    cases = build_cases(load_records(DATA), tokenize, detokenize, args.sessions, args.cap)
    print(f"{len(cases)} sessions, {sum(c.tokens for c in cases)} tokens, "
          f"{sum(len(c.units) for c in cases)} units, {sum(len(c.gold) for c in cases)} gold lines; "
          f"keep {KEEP:.0%}", flush=True)
    n_blocks = args.blocks
    models: list[tuple[str, Path, list[int]]] = [("", full, [3, 5, 8])]
    if n_blocks:
        small = full.with_name(f"{full.stem}.{n_blocks}blk.gguf")
        if not small.is_file():
            truncate_gguf(full, small, n_blocks)
        models.append((f"{n_blocks}blk ", small, [L for L in (3, 4, 5, 8) if L <= n_blocks - 2]))
    if args.truncated_only:
        models = models[1:]
    if args.speed:
        text = "".join("".join(c.lines) for c in cases)
        run_speed(models, args.window, tokenize(text), args.threads)
    elif args.signals:
        run_signals(cases, models, args.window, args.attention, args.features)
    else:
        run_scorers(cases, [(tag, path) for tag, path, _ in models], args.window)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
