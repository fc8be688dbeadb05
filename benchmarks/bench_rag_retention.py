"""Evidence retention on MTRAG (issue 12): are a question's gold passages kept when the search
output that holds them is compressed against that question? Test split only.

Data: ../shared/data/mtrag-un-reference.jsonl.zst (IBM MTRAG, human multi-turn RAG), the same long
search outputs as the recall section (each conversation's gold passages among same-collection
distractors, seeded order, at least the compression threshold), but asked for by the turn the
passages answer: the conversation so far as text, then an assistant `search` call with that
question, then the output. This is a RAG agent's retrieval turn, and it goes through the serving
pipeline (gateway.compressor.MessageCompressor, fallbacks included) at 15 / 27 / 40 % and at the
budget curve's budget. A passage counts as kept only when every one of its lines is shown. Shares
are means over conversations of the share of gold passages kept, with bootstrap 95 % intervals;
head+tail and random units (seeded) at the same budgets are the baselines.
"""

from __future__ import annotations

import json
import statistics
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from engine.scoring.bundle import bundle_of
from benchmarks.mtrag_replays import CALL_ID, DATA, Replay, build_replays
from benchmarks.bench_retention import BASELINES, CURVE, TABLE_RATIOS
from benchmarks.retention_cases import head_tail, random_units
from benchmarks.intervals import bootstrap, ci_cell, verdict
from benchmarks.common import (
    BenchContext,
    MemoBundle,
    Section,
    TokenCountCache,
    default_compression_settings,
    load_jsonl_zst,
    md_table,
    mean,
    pct,
)

TITLE = "Evidence retention on MTRAG search outputs, test split (issue 12)"
SCORERS = ("ranker", "ranker-words", "bm25", "embed", "hybrid")
GOAL = 0.95
Range = tuple[int, int]


@dataclass
class Retrieval:
    id: str
    messages: list[Any]  # ends with the search call's long output
    gold_spans: list[Range]
    line_tokens: list[int]
    tokens: int


@dataclass
class Shares:
    by_budget: dict[str, list[float]] = field(default_factory=dict)  # budget key -> per conversation
    compressed: dict[str, int] = field(default_factory=dict)


def retrieval_turn(rep: Replay, line_tokens: list[int]) -> Retrieval | None:
    """The replay's long output as the answer to a search for the gold turn's question."""
    from policies.conversation_types import Message, ToolCall

    first, output, later = rep.messages[0], rep.messages[rep.tool_index], rep.messages[rep.tool_index + 1 :]
    history = [first, *later]
    if history[-1].role != "user":
        return None
    question = history[-1].content
    call = Message("assistant", "", (ToolCall(CALL_ID, "search", json.dumps({"query": question})),))
    messages = [*history, call, Message("tool", output.content, tool_call_id=CALL_ID, name="search")]
    return Retrieval(rep.id, messages, rep.gold_spans, line_tokens, rep.tokens)


def kept_share(spans: Sequence[Range], visible: Sequence[Range]) -> float:
    """Share of gold passages whose every line is in a visible range."""
    shown = {i for a, b in visible for i in range(a, b + 1)}
    return sum(all(i in shown for i in range(a, b + 1)) for a, b in spans) / len(spans)


