"""Evidence retention (issue 4, quality half): which gold lines survive compression.

Data: ../shared/data/swe-dev.jsonl.zst (real mini-swe-agent sessions on SWE-bench Verified, with
the lines their verified patch removes: the evidence the agent needed to see). Per session, one
long tool output is built as a terminal log (`$ command`, then its output, in order); a log under
the target size is padded with logs of other sessions of the same repository (other repositories
only when that one runs out), the session's own log placed at a seeded depth, so the evidence is
neither always at the head nor at the tail. A log over the cap is cut to a window holding its
first gold line. The request is the issue (the PR description).

Scorers run through gateway.compressor.MessageCompressor, the serving pipeline (segment, find the
request, score, plan; flat-relevance and no-gain fallbacks included), with `keep_ratio` for the
fixed budgets and without it for the budget curve. Baselines at the same token budgets:
head+tail (half the budget from each end, whole lines) and random units (seeded).

A gold line counts as kept when one of its occurrences in the session's own outputs is shown
(occurrences in the padding do not count); line-number prefixes (`cat -n`, `nl`, `grep -n`) are
ignored when matching.
"""

from __future__ import annotations

import itertools
import random
import re
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from benchmarks.common import (
    BenchContext,
    MemoScorer,
    Section,
    TokenCountCache,
    default_compression_settings,
    load_jsonl_zst,
    md_table,
    mean,
    pct,
    pyplot,
    savefig,
    stable_fraction,
    window_around,
)

TITLE = "Evidence retention on real coding-agent sessions (issue 4)"
DATA = "swe-dev.jsonl.zst"
TABLE_RATIOS = (0.15, 0.27, 0.40)
PLOT_RATIOS = (0.05, 0.10, 0.15, 0.20, 0.27, 0.40, 0.55)
CURVE = "curve"  # the budget curve's own budget (keep_ratio=None)
SCORERS = ("bm25", "drafter", "fusion", "head")
BASELINES = ("head+tail", "random")
GOAL = 0.95

_BASH = re.compile(r"```bash\n(.*?)```", re.DOTALL)
_BODY = re.compile(r"<(output(?:_head|_tail)?)>\n?(.*?)</\1>", re.DOTALL)
# `cat -n` / `nl -ba` ("   71\t") and `grep -n` ("path:71:" or "71:") prefixes in front of a line.
_LINE_PREFIX = re.compile(r"^(?:\s*\d+\t|(?:[\w./-]+[:-])?\d+[:-])")


def gold_key(line: str) -> str:
    return _LINE_PREFIX.sub("", line.rstrip("\r\n"), count=1).strip()


# --- building the long outputs ----------------------------------------------------------------


def terminal_log(record: dict[str, Any]) -> list[str]:
    """The session's tool outputs in order, each after the command that produced it."""
    from policies.rendering import split_lines

    out: list[str] = []
    messages = record["messages"]
    for prev, msg in itertools.pairwise(messages):
        if msg["role"] != "user" or "<returncode>" not in msg["content"] or prev["role"] != "assistant":
            continue
        cmd = _BASH.search(prev["content"])
        command = cmd.group(1).strip() if cmd else ""
        out.append("$ " + (command.splitlines()[0] if command else "") + "\n")
        for m in _BODY.finditer(msg["content"]):
            out.extend(split_lines(m.group(2).rstrip("\n") + "\n"))
    return out


def issue_text(record: dict[str, Any]) -> str:
    """The PR description: the task itself, without mini-swe-agent's instruction boilerplate."""
    text = record["issue"]
    m = re.search(r"<pr_description>(.*?)</pr_description>", text, re.DOTALL)
    body = m.group(1) if m else text
    return re.sub(r"^\s*Consider the following PR description:\s*", "", body).strip()


