"""Parallel agents (issue 41): 4 sessions with 8K-token histories asking at once, on the batched engine
(4 sequences in one context, decoded together) against the single-sequence engine, in one run."""

from __future__ import annotations

import shutil
import time
import statistics
import threading
import uuid
from dataclasses import dataclass, field
from typing import Any

from benchmarks.common import (
    BOTH_MODELS,
    FAST_MODEL,
    NO_SERVED_DEFAULT,
    SERVED_DEFAULT,
    BenchContext,
    Section,
    coding_sessions,
    md_table,
    pyplot,
    savefig,
    spread,
)
from benchmarks.timing import agent_history, at_once, percentile, prepare_sessions, session_turn
from gateway.process import GatewayProcess

TITLE = "Parallel agents: several sequences decoded together (issue 41)"
ENGINES = {"single sequence": "1", "batched, 4 sequences": "4"}
THROUGHPUT_GOAL = 2.0


@dataclass
class Rounds:
    tokens_per_s: list[float] = field(default_factory=list)  # per round: all sessions' output tokens / wall time
    ttft_s: list[float] = field(default_factory=list)  # every turn's time to first token
    worst_ttft_s: list[float] = field(default_factory=list)  # per round: the slowest session's
    errors: int = 0


def one_round(url: str, histories: list[list[dict[str, str]]], run: str, answer_tokens: int,
              result: Rounds) -> None:
    """Every session asks at once; each history grows by its question and the answer served."""
    ttfts: list[float] = []
    tokens: list[int] = []
    lock = threading.Lock()

    def client(index: int) -> None:
        history = histories[index]
        question = {"role": "user", "content": f"Round {len(history)}: what should the agent do next, and why? "
                                               "Explain step by step."}
        body = {"model": "m", "messages": [*history, question], "max_tokens": answer_tokens, "temperature": 0,
                "stream_options": {"include_usage": True}}
        try:
            turn = session_turn(url, f"load-{run}-{index}", body, timeout=1800)  # prepare_sessions' ids
        except Exception:  # counted: a failed turn is a bad number, reported
            with lock:
                result.errors += 1
            return
        with lock:
            ttfts.append(turn.ttft)
            tokens.append(int(turn.usage.get("completion_tokens", 0)))
        # The answer text is not needed to keep the prefix: a short stand-in keeps every round's
        # prompt growing the same way on both engines.
        history.extend([question, {"role": "assistant", "content": "Noted."}])

    seconds = at_once(client, len(histories))
    result.tokens_per_s.append(sum(tokens) / seconds)
    result.ttft_s.extend(ttfts)
    if ttfts:
        result.worst_ttft_s.append(max(ttfts))


def kernel_ceiling(model: Any, context_tokens: int, sequences: int, steps: int = 20) -> tuple[float, float]:
    """llama.cpp alone, no gateway: the seconds of one decode step carrying one sequence's next token
    and of one carrying all `sequences`' (each sequence holding `context_tokens` tokens): the most
    batching can give on this machine."""
    import numpy as np

    from engine.batched_engine import BatchedLlamaEngine
    from engine.llama_engine import LlamaOptions

    engine = BatchedLlamaEngine(LlamaOptions(model_path=model, model_sha256="bench", n_ctx=context_tokens + 256),
                                sequences=sequences)
    lib, context, batch = engine._lib, engine._context.ctx, engine._batch.batch
    tokens = [int(x) for x in np.random.default_rng(0).integers(100, 5000, context_tokens)]

    def decode(rows: list[tuple[int, list[int], int]]) -> None:
        n = 0
        for seq, chunk, pos in rows:
            n = engine._put(batch, n, seq, chunk, pos, True)
        batch.n_tokens = n
        if lib.llama_decode(context, batch) != 0:
            raise RuntimeError("llama_decode failed")

    for seq in range(sequences):
        for at in range(0, context_tokens, 512):
            decode([(seq, tokens[at : at + 512], at)])

    def step_seconds(seqs: range) -> float:
        started = time.perf_counter()
        for k in range(steps):
            decode([(s, [tokens[k]], context_tokens + k) for s in seqs])
        for s in seqs:
            lib.llama_memory_seq_rm(engine._memory, s, context_tokens, -1)
        return (time.perf_counter() - started) / steps

    try:
        return step_seconds(range(1)), step_seconds(range(sequences))
    finally:
        import asyncio

        asyncio.run(engine.close())


