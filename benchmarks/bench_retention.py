"""Evidence retention (issue 12): which gold lines survive compression, on the frozen test split.

Data: ../shared/data/swe-dev + swe-train (real mini-swe-agent sessions on SWE-bench Verified, with
the lines their verified patch removes: the evidence the agent needed to see), test split of
benchmarks/training/splits.json only (no scorer setting was tuned on it). Long outputs are built by
benchmarks.training.agent_data (the same builders `benchmarks.train head` uses on the other splits), two shapes per
session, both padded with same-repository outputs of other test sessions to just over the
compression threshold:

- `session log`: the whole session as one terminal log; request: the task.
- `tool output`: the session's longest evidence-bearing tool output; request: the agent's asking
  turn (its thought and command, as a tool call) plus the task, as serving sees it; and, to
  measure the request finder, the task alone; and in mini-swe-agent's own shape, the output a user
  message in its wrapper after the whole session as sent (the request finder must find the turn).

Every output goes through admission (≥ threshold tokens, new) and then the serving pipeline,
gateway.compressor.MessageCompressor (segment, find the request, score, plan; flat-relevance and
no-gain fallbacks included), at 15 / 27 / 40 % and at the budget curve's budget. Baselines at the
same budgets: head+tail and random units (seeded). A gold line counts as kept when one of its
occurrences in the session's own text is shown (padding does not count); line-number prefixes are
ignored. Shares are means over outputs with bootstrap 95 % intervals that resample whole sessions
(benchmarks/intervals.py).
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Sequence
from typing import Any

from engine.scoring.bundle import bundle_of
from benchmarks.intervals import bootstrap, pooled_cell, verdict
from benchmarks.common import (
    BenchContext,
    MemoBundle,
    Section,
    TokenCountCache,
    default_compression_settings,
    md_table,
    mean,
    pct,
    pyplot,
    savefig,
)
from benchmarks.retention_cases import (
    AS_USER,
    Case,
    MethodResult,
    Outcome,
    gold_line_cell,
    head_tail,
    make_cases,
    measured_at,
    outcome,
    own_ranges,
    paired_gain,
    random_units,
    retentions,
    session_of,
    share_cell,
    values_at,
)
from benchmarks.training.agent_data import MARGIN, build_long_outputs, load_jsonl_zst

TITLE = "Evidence retention on real coding-agent sessions, test split (issue 12)"
DATA = ("swe-dev.jsonl.zst", "swe-train.jsonl.zst")
TABLE_RATIOS = (0.15, 0.27, 0.40)
PLOT_RATIOS = (0.05, 0.10, 0.15, 0.20, 0.27, 0.40, 0.55)
CURVE = "curve"  # the budget curve's own budget (keep_ratio=None)
LIGHT = ("ranker", "ranker-words", "bm25", "embed", "hybrid")  # scorers run on every output
HEAVY = ("drafter", "fusion", "head")  # drafter reads: a subset only
BASELINES = ("head+tail", "random")
# Issue 40's goals: at 27 % and at 15 % of the tokens, and over BM25 at 27 %.
GOAL, GOAL_15, GOAL_OVER_BM25 = 0.95, 0.85, 0.20
CURVE_POINTS = (20_000, 30_000)  # where the default curve's kept share is stated


def run_scorer(case: Case, count: Any, memo: MemoBundle, settings: Any, keys: Sequence[str],
               result: MethodResult) -> None:
    from gateway.compressor import MessageCompressor

    memo.clear()
    counter = TokenCountCache(count)
    compressor = MessageCompressor(counter, memo.bundle, settings)
    index = len(case.messages) - 1
    tokens = case.message_tokens or case.tokens
    for k, key in enumerate(keys):
        plan, report = compressor.compress(case.messages, index, tokens,
                                           keep_ratio=None if key == CURVE else float(key))
        if k == 0:  # later budgets re-use the memoised scores: only the first call is timed
            result.scorer_seconds.append(report.scorer_seconds)
            result.tokens.append(case.tokens)
            counter.warm = True
        n_lines = len(case.line_tokens)
        visible = own_ranges(plan.kept_ranges, case.offset, n_lines) if plan.compressed else [(0, n_lines - 1)]
        share = plan.kept_tokens / tokens if plan.compressed and tokens else 1.0
        result.outcomes.setdefault(key, []).append(outcome(case, visible, share, plan.compressed, plan.reason))


def run(ctx: BenchContext) -> Section:
    paths = [ctx.data_file(name) for name in DATA]
    if not any(paths):
        return Section(TITLE, f"Skipped: no session data in `{ctx.data_dir}` (see ../shared/data/README.md).\n")
    if ctx.model_path is None:
        return Section(TITLE, f"Skipped: no tokenizer model ({ctx.model_error}).\n")
    from benchmarks.training.splits import split_of
    from policies.admission import admit
    from policies.budget import parse_curve, token_budget
    from policies.segmentation import segment

    settings = default_compression_settings()
    curve = parse_curve(settings.budget_curve)
    records = [r for p in paths if p is not None for r in load_jsonl_zst(p)]
    chosen = [r for r in records if split_of("swe", r["id"]) == ctx.split]
    limit = ctx.sessions if ctx.sessions is not None else (4 if ctx.quick else None)
    chosen = sorted(chosen, key=lambda r: r["id"])[:limit]
    threshold = 2048 if ctx.quick else settings.threshold
    started = time.perf_counter()
    outputs = build_long_outputs(chosen, [r for r in records if split_of("swe", r["id"]) == ctx.split],
                                 ctx.count_tokens, int(threshold * MARGIN), 32768, ctx.seed)
    cases = make_cases(outputs, ctx.count_tokens)
    refused = [c for c in cases if not admit(c.tokens, threshold, True, "tool").compress]
    cases = [c for c in cases if c not in refused]
    build_seconds = time.perf_counter() - started
    if not cases:
        return Section(TITLE, "Skipped: no session produced a usable output.\n")

    keys = [CURVE] + [str(r) for r in sorted(set(PLOT_RATIOS) | set(TABLE_RATIOS))]
    scorers = [name for name in (*LIGHT, *HEAVY) if ctx.runs(name)]
    results: dict[str, MethodResult] = {name: MethodResult() for name in (*scorers, *BASELINES)}
    notes: list[str] = []
    for case in ctx.progress(cases, "retention: baselines"):
        units = segment(case.output.lines, case.line_tokens, settings.min_segment, settings.max_segment)
        for key in keys:
            budget = token_budget(case.tokens, curve) if key == CURVE else int(case.tokens * float(key))
            for name, ranges in (("head+tail", head_tail(case.line_tokens, budget)),
                                 ("random", random_units(units, budget, f"{ctx.seed}:{case.output.id}"))):
                kept = sum(sum(case.line_tokens[a : b + 1]) for a, b in ranges)
                results[name].outcomes.setdefault(key, []).append(
                    outcome(case, ranges, kept / max(case.tokens, 1), True, "baseline"))
    heavy_limit = ctx.drafter_sessions if ctx.drafter_sessions is not None else (1 if ctx.quick else 6)
    for name in scorers:
        heavy = name in HEAVY
        if heavy and heavy_limit <= 0:
            notes.append(f"`{name}` rows skipped: --drafter-sessions 0.")
            del results[name]
            continue
        scorer = ctx.scorer(name)
        if scorer is None:
            notes.append(f"`{name}` rows skipped: the scorer did not load ({ctx.scorer_note(name)}).")
            del results[name]
            continue
        todo = cases[: heavy_limit] if heavy else cases
        memo = MemoBundle(bundle_of(scorer))
        for case in ctx.progress(todo, f"retention: {name}"):
            run_scorer(case, ctx.count_tokens, memo, settings, keys, results[name])
        for key in keys:
            got = results[name].outcomes.setdefault(key, [])
            got.extend([None] * (len(cases) - len(got)))
    md, plots = _report(ctx, cases, refused, results, keys, notes, threshold, build_seconds, heavy_limit)
    return Section(TITLE, md, plots, raw=_samples(cases, results, keys))


def _samples(cases: Sequence[Case], results: dict[str, MethodResult], keys: Sequence[str]) -> list[dict[str, Any]]:
    """Every output with its session and each method's outcome per budget (null: not run on it)."""
    def told(o: Outcome | None) -> dict[str, Any] | None:
        return None if o is None else {"kept": o.retention, "served_share": o.served_share,
                                       "compressed": o.compressed, "named": o.named, "unnamed": o.unnamed}

    return [{"output": c.output.id, "session": session_of(c), "repo": c.output.repo, "kind": c.output.kind,
             "request": c.request, "tokens": c.tokens, "gold_lines": len(c.output.gold),
             "methods": {name: {key: told(r.outcomes[key][i]) for key in keys} for name, r in results.items()}}
            for i, c in enumerate(cases)]


