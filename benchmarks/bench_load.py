"""Throughput and latency of short cached turns with 1, 4 and 8 concurrent sessions on loopback."""

from __future__ import annotations

from benchmarks.common import BenchContext, Section, md_table
from benchmarks.timing import measure_load, summary_ms
from gateway.process import GatewayProcess


def run(ctx: BenchContext) -> Section:
    if ctx.model_path is None:
        return Section("Load", f"Skipped: no model ({ctx.model_error}).")
    turns = 3 if ctx.quick else 8
    server = GatewayProcess(ctx.cache_dir / "work" / "load-store", "--model", str(ctx.model_path), "--n-ctx", "8192",
                            "--queue-size", "16")
    rows = []
    rates: list[float] = []
    try:
        for sessions in ctx.progress([1, 4, 8], "load"):
            result = measure_load(server.url, sessions, turns)
            p50, p99 = summary_ms(result.latencies_ms)
            rates.append(len(result.latencies_ms) / result.seconds)
            rows.append([sessions, result.requests, result.errors, f"{len(result.latencies_ms) / result.seconds:.2f}",
                         f"{p50:.0f}", f"{p99:.0f}"])
    finally:
        server.stop()
    text = (
        f"Each client runs its own {turns}-turn session (a ~100-token system prompt, one-line "
        "questions, 2 output tokens, greedy) against one gateway on loopback; the engine serves one "
        "turn at a time, so concurrent sessions queue and the engine switches KV state between "
        "them (RAM tier).\n\n"
        + md_table(["concurrent sessions", "requests", "errors", "requests/s", "p50 ms", "p99 ms"], rows)
        + f"\nThroughput with 8 sessions is {rates[-1] / rates[0]:.2f}× that of one session: turns "
        "wait for the single engine worker, so latency grows with concurrency while the work stays "
        "serial on 2 cores.\n"
    )
    return Section("Load", text)