@dataclass
class Case:
    id: str
    repo: str
    lines: list[str]
    line_tokens: list[int]
    own: list[bool]  # per line: from this session's own outputs (not padding)
    gold: frozenset[str]  # distinct gold lines present in the own lines (gold_key form)
    request: str
    tokens: int  # whole-message count, as the gateway admits it
    own_tokens: int
    padding: str  # "none" | "same repo" | "other repos too"
    tokenize_seconds: float  # line-by-line counting, as segmentation does it

    @property
    def text(self) -> str:
        return "".join(self.lines)


def build_cases(records: list[dict[str, Any]], count: Callable[[str], int], target: int, cap: int,
                limit: int | None, seed: int) -> tuple[list[Case], list[str]]:
    logs = {r["id"]: terminal_log(r) for r in records}
    order = sorted(records, key=lambda r: r["id"])
    repo_of = {r["id"]: r["id"].split("__")[0] for r in records}
    token_cache: dict[str, int] = {}

    def tok(line: str) -> int:
        n = token_cache.get(line)
        if n is None:
            n = token_cache[line] = count(line)
        return n

    cases: list[Case] = []
    skipped: list[str] = []
    for record in order:
        if limit is not None and len(cases) >= limit:
            break
        rid = record["id"]
        golds = {g.strip() for g in record["gold_lines"] if g.strip()}
        own_lines = logs[rid]
        own_toks = [tok(x) for x in own_lines]
        hits = [i for i, x in enumerate(own_lines) if gold_key(x) in golds]
        if not hits:
            skipped.append(f"{rid}: no gold line in its tool outputs")
            continue
        if sum(own_toks) > cap:
            # A window of `cap` tokens holding the first gold line at a seeded depth.
            start, end = window_around(own_toks, hits[0], stable_fraction(seed, rid, "depth"), cap)
            own_lines, own_toks = own_lines[start:end], own_toks[start:end]
        present = frozenset(gold_key(x) for x in own_lines) & golds
        need = target - sum(own_toks)
        pad_lines: list[str] = []
        pad_toks: list[int] = []
        padding = "none"
        if need > 0:
            # Same repository first (same files, same vocabulary: on-topic confusers), rotating so
            # each session gets different neighbours; other repositories only if that runs out.
            same = [r["id"] for r in order if repo_of[r["id"]] == repo_of[rid] and r["id"] != rid]
            other = [r["id"] for r in order if repo_of[r["id"]] != repo_of[rid]]
            k = int(stable_fraction(seed, rid, "rotate") * max(len(same), 1))
            donors = same[k:] + same[:k] + other
            got = 0
            for donor in donors:
                for line in logs[donor]:
                    if got >= need:
                        break
                    pad_lines.append(line)
                    pad_toks.append(tok(line))
                    got += pad_toks[-1]
                if got >= need:
                    padding = "same repo" if donor in same else "other repos too"
                    break
        # The own log goes in at a seeded depth inside the padding.
        cut = int(stable_fraction(seed, rid, "place") * len(pad_lines))
        lines = pad_lines[:cut] + own_lines + pad_lines[cut:]
        own = [False] * cut + [True] * len(own_lines) + [False] * (len(pad_lines) - cut)
        started = time.perf_counter()
        line_tokens = [count(x) for x in lines]  # uncached, to time what the gateway pays
        tokenize_seconds = time.perf_counter() - started
        text = "".join(lines)
        cases.append(Case(rid, repo_of[rid], lines, line_tokens, own, present, issue_text(record),
                          count(text), sum(own_toks), padding, tokenize_seconds))
    return cases, skipped


# --- measuring ----------------------------------------------------------------------------------


@dataclass
class Outcome:
    retention: float  # share of the case's gold lines shown
    served_share: float  # original tokens shown / total (1.0 when served whole)
    compressed: bool
    reason: str