def _report(ctx: BenchContext, cases: list[Case], refused: list[Case], results: dict[str, MethodResult],
            keys: list[str], notes: list[str], threshold: int, build_seconds: float, heavy_limit: int
            ) -> tuple[str, list[Any]]:
    outputs = {c.output.id: c.output for c in cases}
    sizes = sorted(c.tokens for c in cases)
    repos = sorted({o.repo for o in outputs.values()})
    golds = [len(o.gold) for o in outputs.values()]
    groups: dict[str, list[int]] = {}
    for i, c in enumerate(cases):
        groups.setdefault(c.label, []).append(i)
    serving = [i for i, c in enumerate(cases) if c.request in ("agent turn", "task")]  # what serving sees
    out = [
        f"{len(outputs)} long outputs from {len({o.id.split('#')[0] for o in outputs.values()})} {ctx.split}-split sessions "
        f"of {len(repos)} repositories ({', '.join(repos)}); tokens per output: min {sizes[0]:,}, median "
        f"{int(statistics.median(sizes)):,}, max {sizes[-1]:,} (all admitted at the {threshold:,}-token threshold"
        + (f"; {len(refused)} refused by admission and left out" if refused else "")
        + f"); gold lines per output: median {statistics.median(golds):g}, total {sum(golds)}. "
        "Outputs as serving sees them: session logs with the task as request, tool outputs with the agent's "
        "asking turn. Means over outputs; 95 % intervals by a bootstrap that resamples whole sessions (the "
        "outputs of one session share its repository, task and padding, so they are not independent).\n"]
    if ctx.quick:
        out.append("**Quick run:** small outputs and few sessions; a smoke test of the benchmark, not a result.\n")
    light = [n for n in LIGHT if n in results]
    heavy = [n for n in HEAVY if n in results]
    rows = []
    for name in [*light, *BASELINES]:
        vals = {k: values_at(results[name], k, serving) for k in (CURVE, *map(str, TABLE_RATIOS))}
        whole = sum(1 for i in serving if (o := results[name].outcomes["0.27"][i]) is not None and not o.compressed)
        rows.append([name, str(len(vals["0.27"])), pct(mean(vals[CURVE])), share_cell(results[name], "0.15", serving, cases),
                     share_cell(results[name], "0.27", serving, cases), gold_line_cell(results[name], "0.27", serving, cases),
                     pct(mean(vals["0.4"])), str(whole)])
    out.append("Share of gold lines kept (outputs as serving sees them; served-whole outputs count as kept), the "
               "mean over outputs and, beside it, the share of all gold lines (an output with many gold lines "
               "counts for more):\n")
    out.append(md_table(["method", "outputs", "curve budget", "15 % (95 % CI)", "27 % (95 % CI)",
                         "27 %, per gold line (95 % CI) of n", "40 %", "served whole at 27 %"], rows))
    occ_rows = []
    for name in [*light, *BASELINES]:
        measured = measured_at(results[name], "0.27", serving)
        got, sessions = [o for _, o in measured], [session_of(cases[i]) for i, _ in measured]
        occ_rows.append([name, pooled_cell([(o.named[0] + o.unnamed[0], o.named[1] + o.unnamed[1]) for o in got],
                                           sessions),
                         pooled_cell([o.named for o in got], sessions), pooled_cell([o.unnamed for o in got], sessions)])
    out.append("\nGold counted per occurrence at 27 % (a line that appears three times counts three times), and "
               "apart for the occurrences whose line the request itself names verbatim (the easy ones: any "
               "lexical scorer finds them) and the rest. Shares of all occurrences, intervals resampling sessions:\n")
    out.append(md_table(["method", "all occurrences (95 % CI) of n", "named in the request", "not named"], occ_rows))
    own_shape = [i for i, c in enumerate(cases) if c.request == AS_USER]
    if own_shape:
        shape_rows = []
        for name in [*light, *BASELINES]:
            vals = {k: values_at(results[name], k, own_shape) for k in (CURVE, *map(str, TABLE_RATIOS))}
            shape_rows.append([name, str(len(vals["0.27"])), pct(mean(vals[CURVE])),
                               share_cell(results[name], "0.15", own_shape, cases),
                               share_cell(results[name], "0.27", own_shape, cases), pct(mean(vals["0.4"]))])
        out.append("\nThe same tool outputs in the agent's own shape: mini-swe-agent sends every output as a user "
                   "message in its `<returncode>`/`<output>` wrapper, so the long one arrives after the whole session "
                   "as it was sent (earlier outputs, warnings and format complaints included), and the request finder "
                   "must find the agent's turn by content (policies/observations.py):\n")
        out.append(md_table(["method", "outputs", "curve budget", "15 % (95 % CI)", "27 % (95 % CI)", "40 %"],
                            shape_rows))
    by_rows = []
    for label, idx in groups.items():
        for name in [*light, "head+tail"]:
            by_rows.append([label, name, str(len(idx)), share_cell(results[name], "0.27", idx, cases)])
    out.append("\nBy output shape and request, at 27 %:\n")
    out.append(md_table(["output, request", "method", "outputs", "27 % (95 % CI)"], by_rows, "llrr"))
    if "bm25" in results:
        diff_rows = []
        base = results["bm25"]
        for name in [n for n in light if n != "bm25"]:
            count, point, (lo, hi) = paired_gain(results[name], base, "0.27", serving, cases)
            diff_rows.append([name, str(count), f"{100 * point:+.1f} points ({100 * lo:+.1f}…{100 * hi:+.1f})"])
        if diff_rows:
            out.append("\nPaired difference against BM25 at 27 % (same outputs):\n")
            out.append(md_table(["scorer", "outputs", "gain over bm25 (95 % CI)"], diff_rows))
    if heavy:
        sub = list(range(min(heavy_limit, len(cases))))
        rows = [[name, str(len(values_at(results[name], "0.27", sub))), share_cell(results[name], "0.27", sub, cases)]
                for name in [*heavy, *light]]
        out.append(f"\nDrafter scorers read every token through the 270M model (seconds per output): on the first "
                   f"{len(sub)} outputs only, every other scorer on the same outputs:\n")
        out.append(md_table(["scorer", "outputs", "27 % (95 % CI)"], rows))
    out.extend(f"\n{note}\n" for note in notes)
    time_rows = []
    for name in (*light, *heavy):
        r = results[name]
        if r.tokens:
            rate = sum(r.scorer_seconds) / max(sum(r.tokens), 1) * 1000
            time_rows.append([name, f"{1000 * rate:.1f} ms", f"{sum(r.tokens) / max(sum(r.scorer_seconds), 1e-9):,.0f}",
                              str(len(r.tokens))])
    out.append(f"\nScoring cost on this machine, per 1K tokens of the long output, as this run met the outputs "
               f"(building them took {build_seconds:.1f} s). Unit vectors and drafter features are cached as serving "
               "caches them, so a second request on the same output pays only for the request, and `hybrid`, `fusion` "
               "and `head` re-use what `embed` and `drafter` read before them: from cold, `hybrid` costs about "
               "`embed` plus `bm25`, `fusion` `drafter` plus `bm25`, `head` `drafter` plus `embed`. The "
               "time-to-first-token section measures the default scorer from cold:\n")
    out.append(md_table(["scorer", "time per 1K tokens", "tokens/s", "outputs"], time_rows))
    plot = _plot(ctx, results, [*light, *BASELINES], keys, serving)
    out.append(f"\n![{plot.stem}](benchmarks/plots/{plot.name})\n")
    out.append("\n" + _commentary(results, light, serving, own_shape, cases))
    return "\n".join(out), [plot]


