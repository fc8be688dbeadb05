"""Resume after a restart: time to first token for a session restored from disk (page cache warm
and evicted) against a full prefill of the same history, bytes on disk per token, store times."""

from __future__ import annotations

import statistics

from benchmarks.common import BenchContext, Section, coding_sessions, md_table, plot_repeated, pyplot, savefig, spread
from benchmarks.timing import ResumeResult, agent_history, measure_resume

TITLE = "Session resume after restart"
REPS = 5
GOALS = {16384: 100, 30720: 150}  # issue 14: speed-up of a resume from a cold disk over a full prefill


def run(ctx: BenchContext) -> Section:
    sessions = coding_sessions(ctx, TITLE)
    if isinstance(sessions, Section):
        return sessions
    sizes, reps = ([2048], 2) if ctx.quick else ([4096, 16384, 30720], REPS)
    results: list[ResumeResult] = []
    for size in ctx.progress(sizes, "resume"):
        history = agent_history(sessions, size, ctx.count_tokens)
        results.append(measure_resume(ctx.model_path, ctx.cache_dir / "work", history, 32768, reps, lambda _m: None))
    timing_rows, disk_rows = [], []
    for r in results:
        full, cold, warm = (statistics.median(v) for v in (r.full_s, r.cold_s, r.warm_s))
        timing_rows.append([f"{r.tokens:,}", spread(r.full_s), spread(r.cold_s, 3), spread(r.warm_s, 3),
                            f"{full / cold:.0f}×", f"{full / warm:.0f}×",
                            ", ".join(f"{t} ×{r.restored_from.count(t)}" for t in sorted(set(r.restored_from)))])
        disk_rows.append([f"{r.tokens:,}", f"{r.kv_raw_bytes / r.kv_tokens / 1024:.1f}",
                          f"{r.kv_zstd_plain_bytes / r.kv_tokens / 1024:.1f}",
                          f"{r.kv_zstd_planes_bytes / r.kv_tokens / 1024:.1f}",
                          f"{r.kv_raw_bytes / r.kv_zstd_planes_bytes:.2f}×", spread([s * 1000 for s in r.store_save_s], 0),
                          spread([s * 1000 for s in r.store_load_s], 0)])
    resumed_new = [n for r in results for n in r.new_tokens]
    new_tokens = f"{statistics.median(resumed_new):.0f}" if resumed_new else "n/a"
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(6, 3.5))
    xs = [r.tokens for r in results]
    for label, pick in (("full prefill", "full_s"), ("resume, cold page cache", "cold_s"),
                        ("resume, warm page cache", "warm_s")):
        plot_repeated(ax, xs, [getattr(r, pick) for r in results], label)
    ax.set_xlabel("session history (tokens)")
    ax.set_ylabel("time to first token (s), median, min–max")
    ax.set_yscale("log")
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3)
    plot = savefig(fig, ctx.plot_path("resume_ttft.png"))
    verdicts = []
    for size, r in zip(sizes, results):
        if size in GOALS:
            ratio = statistics.median(r.full_s) / statistics.median(r.cold_s)
            verdicts.append(f"at {r.tokens:,} tokens {ratio:.0f}× ({'meets' if ratio >= GOALS[size] else 'misses'} "
                            f"the {GOALS[size]}× goal)")
    text = (
        "A real coding-agent history (mini-swe-agent sessions from ../shared/data, stitched to size) "
        "is served once and the server is stopped with SIGTERM (it flushes the session's KV state to "
        f"disk). Then, {reps} times and interleaved (the first path rotating), the session's next turn "
        "is timed to its first streamed token on: a new server over a copy of that store whose files "
        "were evicted from the page cache (fsync, then POSIX_FADV_DONTNEED): a resume from a cold disk; "
        "a new server over a fresh copy still in the page cache; and a server with an empty store: the "
        "full-prefill baseline. All requests are identical; greedy decoding. Times are median "
        "(min–max) in seconds; the speed-ups are ratios of medians.\n\n"
        + md_table(["history tokens", "full prefill s", "resume cold s", "resume warm s", "speed-up cold",
                    "speed-up warm", "restored from"], timing_rows)
        + "\nA resume from a cold disk gave the first token sooner than a full prefill "
        + ("; ".join(verdicts) or "(no size with a goal in this run)") + ". A resume includes reading and "
        "checking the KV file, restoring the sequence state into llama.cpp and prefilling the new turn "
        f"({new_tokens} tokens not covered by the restored state, median over the resumed turns).\n\nThe state on disk (sizes are exact; store times are the store's own save and load of "
        f"this state outside the server, median (min–max) of {reps}, the load from a cold page cache):\n\n"
        + md_table(["history tokens", "KV KiB/token raw", "zstd KiB/token", "stored KiB/token",
                    "compression", "store save ms", "store load ms"], disk_rows)
        + "\nf16 KV barely compresses with plain zstd. The store splits each 16-bit value into a plane of "
        "low bytes, near random and stored raw, and a plane of high bytes, stored as a zstd frame: the "
        "`stored` column, and the ratio beside it. Raw low bytes cost a resume no decompression.\n\n"
        "![resume](benchmarks/plots/resume_ttft.png)\n"
    )
    return Section(TITLE, text, [plot])