@dataclass
class MethodResult:
    outcomes: dict[str, list[Outcome | None]] = field(default_factory=dict)  # budget key -> per case
    scorer_seconds: list[float] = field(default_factory=list)  # per case (first, unmemoised call)
    total_seconds: list[float] = field(default_factory=list)
    tokens: list[int] = field(default_factory=list)  # per case, for per-1K rates


def retention_of(case: Case, visible: Sequence[tuple[int, int]]) -> float:
    shown = {gold_key(case.lines[i]) for a, b in visible for i in range(a, b + 1) if case.own[i]}
    return len(case.gold & shown) / len(case.gold)


def budget_for(case: Case, key: str, curve: Any) -> int:
    from policies.budget import token_budget

    # The same arithmetic as MessageCompressor.compress.
    return token_budget(case.tokens, curve) if key == CURVE else int(case.tokens * float(key))


def head_tail(case: Case, budget: int) -> list[tuple[int, int]]:
    """Half the budget of whole lines from the head, the rest from the tail."""
    n, head_budget = len(case.lines), budget // 2
    h, used = 0, 0
    while h < n and used + case.line_tokens[h] <= head_budget:
        used += case.line_tokens[h]
        h += 1
    t = n
    while t > h and used + case.line_tokens[t - 1] <= budget:
        used += case.line_tokens[t - 1]
        t -= 1
    ranges = [(0, h - 1)] if h else []
    if t < n:
        ranges.append((t, n - 1))
    return ranges


def random_units(case: Case, budget: int, units: Sequence[Any], seed: int) -> list[tuple[int, int]]:
    from policies.selection import select_units

    rng = random.Random(f"{seed}:{case.id}")  # same draw at every budget: nested selections
    scores = [rng.random() * u.tokens for u in units]  # uniform density: a random order
    return [(units[k].first, units[k].last) for k in select_units(units, scores, budget)]


def run_scorer(case: Case, count: Any, memo: MemoScorer, settings: Any, keys: Sequence[str],
               result: MethodResult) -> None:
    from gateway.compressor import MessageCompressor
    from policies.conversation import Message

    memo.clear()
    counter = TokenCountCache(count)  # cold for the first (timed) call, warm for the budget sweep
    compressor = MessageCompressor(counter, memo, settings)
    messages = [Message("user", case.request), Message("tool", case.text, tool_call_id="call_log", name="bash")]
    first = True
    for key in keys:
        ratio = None if key == CURVE else float(key)
        plan, report = compressor.compress(messages, 1, case.tokens, keep_ratio=ratio)
        if first:  # later budgets re-use the memoised scores: only the first call is timed
            result.scorer_seconds.append(report.scorer_seconds)
            result.total_seconds.append(report.total_seconds)
            result.tokens.append(case.tokens)
            first = False
            counter.warm = True
        visible = plan.kept_ranges if plan.compressed else [(0, len(case.lines) - 1)]
        share = plan.kept_tokens / case.tokens if plan.compressed and case.tokens else 1.0
        result.outcomes.setdefault(key, []).append(
            Outcome(retention_of(case, visible), share, plan.compressed, plan.reason))


def run_baselines(case: Case, keys: Sequence[str], curve: Any, units: Sequence[Any], seed: int,
                  results: dict[str, MethodResult]) -> None:
    for key in keys:
        budget = budget_for(case, key, curve)
        for name, ranges in (("head+tail", head_tail(case, budget)),
                             ("random", random_units(case, budget, units, seed))):
            kept = sum(sum(case.line_tokens[a : b + 1]) for a, b in ranges)
            results[name].outcomes.setdefault(key, []).append(
                Outcome(retention_of(case, ranges), kept / max(case.tokens, 1), True, "baseline"))


# --- the section --------------------------------------------------------------------------------


def _mean_ret(outcomes: Sequence[Outcome | None]) -> float | None:
    return mean([o.retention for o in outcomes if o is not None])