def _plot(ctx: BenchContext, results: dict[str, MethodResult], names: Sequence[str], keys: Sequence[str],
          idx: Sequence[int]) -> Any:
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(7, 4.5))
    ratios = [k for k in keys if k != CURVE]
    for name in names:
        ys = [mean(values_at(results[name], k, idx)) for k in ratios]
        ax.plot([100 * float(k) for k in ratios], [100 * (y or 0) for y in ys], marker="o", label=name,
                linestyle="--" if name in BASELINES else "-")
    ax.axhline(100 * GOAL, color="grey", linewidth=0.8, linestyle=":")
    ax.axvline(27, color="grey", linewidth=0.8, linestyle=":")
    ax.set_xlabel("budget (% of the output's tokens)")
    ax.set_ylabel("gold lines kept (%)")
    ax.set_ylim(0, 102)
    ax.set_title(f"Gold lines kept vs budget ({len(idx)} outputs, {ctx.split} split)")
    ax.legend(loc="lower right", fontsize=8)
    ax.grid(alpha=0.3)
    return savefig(fig, ctx.plot_path("retention_vs_budget.png"))


def _goal_line(results: dict[str, MethodResult], idx: Sequence[int], cases: Sequence[Case], what: str) -> str:
    """The default scorer against issue 40's goals on the outputs `idx`, each verdict read with its
    session-resampled interval."""
    if "ranker" not in results or "bm25" not in results or not idx:
        return ""

    def share(name: str, key: str) -> tuple[float, tuple[float, float]]:
        values, groups = retentions(results[name], key, idx, cases)
        return mean(values) or 0.0, bootstrap(values, groups=groups)

    def told(goal: float, point: float, interval: tuple[float, float], points: bool = False) -> str:
        shown = (f"{100 * point:+.1f} ({100 * interval[0]:+.1f}…{100 * interval[1]:+.1f})" if points else
                 f"{pct(point)} ({pct(interval[0], 0)}–{pct(interval[1], 0)})")
        return f"{shown}, {verdict(point, interval, goal)}"

    _, gain, gain_interval = paired_gain(results["ranker"], results["bm25"], "0.27", idx, cases)
    verdicts = [f"≥ {pct(GOAL, 0)} at 27 %: " + told(GOAL, *share("ranker", "0.27")),
                f"≥ {pct(GOAL_15, 0)} at 15 %: " + told(GOAL_15, *share("ranker", "0.15")),
                f"≥ {100 * GOAL_OVER_BM25:.0f} points over BM25 at 27 %: " + told(GOAL_OVER_BM25, gain, gain_interval,
                                                                                   points=True)]
    return f"- The default `ranker` on {what} ({len(idx)} outputs): " + "; ".join(verdicts) + "."