def run(ctx: BenchContext) -> Section:
    path = ctx.data_file(DATA)
    if path is None:
        return Section(TITLE, f"Skipped: `{ctx.data_dir / DATA}` is missing (see ../shared/data/README.md).\n")
    if ctx.model_path is None:
        return Section(TITLE, f"Skipped: no tokenizer model ({ctx.model_error}).\n")
    from benchmarks.training.splits import split_of
    from gateway.compressor import MessageCompressor
    from policies.budget import parse_curve, token_budget
    from policies.rendering import split_lines
    from policies.segmentation import segment

    settings = default_compression_settings()
    curve = parse_curve(settings.budget_curve)
    target = 3000 if ctx.quick else settings.threshold
    limit = ctx.sessions if ctx.sessions is not None else (12 if ctx.quick else None)
    every = load_jsonl_zst(path)
    records = [r for r in every if split_of("mtrag", r["conversation_id"]) == ctx.split]
    started = time.perf_counter()
    replays, skipped = build_replays(records, ctx.count_tokens, target, limit, ctx.seed, every, need_followup=False)
    cases = [c for rep in replays
             if (c := retrieval_turn(rep, [ctx.count_tokens(x) for x in split_lines(rep.messages[rep.tool_index].content)]))]
    build_seconds = time.perf_counter() - started
    if not cases:
        return Section(TITLE, f"Skipped: no usable conversation ({skipped}).\n")
    keys = [CURVE, *map(str, TABLE_RATIOS)]

    def budget_of(case: Retrieval, key: str) -> int:
        return token_budget(case.tokens, curve) if key == CURVE else int(case.tokens * float(key))

    results: dict[str, Shares] = {name: Shares() for name in BASELINES}
    for case in cases:
        text = case.messages[-1].content
        units = segment(split_lines(text), case.line_tokens, settings.min_segment, settings.max_segment)
        for key in keys:
            budget = budget_of(case, key)
            for name, ranges in (("head+tail", head_tail(case.line_tokens, budget)),
                                 ("random", random_units(units, budget, f"{ctx.seed}:{case.id}"))):
                results[name].by_budget.setdefault(key, []).append(kept_share(case.gold_spans, ranges))
    notes: list[str] = []
    for name in (n for n in SCORERS if ctx.runs(n)):
        scorer = ctx.scorer(name)
        if scorer is None:
            notes.append(f"`{name}` rows skipped: the scorer did not load ({ctx.scorer_note(name)}).")
            continue
        memo, shares = MemoBundle(bundle_of(scorer)), Shares()
        for case in ctx.progress(cases, f"rag retention: {name}"):
            memo.clear()
            compressor = MessageCompressor(TokenCountCache(ctx.count_tokens), memo.bundle, settings)
            for key in keys:
                plan, _ = compressor.compress(case.messages, len(case.messages) - 1, case.tokens,
                                              keep_ratio=None if key == CURVE else float(key))
                visible = plan.kept_ranges if plan.compressed else [(0, len(case.line_tokens) - 1)]
                shares.by_budget.setdefault(key, []).append(kept_share(case.gold_spans, visible))
                shares.compressed[key] = shares.compressed.get(key, 0) + plan.compressed
        results[name] = shares
    raw = [{"conversation": c.id, "tokens": c.tokens, "gold_passages": len(c.gold_spans),
            "kept": {name: {key: r.by_budget[key][i] for key in keys} for name, r in results.items()}}
           for i, c in enumerate(cases)]
    return Section(TITLE, _report(ctx, cases, skipped, results, notes, build_seconds), raw=raw)


def _report(ctx: BenchContext, cases: list[Retrieval], skipped: dict[str, int], results: dict[str, Shares],
            notes: list[str], build_seconds: float) -> str:
    sizes = sorted(c.tokens for c in cases)
    golds = [len(c.gold_spans) for c in cases]
    skips = ", ".join(f"{n} skipped: {why}" for why, n in skipped.items() if n)
    out = [f"{len(cases)} conversations ({skips or 'none skipped'}); tokens per search output: min {sizes[0]:,}, "
           f"median {int(statistics.median(sizes)):,}, max {sizes[-1]:,}; gold passages per question: median "
           f"{statistics.median(golds):g}, total {sum(golds)}. The output is compressed against the question its gold "
           f"passages answer (the turn's search call and the conversation so far). Building took {build_seconds:.1f} s.\n"]
    if ctx.quick:
        out.append("**Quick run:** small outputs and few conversations; a smoke test of the benchmark, not a result.\n")
    scorers = [n for n in SCORERS if n in results]
    rows = []
    for name in [*scorers, *BASELINES]:
        r = results[name]
        whole = "" if name in BASELINES else str(len(cases) - r.compressed.get("0.27", 0))
        rows.append([name, str(len(r.by_budget["0.27"])), pct(mean(r.by_budget[CURVE])), pct(mean(r.by_budget["0.15"])),
                     ci_cell(r.by_budget["0.27"]), pct(mean(r.by_budget["0.4"])), whole])
    out.append("Share of gold passages kept whole (a conversation served whole keeps all of them); one question "
               "per conversation, so the intervals resample conversations:\n")
    out.append(md_table(["method", "conversations", "curve budget", "15 %", "27 % (95 % CI)", "40 %",
                         "served whole at 27 %"], rows))
    if "bm25" in results:
        diff_rows = []
        for name in (n for n in scorers if n != "bm25"):
            pairs = [a - b for a, b in zip(results[name].by_budget["0.27"], results["bm25"].by_budget["0.27"])]
            lo, hi = bootstrap(pairs)
            diff_rows.append([name, str(len(pairs)), f"{100 * (mean(pairs) or 0):+.1f} points ({100 * lo:+.1f}…{100 * hi:+.1f})"])
        if diff_rows:
            out.append("\nPaired difference against BM25 at 27 % (same conversations):\n")
            out.append(md_table(["scorer", "conversations", "gain over bm25 (95 % CI)"], diff_rows))
    out.extend(f"\n{note}\n" for note in notes)
    at = {n: mean(results[n].by_budget["0.27"]) or 0.0 for n in scorers}
    if at:
        best = max(at, key=lambda n: at[n])
        out.append(f"\n**Reading the numbers.** At 27 % the best scorer is `{best}` ({pct(at[best])} of gold passages "
                   f"kept whole); the goal is ≥ {pct(GOAL, 0)}: "
                   + verdict(at[best], bootstrap(results[best].by_budget["0.27"]), GOAL) + "."
                   + " A passage cut anywhere counts as lost, so this is stricter than a share of lines.\n")
    return "\n".join(out)