def _cell(outcomes: Sequence[Outcome | None]) -> str:
    done = [o for o in outcomes if o is not None]
    if not done:
        return "n/a"
    whole = sum(not o.compressed for o in done)
    return pct(_mean_ret(done)) + (f" ({whole} whole)" if whole else "")


def run(ctx: BenchContext) -> Section:
    path = ctx.data_file(DATA)
    if path is None:
        return Section(TITLE, f"Skipped: `{ctx.data_dir / DATA}` is missing (see ../shared/data/README.md).\n")
    if ctx.model_path is None:
        return Section(TITLE, f"Skipped: no tokenizer model ({ctx.model_error}).\n")
    from policies.budget import parse_curve
    from policies.segmentation import segment

    settings = default_compression_settings()
    curve = parse_curve(settings.budget_curve)
    target, cap = (4096, 4096) if ctx.quick else (16384, 32768)
    limit = ctx.sessions if ctx.sessions is not None else (10 if ctx.quick else None)
    drafter_limit = ctx.drafter_sessions if ctx.drafter_sessions is not None else (1 if ctx.quick else 30)
    drafter_wall = 45.0 if ctx.quick else 900.0  # drafter scorer: stop adding cases past this

    records = load_jsonl_zst(path)
    started = time.perf_counter()
    cases, skipped = build_cases(records, ctx.count_tokens, target, cap, limit, ctx.seed)
    build_seconds = time.perf_counter() - started
    if not cases:
        return Section(TITLE, "Skipped: no session produced a usable case.\n" + "".join(f"- {s}\n" for s in skipped))

    keys = [CURVE] + [str(r) for r in sorted(set(PLOT_RATIOS) | set(TABLE_RATIOS))]
    results: dict[str, MethodResult] = {name: MethodResult() for name in (*SCORERS, *BASELINES)}
    notes: list[str] = []
    available: list[str] = []
    for name in SCORERS:
        if name != "bm25" and drafter_limit <= 0:  # --drafter-sessions 0: do not even load the model
            notes.append(f"`{name}` rows skipped: --drafter-sessions 0.")
            del results[name]
            continue
        scorer = ctx.scorer(name)
        if scorer is None:
            notes.append(f"`{name}` rows skipped: the scorer did not load ({ctx.scorer_note(name)}).")
            del results[name]
        else:
            available.append(name)

    units_of = {c.id: segment(c.lines, c.line_tokens, settings.min_segment, settings.max_segment) for c in cases}
    for case in ctx.progress(cases, "retention: bm25 + baselines"):
        run_baselines(case, keys, curve, units_of[case.id], ctx.seed, results)
    n_drafter = len(cases)
    for name in available:
        memo = MemoScorer(ctx.scorer(name))
        heavy = name != "bm25"
        todo = cases[: min(drafter_limit, len(cases))] if heavy else cases
        if name in ("fusion", "head") and "drafter" in available:
            # Exactly the sessions the drafter read: fusion then re-uses its cached unit features.
            todo = cases[: len(results["drafter"].tokens)]
        t0 = time.perf_counter()
        for case in ctx.progress(todo, f"retention: {name}"):
            if heavy and time.perf_counter() - t0 > drafter_wall:
                notes.append(f"`{name}` stopped after {len(results[name].tokens)} sessions: its "
                             f"{drafter_wall:.0f} s wall-time cap was reached.")
                break
            run_scorer(case, ctx.count_tokens, memo, settings, keys, results[name])
        if heavy:
            n_drafter = min(n_drafter, len(results[name].tokens))
    # Cases beyond what a heavy scorer read are padded with None so columns stay aligned.
    for name in available:
        for key in keys:
            got = results[name].outcomes.setdefault(key, [])
            got.extend([None] * (len(cases) - len(got)))

    md, plots = _report(ctx, cases, skipped, results, available, keys, n_drafter, notes, target, cap, build_seconds)
    return Section(TITLE, md, plots)