def _commentary(results: dict[str, MethodResult], light: Sequence[str], idx: Sequence[int],
                own_shape: Sequence[int], cases: Sequence[Case]) -> str:
    from policies.budget import DEFAULT_CURVE_SPEC, parse_curve, token_budget

    at = {name: mean(values_at(results[name], "0.27", idx)) for name in (*light, *BASELINES) if name in results}
    lines = ["**Reading the numbers.**"]
    best = max((n for n in light if at.get(n) is not None), key=lambda n: at[n] or 0.0, default=None)
    if best is not None and at.get("bm25") is not None:
        lines.append(f"- At 27 % the best scorer is `{best}` ({pct(at[best])}; BM25 {pct(at['bm25'])}, head+tail "
                     f"{pct(at.get('head+tail'))}, random {pct(at.get('random'))}).")
    tools_only = [i for i in idx if cases[i].output.kind == "tool_output"]
    lines.extend(line for line in (
        _goal_line(results, idx, cases, "outputs as serving sees them"),
        # Session logs hold the fix itself, and their gold is the lines it removes: a feature that reads
        # whether a later command edits a file comes close to reading the label there.
        _goal_line(results, tools_only, cases, "tool outputs alone, without the session logs (whose gold is "
                   "the lines the fix removes, and which contain the fix)"),
        _goal_line(results, own_shape, cases, "tool outputs in the agent's own shape")) if line)
    curve = parse_curve(DEFAULT_CURVE_SPEC)
    lines.append("- The default budget curve (`" + DEFAULT_CURVE_SPEC + "`) keeps " + " and ".join(
        f"{pct(token_budget(n, curve) / n)} of a {n:,}-token output" for n in CURVE_POINTS)
        + "; the `curve budget` column is retention at that budget.")
    lines.append("- Padding comes from other test sessions of the same repository: same files and names, the "
                 "hardest distractors; gold lines seen only in padding do not count.")
    lines.append("- `task alone` rows measure the request finder: the same outputs ranked against the task "
                 "without the agent's asking turn.")
    lines.append("- `ranker` scores an output with the weight set of its kind: tool outputs whose call the request "
                 "finder found, with the set fitted on those; session logs and `task alone` rows (no call, and the padding "
                 "makes both read as transcripts: policies/transcript.py), with the set fitted on those, which adds "
                 "the share of a unit's lines the message shows again elsewhere. `ranker` (the default) reads each "
                 "unit's meaning too (the sentence encoder's cosine with the request, a set fitted with it); "
                 "`ranker-words` is the same ranker without an encoder (`ranker_embedder` off, or no encoder), "
                 "on its lexical weights alone.")
    return "\n".join(lines) + "\n"
