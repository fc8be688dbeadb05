"""Time to first token for an agent turn that brings one long new tool output: compressed
(scorer time included) against full prefill, on the same input, in one run."""

from __future__ import annotations

from typing import Any

from benchmarks.common import BenchContext, Section, load_jsonl_zst, md_table, pyplot, savefig
from benchmarks.timing import TtftResult, measure_ttft


def terminal_log(sessions: list[dict[str, Any]], target_tokens: int, count: Any) -> str:
    """Tool outputs of real sessions as one terminal log of about target_tokens."""
    parts: list[str] = []
    total = 0
    for session in sessions:
        for message in session["messages"]:
            if message["role"] != "user" or not message["content"].startswith("<returncode>"):
                continue
            tokens = count(message["content"])
            if total + tokens > target_tokens:
                continue
            parts.append(message["content"])
            total += tokens
            if total > target_tokens * 0.97:
                return "\n".join(parts)
    return "\n".join(parts)


def run(ctx: BenchContext) -> Section:
    if ctx.model_path is None:
        return Section("Time to first token with compression", f"Skipped: no model ({ctx.model_error}).")
    data = ctx.data_file("swe-dev.jsonl.zst")
    if data is None:
        return Section("Time to first token with compression", "Skipped: swe-dev data missing.")
    sessions = load_jsonl_zst(data)
    sizes = [17000] if ctx.quick else [17000, 31000]
    scorers = ["bm25"] if ctx.quick else ["bm25", "fusion"]
    results: list[TtftResult] = []
    for size in ctx.progress(sizes, "ttft sizes"):
        output = terminal_log(sessions, size, ctx.count_tokens)
        request = sessions[0]["issue"][:2000]
        # The drafter's cost is shown at the first size; at the largest, a full prefill takes minutes.
        for scorer in scorers if size == sizes[0] else scorers[:1]:
            results.append(measure_ttft(ctx.model_path, ctx.cache_dir / "work", output, request, 32768, scorer,
                                        lambda _m: None))
    rows = [[f"{r.tool_tokens:,}", r.scorer, f"{r.full_s:.1f}", f"{r.compressed_s:.1f}", f"{r.scorer_s:.2f}",
             f"{r.kept_tokens:,}", f"{r.full_s / r.compressed_s:.2f}×"] for r in results]
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(6, 3.5))
    for scorer in scorers:
        pts = [r for r in results if r.scorer == scorer]
        ax.plot([r.tool_tokens for r in pts], [r.compressed_s for r in pts], "o-", label=f"compressed ({scorer})")
    base = {r.tool_tokens: r.full_s for r in results}
    ax.plot(sorted(base), [base[k] for k in sorted(base)], "o-", label="full prefill")
    ax.set_xlabel("new tool output (tokens)")
    ax.set_ylabel("time to first token (s)")
    ax.legend()
    ax.grid(alpha=0.3)
    plot = savefig(fig, ctx.plot_path("ttft_compression.png"))
    text = (
        "One agent turn whose new tool output is a terminal log of real sessions' outputs (request: "
        "the session's issue). Each row is two fresh gateways on the same input: one with the "
        "default threshold (16,384: the output is compressed along the default budget curve), one "
        "with the threshold out of reach (full prefill). Time to first streamed token, scorer time "
        "included; the context is 32,768 tokens, the model's limit, so the largest input is ~31K.\n\n"
        + md_table(["tool output tokens", "scorer", "full prefill s", "compressed s", "scorer s",
                    "served tokens", "speed-up"], rows)
    )
    return Section("Time to first token with compression", text, [plot])