def _report(ctx: BenchContext, cases: list[Case], skipped: list[str], results: dict[str, MethodResult],
            available: list[str], keys: list[str], n_drafter: int, notes: list[str], target: int, cap: int,
            build_seconds: float) -> tuple[str, list[Any]]:
    heavy = [n for n in available if n != "bm25"]
    methods = [n for n in available if n == "bm25"] + list(BASELINES)
    n = len(cases)
    sizes = sorted(c.tokens for c in cases)
    golds = [len(c.gold) for c in cases]
    curve_share = mean([o.served_share for o in results["head+tail"].outcomes[CURVE] if o is not None])
    out: list[str] = []
    out.append(
        f"{n} sessions" + (f" ({len(skipped)} skipped)" if skipped else "")
        + f"; one long tool output each: the session's own terminal log (cap {cap:,} tokens), padded to "
        f"at least {target:,} tokens with other sessions' logs; tokens per output: min {sizes[0]:,}, "
        f"median {int(statistics.median(sizes)):,}, max {sizes[-1]:,}; gold lines per session: "
        f"median {statistics.median(golds):g}, total {sum(golds)}; the session's own log is "
        f"{pct(mean([c.own_tokens / c.tokens for c in cases]), 0)} of each output on average; padding: "
        + ", ".join(f"{sum(c.padding == p for c in cases)} {p}" for p in ("none", "same repo", "other repos too"))
        + ". Request: the issue text (the pipeline's request finder keeps its first and last 64 tokens of 128). "
        f"Segmentation, request finding, flat-relevance and no-gain fallbacks are the serving pipeline's "
        f"(MessageCompressor); `curve` is the default budget curve's budget (≈{pct(curve_share, 0)} of "
        f"these outputs).\n")
    if ctx.quick:
        out.append("**Quick run:** small outputs and few sessions; a smoke test of the benchmark, not a result.\n")

    def rows_for(names: Sequence[str], upto: int) -> list[list[str]]:
        rows = []
        for name in names:
            o = results[name].outcomes
            all_kept = [x for x in o["0.27"][:upto] if x is not None]
            rows.append([f"{name}", str(len(all_kept)), *[_cell(o[k][:upto]) for k in (CURVE, *map(str, TABLE_RATIOS))],
                         str(sum(x.retention >= 1.0 for x in all_kept))])
        return rows

    headers = ["method", "sessions", "curve budget", "15 %", "27 %", "40 %", "sessions with all gold kept at 27 %"]
    out.append("Share of gold lines kept (mean over sessions; a session served whole, e.g. by the "
               "flat-relevance fallback, shows every line and is counted as kept, with the count in "
               "parentheses):\n")
    out.append(md_table(headers, rows_for(methods, n)))
    if heavy:
        sub = n_drafter
        out.append(f"\nDrafter scorers on a fixed subset (the first {sub} sessions by id; the drafter reads "
                   f"every token of every output, so all {n} would take too long on this machine), with "
                   f"every other method on the same {sub} sessions:\n")
        out.append(md_table(headers, rows_for([*heavy, *methods], sub)))
    out.extend(f"\n{note}\n" for note in notes)

    # Pipeline outcomes: how often each scorer stepped aside, and what it really served.
    pipe_rows = []
    for name in available:
        for key in (CURVE, "0.27"):
            done = [o for o in results[name].outcomes[key] if o is not None]
            reasons: dict[str, int] = {}
            for o in done:
                reasons[o.reason] = reasons.get(o.reason, 0) + 1
            pipe_rows.append([name, key if key == CURVE else "27 %", str(len(done)),
                              ", ".join(f"{r}: {c}" for r, c in sorted(reasons.items())),
                              pct(mean([o.served_share for o in done]))])
    out.append("\nWhat the pipeline did (reason per session; tokens served = original lines shown, "
               "note and markers excluded, 100 % when served whole):\n")
    out.append(md_table(["scorer", "budget", "sessions", "outcome", "tokens served"], pipe_rows, "llrlr"))

    # Timings.
    tok_rate = sum(c.tokenize_seconds for c in cases) / max(sum(c.tokens for c in cases), 1) * 1000
    time_rows = [["line-by-line token counting (target tokenizer)", f"{1000 * tok_rate:.1f} ms", "", str(n)]]
    for name in available:
        r = results[name]
        total_tokens = max(sum(r.tokens), 1)
        s_rate = sum(r.scorer_seconds) / total_tokens * 1000
        p_rate = sum(r.total_seconds) / total_tokens * 1000
        time_rows.append([f"{name}: scoring", f"{1000 * s_rate:.1f} ms",
                          f"{sum(r.tokens) / max(sum(r.scorer_seconds), 1e-9):,.0f}", str(len(r.tokens))])
        time_rows.append([f"{name}: whole compress() call (tokenize + segment + score + plan)",
                          f"{1000 * p_rate:.1f} ms", "", str(len(r.tokens))])
    out.append(f"\nCompression cost on this machine (per 1K tokens of the long output; building the "
               f"{n} outputs took {build_seconds:.1f} s):\n")
    out.append(md_table(["step", "time per 1K tokens", "tokens/s", "sessions"], time_rows))
    if "fusion" in available:
        out.append("\nFusion shares the drafter instance with the `drafter` row and runs after it, so its "
                   "unit features are already cached: its scoring time above is the fusion step on a warm "
                   "drafter; a cold fusion call costs about the drafter's time plus that.\n")

    # The all-sessions plot shows only methods run on all sessions; the drafter subset gets its own.
    full_methods = [m for m in (*available, *BASELINES) if m not in heavy or n_drafter >= n]
    plots = [_plot(ctx, results, full_methods, keys, n, "retention_vs_budget.png",
                   f"Gold lines kept vs budget ({n} sessions)")]
    if heavy and n_drafter < n:
        plots.append(_plot(ctx, results, [*available, *BASELINES], keys, n_drafter,
                           "retention_vs_budget_drafter_subset.png",
                           f"Gold lines kept vs budget (drafter subset, {n_drafter} sessions)"))
    for p in plots:
        out.append(f"\n![{p.stem}](benchmarks/plots/{p.name})\n")
    out.append("\n" + _commentary(results, available, heavy, n, n_drafter))
    return "\n".join(out), plots


