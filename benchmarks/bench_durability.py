"""Sessions under pressure (issue 14): is the event loop free while session state moves through
the disk, and does memory stay bounded when a thousand sessions come and go?"""

from __future__ import annotations

import threading
import time
import uuid
from pathlib import Path

import httpx

from benchmarks.common import BenchContext, Section, coding_sessions, md_table, pyplot, savefig, spread
from benchmarks.timing import agent_history, chat, measure_load, percentile, prepare_sessions
from gateway.process import GatewayProcess

TITLE = "Sessions under pressure: event-loop lag and memory (issue 14)"
RAM_BUDGET_MB = 256  # small, so a thousand sessions must spill: the bound is what is measured


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def lag_quantiles(url: str) -> tuple[float, float, int]:
    """p50 and p99 upper bounds of the loop-lag histogram on /metrics (bucket edges), and its count."""
    from prometheus_client.parser import text_string_to_metric_families

    buckets: list[tuple[float, float]] = []
    for family in text_string_to_metric_families(httpx.get(url + "/metrics", timeout=30).text):
        if family.name == "pflash_event_loop_lag_seconds":
            buckets = [(float(s.labels["le"]), s.value) for s in family.samples if s.name.endswith("_bucket")]
    count = max((v for _le, v in buckets), default=0.0)

    def upper(q: float) -> float:
        return next((le for le, v in sorted(buckets) if v >= q * count), float("inf"))

    return upper(0.5), upper(0.99), int(count)


def watch_health(url: str, stop: threading.Event, out: list[float]) -> None:
    """/health every 50 ms while the load runs: what a keep-alive or a monitor would see."""
    with httpx.Client() as client:
        while not stop.is_set():
            started = time.perf_counter()
            try:
                client.get(url + "/health", timeout=10)
                out.append(time.perf_counter() - started)
            except httpx.HTTPError:
                out.append(float("inf"))
            stop.wait(0.05)


def run(ctx: BenchContext) -> Section:
    sessions = coding_sessions(ctx, TITLE)
    if isinstance(sessions, Section):
        return sessions
    history_tokens, clients, turns, many = (1024, 2, 2, 50) if ctx.quick else (16384, 4, 3, 1000)
    work = ctx.cache_dir / "work" / f"durability-{uuid.uuid4().hex[:8]}"
    run_id = uuid.uuid4().hex[:8]

    # 1. Event-loop lag while every switch moves a long session's state through the disk.
    histories = [agent_history(sessions[3 * i:], history_tokens, ctx.count_tokens) for i in range(clients)]
    server = GatewayProcess(work / "lag", "--model", str(ctx.model_path), "--n-ctx", "20480", "--threshold",
                            "1000000000", "--ram-budget-mb", "0")
    health: list[float] = []
    try:
        histories = prepare_sessions(server.url, histories, run_id)
        before = lag_quantiles(server.url)
        stop = threading.Event()
        watcher = threading.Thread(target=watch_health, args=(server.url, stop, health))
        watcher.start()
        load = measure_load(server, histories, run_id, turns)
        stop.set()
        watcher.join()
        p50, p99, count = lag_quantiles(server.url)
    finally:
        server.stop()
    moved = sum(load.restored_mb.values())

    # 2. Memory: many short sessions, created and abandoned.
    server = GatewayProcess(work / "many", "--model", str(ctx.model_path), "--n-ctx", "2048",
                            "--ram-budget-mb", str(RAM_BUDGET_MB))
    points: list[tuple[int, float]] = [(0, rss_mb(server.proc.pid))]
    try:
        with httpx.Client() as client:
            for i in ctx.progress(range(1, many + 1), "sessions", total=many):
                messages = [{"role": "system", "content": "You are a terse assistant."},
                            {"role": "user", "content": f"Session {i} of {many}: say ok."}]
                chat(server.url, f"many-{run_id}-{i}", messages, max_tokens=1, client=client)
                if i % max(1, many // 20) == 0:
                    points.append((i, rss_mb(server.proc.pid)))
    finally:
        server.stop()
    start_mb, peak_mb = points[0][1], max(mb for _i, mb in points)
    last_half = [mb for i, mb in points if i >= many // 2]

    plt = pyplot()
    fig, ax = plt.subplots(figsize=(6, 3.5))
    ax.plot([i for i, _mb in points], [mb for _i, mb in points], "o-", markersize=3, label="gateway RSS")
    ax.axhline(start_mb + RAM_BUDGET_MB, color="grey", linestyle=":", label="RSS at start + RAM budget")
    ax.set_xlabel("sessions created and abandoned")
    ax.set_ylabel("resident memory (MiB)")
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3)
    plot = savefig(fig, ctx.plot_path("durability_rss.png"))
    finite = [h for h in health if h != float("inf")]
    text = (
        f"**Event-loop lag.** {clients} sessions, each a real coding-agent history of ~{history_tokens:,} tokens, "
        f"are served once; then {clients} clients at once take {turns} short turns each with the RAM tier at 0 "
        "MiB, so every switch writes one session's KV state to disk and reads another's back. Meanwhile the "
        "gateway's own probe (a 10 ms timer, `pflash_event_loop_lag_seconds` on /metrics) records how late "
        "it fires, and a client asks `/health` every 50 ms.\n\n"
        + md_table(["what", "value"], [
            ["turns, errors", f"{load.requests}, {load.errors}"],
            ["state restored from disk", f"{moved:,.0f} MB in {load.seconds:.0f} s"],
            ["turn latency p50 / p99", f"{percentile(load.latencies_ms, 50):,.0f} / {percentile(load.latencies_ms, 99):,.0f} ms"],
            ["loop lag p50 / p99 (histogram bucket bounds, whole run)", f"≤ {1000 * p50:g} / ≤ {1000 * p99:g} ms ({count:,} timers)"],
            ["loop lag p99 before the turns (prefill only)", f"≤ {1000 * before[1]:g} ms"],
            ["/health answers", f"{len(finite)} of {len(health)}; {spread([1000 * h for h in finite], 1)} ms, "
                                f"p99 {percentile([1000 * h for h in finite], 99) if finite else float('nan'):.1f} ms"],
        ])
        + f"\nGoals: loop lag p99 < 50 ms ({'met' if p99 < 0.05 else 'missed'}), every /health under 100 ms "
        f"({'met' if finite and max(finite) < 0.1 and len(finite) == len(health) else 'missed'}).\n\n"
        f"**Memory.** {many:,} sessions (a two-message conversation each, one output token) are created one after "
        f"another and never come back, with the RAM tier at {RAM_BUDGET_MB} MiB. Resident memory of the gateway "
        f"process: {start_mb:,.0f} MiB after start, peak {peak_mb:,.0f} MiB, {spread(last_half, 0)} MiB over the "
        f"second half (median, min–max), against {start_mb + RAM_BUDGET_MB:,.0f} MiB for start plus the RAM "
        "budget.\n\n![resident memory](benchmarks/plots/durability_rss.png)\n"
    )
    return Section(TITLE, text, [plot])