@dataclass(frozen=True)
class ModelRun:
    name: str
    history_tokens: int
    answer_tokens: int
    rounds: int
    n_ctx: int
    results: dict[str, Rounds]
    ceiling: tuple[float, float]  # seconds of a decode step for one sequence, for all four


def run(ctx: BenchContext) -> Section:
    sessions = coding_sessions(ctx, TITLE)
    if isinstance(sessions, Section):
        return sessions
    # (model, file, history tokens, answer tokens, rounds): the served default prefills and decodes
    # several times slower here, so its histories are shorter and it takes fewer rounds.
    plan = [(FAST_MODEL, ctx.model_path, *((1024, 16, 2) if ctx.quick else (8192, 128, 5)))]
    qwen = ctx.served_default()
    if qwen is not None:
        plan.append((SERVED_DEFAULT, qwen, *((256, 8, 1) if ctx.quick else (4096, 64, 3))))
    runs = [measure(ctx, sessions, *spec) for spec in ctx.progress(plan, "batching, models")]
    return _report(ctx, runs, qwen is not None)


def measure(ctx: BenchContext, sessions: list[dict[str, Any]], name: str, model: Any, history_tokens: int,
            answer_tokens: int, rounds: int) -> ModelRun:
    n_sessions = 4
    base = [agent_history(sessions[3 * i:], history_tokens, ctx.count_tokens) for i in range(n_sessions)]
    n_ctx = 4096 if ctx.quick else 2 * history_tokens  # per session: its history and every round's question and answer
    run_id = uuid.uuid4().hex[:8]
    work = ctx.cache_dir / "work" / f"batching-{run_id}"
    servers: dict[str, GatewayProcess] = {}
    histories: dict[str, list[list[dict[str, str]]]] = {}
    results = {label: Rounds() for label in ENGINES}
    try:
        for label, sequences in ENGINES.items():
            servers[label] = GatewayProcess(
                work / sequences, "--model", str(model), "--n-ctx", str(n_ctx), "--sequences", sequences,
                "--threshold", "1000000000", "--ram-budget-mb", "4096", "--queue-size", "16",
                "--repeated-line-stop", "0", ready_timeout=600)
            histories[label] = prepare_sessions(servers[label].url, [list(h) for h in base], f"{run_id}-{ENGINES[label]}")
        # Interleaved, one engine at a time: each round sees the same machine state on both.
        for r in ctx.progress(range(rounds), f"batching rounds, {name}", total=rounds):
            for label in (list(ENGINES) if r % 2 == 0 else list(reversed(ENGINES))):
                one_round(servers[label].url, histories[label], f"{run_id}-{ENGINES[label]}", answer_tokens, results[label])
    finally:
        for server in servers.values():
            server.stop()
        shutil.rmtree(work, ignore_errors=True)
    ceiling = kernel_ceiling(model, history_tokens, len(base))
    return ModelRun(name, history_tokens, answer_tokens, rounds, n_ctx, results, ceiling)


