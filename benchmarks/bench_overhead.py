"""Gateway overhead on a short cached turn: HTTP + parsing + sessions + rendering, against
llama-cpp-python called directly doing the same work, interleaved in one run."""

from __future__ import annotations

from benchmarks.common import BenchContext, Section, md_table
from benchmarks.timing import measure_overhead, summary_ms


def run(ctx: BenchContext) -> Section:
    if ctx.model_path is None:
        return Section("Gateway overhead", f"Skipped: no model ({ctx.model_error}).")
    turns = 15 if ctx.quick else 60
    bar = ctx.progress(range(turns + 3), "overhead")
    it = iter(bar)
    result = measure_overhead(ctx.model_path, ctx.cache_dir / "work", turns, lambda _msg: next(it, None))
    d50, d99 = summary_ms(result.direct_ms)
    g50, g99 = summary_ms(result.gateway_ms)
    added = [g - d for g, d in zip(result.gateway_ms, result.direct_ms)]
    a50, a99 = summary_ms(added)
    rows = [
        ["llama-cpp-python direct", f"{d50:.1f}", f"{d99:.1f}"],
        ["through the gateway (HTTP, non-stream)", f"{g50:.1f}", f"{g99:.1f}"],
        ["added by the gateway (paired)", f"{a50:.1f}", f"{a99:.1f}"],
    ]
    verdict = "meets" if a50 < 5 else "misses"
    text = (
        f"A short cached turn: a ~250-token system prompt already in the KV cache, a new one-line user "
        f"question, one output token, greedy; {turns} turns after 3 warm-up turns, the two paths "
        f"interleaved turn by turn on the same machine; the gateway is called over one keep-alive HTTP connection, as SDK clients do.\n\n"
        + md_table(["path", "p50 ms", "p99 ms"], rows)
        + f"\nThe gateway adds {a50:.1f} ms at p50 ({verdict} the < 5 ms goal) and {a99:.1f} ms at p99. "
        "What it adds: an HTTP round trip on loopback, JSON parsing and validation, session lookup, "
        "chat-template rendering and tokenization of the whole prompt, the worker-thread hand-off, "
        "and the response.\n"
    )
    return Section("Gateway overhead", text)
