"""Load that moves state: 1, 4 and 8 sessions with 8K-token histories taking turns at once, so
every switch moves a real KV state through the RAM tier, and at RAM budget 0 through the disk."""

from __future__ import annotations

import shutil
import uuid

from benchmarks.common import BenchContext, Section, coding_sessions, md_table, pyplot, savefig
from benchmarks.timing import agent_history, measure_load, prepare_sessions, summary_ms
from gateway.process import GatewayProcess

TITLE = "Load that moves session state"


def run(ctx: BenchContext) -> Section:
    sessions = coding_sessions(ctx, TITLE)
    if isinstance(sessions, Section):
        return sessions
    levels, history_tokens, turns = ([1, 2], 1024, 2) if ctx.quick else ([1, 4, 8], 8192, 4)
    histories = [agent_history(sessions[3 * i:], history_tokens, ctx.count_tokens) for i in range(max(levels))]
    store = ctx.cache_dir / "work" / f"load-{uuid.uuid4().hex[:8]}"
    flags = ("--model", str(ctx.model_path), "--n-ctx", "16384", "--queue-size", "16", "--threshold", "1000000000")
    run_id = uuid.uuid4().hex[:8]
    rows, points = [], []
    # The RAM tier at its default, then at 0 on the same store: every switch then goes to disk.
    for budget in ("2048", "0"):
        server = GatewayProcess(store, *flags, "--ram-budget-mb", budget)
        try:
            if budget == "2048":
                histories = prepare_sessions(server.url, histories, run_id)
            for level in ctx.progress(levels, f"load, RAM budget {budget} MiB"):
                subset = histories[:level]
                result = measure_load(server, subset, run_id, turns)
                histories[:level] = subset
                p50, p99 = summary_ms(result.latencies_ms)
                rate = len(result.latencies_ms) / result.seconds
                moved = sum(result.restored_mb.values())
                tiers = ", ".join(f"{t} {mb:,.0f}" for t, mb in sorted(result.restored_mb.items())) or "none"
                rows.append([f"{budget} MiB", level, result.requests, result.errors, f"{rate:.2f}", f"{p50:,.0f}",
                             f"{p99:,.0f}", tiers, f"{moved / result.seconds:.1f}"])
                points.append((budget, level, p50, p99))
        finally:
            server.stop()
    shutil.rmtree(store, ignore_errors=True)
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(6, 3.5))
    for budget in ("2048", "0"):
        pts = [p for p in points if p[0] == budget]
        ax.plot([p[1] for p in pts], [p[2] for p in pts], "o-", label=f"p50, RAM budget {budget} MiB")
        ax.plot([p[1] for p in pts], [p[3] for p in pts], "x--", label=f"p99, RAM budget {budget} MiB")
    ax.set_xlabel("concurrent sessions")
    ax.set_ylabel("turn latency (ms)")
    ax.set_yscale("log")
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3)
    plot = savefig(fig, ctx.plot_path("load_latency.png"))
    text = (
        f"{max(levels)} sessions, each a real coding-agent history of ~{history_tokens:,} tokens, are served "
        "once (their full prefill, not timed). Then " + ", ".join(map(str, levels)) + " clients at once each take "
        f"{turns} short turns of their own session (a one-line question, 4 output tokens, greedy). The "
        "engine decodes the turns of up to 4 sessions together (its default `sequences = 4`, each sequence "
        "holding one session's KV); a turn of a session that holds no sequence first has its KV state restored "
        "into one (the least recently used session's is stashed to the tier first): from the RAM tier at its "
        "default budget, and, on the same store after a restart with `--ram-budget-mb 0`, from disk. "
        "With 8 clients every turn can need such a switch. Latency is per turn, from sending to the "
        "whole response; the state moved is what the gateway's log reports restored into the context.\n\n"
        + md_table(["RAM tier", "concurrent sessions", "turns", "errors", "turns/s", "p50 ms", "p99 ms",
                    "state restored, MB by tier", "MB restored/s"], rows)
        + "\n![load latency](benchmarks/plots/load_latency.png)\n"
    )
    return Section(TITLE, text, [plot])