def _plot(ctx: BenchContext, results: dict[str, MethodResult], names: Sequence[str], keys: Sequence[str],
          upto: int, filename: str, title: str) -> Any:
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(7, 4.5))
    ratios = [k for k in keys if k != CURVE]
    for name in names:
        if name not in results:
            continue
        o = results[name].outcomes
        ys = [_mean_ret(o[k][:upto]) for k in ratios]
        if all(y is None for y in ys):
            continue
        xs = [100 * float(k) for k, y in zip(ratios, ys) if y is not None]
        # Served-whole sessions count as kept: say how many, so a flat line at 100 % is not misread.
        whole = sum(1 for k in ratios for x in o[k][:upto] if x is not None and not x.compressed)
        label = name + (f" ({whole} of {sum(1 for k in ratios for x in o[k][:upto] if x is not None)} "
                        "runs served whole)" if whole else "")
        line, = ax.plot(xs, [100 * y for y in ys if y is not None], marker="o", label=label,
                        linestyle="--" if name in BASELINES else "-")
        curve_done = [x for x in o[CURVE][:upto] if x is not None]
        if curve_done:  # the curve's own budget, at its mean share of the output
            share = mean([x.served_share for x in results["head+tail"].outcomes[CURVE][:upto] if x is not None])
            ax.scatter([100 * (share or 0)], [100 * (_mean_ret(curve_done) or 0)], marker="*", s=120,
                       color=line.get_color(), zorder=3)
    ax.axhline(100 * GOAL, color="grey", linewidth=0.8, linestyle=":")
    ax.axvline(27, color="grey", linewidth=0.8, linestyle=":")
    ax.set_xlabel("budget (% of the output's tokens); ★ = the budget curve")
    ax.set_ylabel("gold lines kept (%)")
    ax.set_ylim(0, 102)
    ax.set_title(title)
    ax.legend(loc="lower right", fontsize=8)
    ax.grid(alpha=0.3)
    return savefig(fig, ctx.plot_path(filename))


