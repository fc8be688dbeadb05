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

from benchmarks.common import BenchContext, Section, coding_sessions, md_table, pyplot, savefig, spread
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


def run(ctx: BenchContext) -> Section:
    sessions = coding_sessions(ctx, TITLE)
    if isinstance(sessions, Section):
        return sessions
    n_sessions = 4
    history_tokens, answer_tokens, rounds = (1024, 16, 2) if ctx.quick else (8192, 128, 5)
    base = [agent_history(sessions[3 * i:], history_tokens, ctx.count_tokens) for i in range(n_sessions)]
    n_ctx = 4096 if ctx.quick else 16384  # per session: its history and every round's question and answer
    run_id = uuid.uuid4().hex[:8]
    work = ctx.cache_dir / "work" / f"batching-{run_id}"
    servers: dict[str, GatewayProcess] = {}
    histories: dict[str, list[list[dict[str, str]]]] = {}
    results = {label: Rounds() for label in ENGINES}
    try:
        for label, sequences in ENGINES.items():
            servers[label] = GatewayProcess(
                work / sequences, "--model", str(ctx.model_path), "--n-ctx", str(n_ctx), "--sequences", sequences,
                "--threshold", "1000000000", "--ram-budget-mb", "4096", "--queue-size", "16",
                "--repeated-line-stop", "0")
            histories[label] = prepare_sessions(servers[label].url, [list(h) for h in base], f"{run_id}-{ENGINES[label]}")
        # Interleaved, one engine at a time: each round sees the same machine state on both.
        for r in ctx.progress(range(rounds), "batching rounds", total=rounds):
            for label in (list(ENGINES) if r % 2 == 0 else list(reversed(ENGINES))):
                one_round(servers[label].url, histories[label], f"{run_id}-{ENGINES[label]}", answer_tokens, results[label])
    finally:
        for server in servers.values():
            server.stop()
        shutil.rmtree(work, ignore_errors=True)
    ceiling = kernel_ceiling(ctx.model_path, history_tokens, len(base))
    return _report(ctx, results, history_tokens, answer_tokens, rounds, n_ctx, ceiling)


def _report(ctx: BenchContext, results: dict[str, Rounds], history_tokens: int, answer_tokens: int, rounds: int,
            n_ctx: int, ceiling: tuple[float, float]) -> Section:
    single, batched = (results[label] for label in ENGINES)
    rows = []
    for label, r in results.items():
        p50 = statistics.median(r.ttft_s) if r.ttft_s else float("nan")
        p99 = percentile(r.ttft_s, 99) if r.ttft_s else float("nan")
        rows.append([label, spread(r.tokens_per_s, 1), f"{p50:.2f}", f"{p99:.2f}", spread(r.worst_ttft_s),
                     str(len(r.ttft_s)), str(r.errors)])
    ratios = [b / s for b, s in zip(batched.tokens_per_s, single.tokens_per_s) if s]
    ratio = statistics.median(ratios) if ratios else float("nan")
    worst_ratio = [b / s for b, s in zip(batched.worst_ttft_s, single.worst_ttft_s) if s]
    met = ratio >= THROUGHPUT_GOAL
    ttft_met = bool(worst_ratio) and max(worst_ratio) <= 1.0
    plt = pyplot()
    fig, (left, right) = plt.subplots(1, 2, figsize=(8, 3.2))
    labels = list(results)
    left.bar(labels, [statistics.median(results[x].tokens_per_s) for x in labels], color=["#888", "#2a7"])
    left.set_ylabel("output tokens/s, all sessions")
    right.boxplot([results[x].ttft_s for x in labels])
    right.set_xticks(range(1, len(labels) + 1), labels)
    right.set_ylabel("time to first token (s)")
    for ax in (left, right):
        ax.tick_params(axis="x", labelsize=8)
        ax.grid(alpha=0.3, axis="y")
    plot = savefig(fig, ctx.plot_path("batching.png"))
    text = (
        f"4 sessions, each a real coding-agent history of ~{history_tokens:,} tokens served once before (its "
        f"full prefill, not timed), ask at once, {rounds} rounds: each round every session sends its history "
        f"plus a new question and streams a {answer_tokens}-token greedy answer. Two gateways in one run, "
        f"same model, `--n-ctx {n_ctx:,}`: `--sequences 1`, the "
        "single-sequence engine, which serves one turn at a time and moves the other sessions' KV through the "
        "RAM tier, and `--sequences 4`, the batched engine (each session bound to a sequence of one context, "
        f"{n_ctx:,} tokens each; "
        "one llama_decode per step carries every answering session's next token and the prompt chunks of "
        "those still prefilling). Rounds alternate which engine goes first. Throughput is all sessions' "
        "output tokens over the round's wall time; time to first token is per turn, from sending to the "
        "first streamed token.\n\n"
        + md_table(["engine", "output tokens/s, median (min–max) of rounds", "TTFT p50 s", "TTFT p99 s",
                    "slowest session's TTFT per round, s", "turns", "errors"], rows)
        + f"\nAggregate throughput, batched over single, median of the {len(ratios)} paired rounds: **{ratio:.2f}×** "
        f"(goal ≥ {THROUGHPUT_GOAL:.0f}×: {'met' if met else 'not met'}). The slowest session's time to first "
        "token, batched over single per round: "
        + (", ".join(f"{x:.2f}×" for x in worst_ratio) or "n/a")
        + f" (goal: never worse than the single engine's queueing: {'met' if ttft_met else 'not met'}).\n"
        + f"\nThe ceiling on this machine, llama.cpp alone (no gateway): with every sequence holding "
        f"{history_tokens:,} tokens, one decode step takes {1000 * ceiling[0]:.1f} ms for one sequence's next "
        f"token and {1000 * ceiling[1]:.1f} ms for four sequences' at once, "
        f"so batching can give at most **{4 * ceiling[0] / ceiling[1]:.2f}×** the output rate here (four rows "
        f"of a step cost {ceiling[1] / ceiling[0]:.1f}× one). The engine's ratio above is measured against that.\n"
        + "\n![parallel agents](benchmarks/plots/batching.png)\n"
    )
    return Section(TITLE, text, [plot])