def _report(ctx: BenchContext, runs: list[ModelRun], served_default: bool) -> Section:
    rows, verdicts = [], []
    for m in runs:
        single, batched = (m.results[label] for label in ENGINES)
        for label, r in m.results.items():
            p50 = statistics.median(r.ttft_s) if r.ttft_s else float("nan")
            p99 = percentile(r.ttft_s, 99) if r.ttft_s else float("nan")
            rows.append([m.name, f"{m.history_tokens:,}", m.answer_tokens, m.rounds, label, spread(r.tokens_per_s, 1),
                         f"{p50:.2f}", f"{p99:.2f}", spread(r.worst_ttft_s), str(len(r.ttft_s)), str(r.errors)])
        ratios = [b / s for b, s in zip(batched.tokens_per_s, single.tokens_per_s) if s]
        ratio = statistics.median(ratios) if ratios else float("nan")
        worst_ratio = [b / s for b, s in zip(batched.worst_ttft_s, single.worst_ttft_s) if s]
        ttft_met = bool(worst_ratio) and max(worst_ratio) <= 1.0
        one, four = m.ceiling
        verdicts.append(
            f"- **{m.name}**: aggregate throughput, batched over single, median of the {len(ratios)} paired rounds: "
            f"**{ratio:.2f}×** (goal ≥ {THROUGHPUT_GOAL:.0f}×: {'met' if ratio >= THROUGHPUT_GOAL else 'not met'}). "
            "The slowest session's time to first token, batched over single per round: "
            + (", ".join(f"{x:.2f}×" for x in worst_ratio) or "n/a")
            + f" (goal: never worse than the single engine's queueing: {'met' if ttft_met else 'not met'}). "
            f"The ceiling, llama.cpp alone: with every sequence holding {m.history_tokens:,} tokens, one decode "
            f"step takes {1000 * one:.1f} ms for one sequence's next token and {1000 * four:.1f} ms for four "
            f"sequences' at once, so batching can give at most **{4 * one / four:.2f}×** the output rate here.\n")
    plt = pyplot()
    fig, (left, right) = plt.subplots(1, 2, figsize=(9, 3.4))
    labels = [f"{m.name.split('-Instruct')[0]}\n{label}" for m in runs for label in ENGINES]
    rates = [statistics.median(m.results[label].tokens_per_s) for m in runs for label in ENGINES]
    left.bar(range(len(labels)), rates, color=["#888", "#2a7"] * len(runs))
    left.set_xticks(range(len(labels)), labels)
    left.set_ylabel("output tokens/s, all sessions")
    right.boxplot([m.results[label].ttft_s for m in runs for label in ENGINES])
    right.set_xticks(range(1, len(labels) + 1), labels)
    right.set_ylabel("time to first token (s)")
    right.set_yscale("log")
    for ax in (left, right):
        ax.tick_params(axis="x", labelsize=6)
        ax.grid(alpha=0.3, axis="y")
    plot = savefig(fig, ctx.plot_path("batching.png"))
    text = (
        "4 sessions, each a real coding-agent history served once before (its full prefill, not timed), ask at "
        "once for the rounds the table says: each round every session sends its history plus a new question "
        f"and streams a greedy answer of the length the table says. On {FAST_MODEL} and on the served default, "
        f"{SERVED_DEFAULT} (which prefills and decodes several times slower here, so with shorter histories, "
        "shorter answers and fewer rounds)"
        + ". For each model, two gateways in one run, `--n-ctx` twice the history: `--sequences 1`, the "
        "single-sequence engine, which serves one turn at a time and moves the other sessions' KV through the "
        "RAM tier, and `--sequences 4`, the batched engine (each session bound to a sequence of one context; "
        "one llama_decode per step carries every answering session's next token and the prompt chunks of "
        "those still prefilling). Rounds alternate which engine goes first. Throughput is all sessions' "
        "output tokens over the round's wall time; time to first token is per turn, from sending to the "
        "first streamed token.\n\n"
        + md_table(["model", "history tokens", "answer tokens", "rounds", "engine",
                    "output tokens/s, median (min–max) of rounds", "TTFT p50 s", "TTFT p99 s",
                    "slowest session's TTFT per round, s", "turns", "errors"], rows)
        + "\n" + "".join(verdicts) + ("" if served_default else NO_SERVED_DEFAULT + "\n")
        + "\nThe engines' ratios above are measured against those ceilings.\n"
        + "\n![parallel agents](benchmarks/plots/batching.png)\n"
    )
    return Section(TITLE, text, [plot], model=BOTH_MODELS)