def _commentary(results: dict[str, MethodResult], available: list[str], heavy: list[str], n: int,
                n_drafter: int) -> str:
    def at27(name: str, upto: int) -> float | None:
        return _mean_ret(results[name].outcomes["0.27"][:upto]) if name in results else None

    lines = ["**Reading the numbers.**"]
    bm, ht, rnd = at27("bm25", n), at27("head+tail", n), at27("random", n)
    if bm is not None:
        verdict = "meets" if bm >= GOAL else "falls short of"
        lines.append(f"- At 27 %, BM25 keeps {pct(bm)} of gold lines against head+tail {pct(ht)} and random "
                     f"{pct(rnd)}; it {verdict} the issue's goal of {pct(GOAL, 0)}.")
    for name in heavy:
        d, b_sub, ht_sub = at27(name, n_drafter), at27("bm25", n_drafter), at27("head+tail", n_drafter)
        if d is None:
            continue
        verdict = "meets" if d >= GOAL else "falls short of"
        lines.append(f"- `{name}` keeps {pct(d)} at 27 % on its {n_drafter}-session subset (BM25 {pct(b_sub)}, "
                     f"head+tail {pct(ht_sub)} on the same sessions); it {verdict} the {pct(GOAL, 0)} goal.")
    for name in ("bm25", *heavy):
        if name not in results:
            continue
        done = [o for o in results[name].outcomes["0.27"] if o is not None]
        whole = [o for o in done if not o.compressed]
        if whole:
            reasons = sorted({o.reason.split(":")[0] for o in whole})
            lines.append(f"- `{name}` served {len(whole)} of its {len(done)} outputs whole at 27 % "
                         f"({', '.join(reasons)}): those count as 100 % kept but at 100 % of the tokens, i.e. "
                         "no compression happened; read its retention with that in mind.")
    if not heavy:
        lines.append("- No drafter row (see the notes above for why), so the goal \"well above BM25\" cannot be "
                     "judged from this run.")
    lines.append("- Random keeps about the budget's share of gold lines, as it should; head+tail depends on "
                 "where the evidence sits (the session's log is placed at a seeded depth inside the padding, "
                 "so head+tail sees it only when it lands near an end).")
    lines.append("- The padding comes from other sessions of the same repository: same files, same names, "
                 "often the same functions read in a different bug's context. That is a harder, more realistic "
                 "distractor than unrelated text, and gold lines seen only in padding do not count.")
    lines.append("- The request finder scores the issue's first and last 64 tokens (its title and its ask); "
                 "the middle of a long issue is not scored.")
    # The default scorer is chosen here, on equal budgets and equal sessions, cost counted.
    subset = {name: at27(name, n_drafter) for name in ("bm25", *heavy)}
    ranked = sorted((v, k) for k, v in subset.items() if v is not None)
    if ranked:
        best = ranked[-1][1]
        verdict = ("It does not on this data." if best == "bm25" else
                   f"`{best}` does here: weigh its gain against its drafter time before changing the default.")
        lines.append(f"- **Default scorer: `bm25`.** On the sessions every scorer read, the best at 27 % is "
                     f"`{best}` ({pct(ranked[-1][0])}); the drafter scorers cost seconds of drafter time per "
                     "long output (see the timing section) where BM25 costs milliseconds, so a drafter scorer "
                     f"would have to keep clearly more evidence to be the default. {verdict}")
    return "\n".join(lines) + "\n"
