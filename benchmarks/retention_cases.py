"""The retention benchmark's cases (one long output, as serving sees it, with its request) and
what a method kept of each: the outcome per case, the baselines' choices, and the shares and
intervals read from the outcomes (intervals resample whole sessions)."""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from benchmarks.intervals import bootstrap, ci_cell, pooled_cell
from benchmarks.training.agent_data import WRAPPER_LINES, LongOutput, gold_key, gold_shown, serving_messages


@dataclass
class Case:
    output: LongOutput
    request: str  # "agent turn" | "task alone" | "task"
    messages: list[Any]
    line_tokens: list[int]
    tokens: int  # of the output's own lines
    offset: int = 0  # lines of the compressed message before the output's own (its wrapper)
    message_tokens: int = 0  # of the compressed message, wrapper included (0: tokens)

    @property
    def label(self) -> str:
        return f"{self.output.kind.replace('_', ' ')}, {self.request}"

    @property
    def request_text(self) -> str:
        """What the request says, where a verbatim gold line would be named."""
        o = self.output
        return "\n".join((o.task, o.thought, o.command)) if self.request.startswith("agent turn") else o.task


@dataclass
class Outcome:
    retention: float
    served_share: float  # original tokens shown / total (1.0 when served whole)
    compressed: bool
    reason: str
    # Gold counted per occurrence (a gold line may appear several times), split by whether the
    # request names the line verbatim (finding those is easy) or not: (shown, all) each.
    named: tuple[int, int] = (0, 0)
    unnamed: tuple[int, int] = (0, 0)


@dataclass
class MethodResult:
    outcomes: dict[str, list[Outcome | None]] = field(default_factory=dict)  # budget key -> per case
    scorer_seconds: list[float] = field(default_factory=list)
    tokens: list[int] = field(default_factory=list)


AS_USER = "agent turn, output as user message"


def make_cases(outputs: Sequence[LongOutput], count: Any) -> list[Case]:
    cases = []
    for out in outputs:
        line_tokens = [count(x) for x in out.lines]
        tokens = count(out.text)
        if out.kind != "tool_output":
            cases.append(Case(out, "task", serving_messages(out), line_tokens, tokens))
            continue
        cases.append(Case(out, "agent turn", serving_messages(out), line_tokens, tokens))
        cases.append(Case(out, "task alone", serving_messages(out, with_turn=False), line_tokens, tokens))
        as_user = serving_messages(out, as_user=True)
        cases.append(Case(out, AS_USER, as_user, line_tokens, tokens, WRAPPER_LINES, count(as_user[-1].content)))
    return cases


def own_ranges(ranges: Sequence[tuple[int, int]], offset: int, n_lines: int) -> list[tuple[int, int]]:
    """Kept ranges of a wrapped message as ranges of the output's own lines."""
    return [(max(a - offset, 0), min(b - offset, n_lines - 1)) for a, b in ranges
            if b - offset >= 0 and a - offset <= n_lines - 1]


def retention_of(case: Case, visible: Sequence[tuple[int, int]]) -> float:
    return gold_shown(case.output, visible)


def occurrences_of(case: Case, visible: Sequence[tuple[int, int]]) -> tuple[tuple[int, int], tuple[int, int]]:
    """Gold occurrences shown and present, (named verbatim by the request, not named)."""
    o = case.output
    shown = {i for a, b in visible for i in range(a, b + 1)}
    request = case.request_text
    counts = {True: [0, 0], False: [0, 0]}
    for i, line in enumerate(o.lines):
        if o.own[i] and gold_key(line) in o.gold:
            named = line.strip() in request
            counts[named][0] += i in shown
            counts[named][1] += 1
    return (counts[True][0], counts[True][1]), (counts[False][0], counts[False][1])


def outcome(case: Case, visible: Sequence[tuple[int, int]], share: float, compressed: bool, reason: str) -> Outcome:
    named, unnamed = occurrences_of(case, visible)
    return Outcome(retention_of(case, visible), share, compressed, reason, named, unnamed)


def head_tail(line_tokens: Sequence[int], budget: int) -> list[tuple[int, int]]:
    """Half the budget of whole lines from the head, the rest from the tail."""
    n, head_budget = len(line_tokens), budget // 2
    h, used = 0, 0
    while h < n and used + line_tokens[h] <= head_budget:
        used += line_tokens[h]
        h += 1
    t = n
    while t > h and used + line_tokens[t - 1] <= budget:
        used += line_tokens[t - 1]
        t -= 1
    return ([(0, h - 1)] if h else []) + ([(t, n - 1)] if t < n else [])


def random_units(units: Sequence[Any], budget: int, key: str) -> list[tuple[int, int]]:
    """Units in a seeded random order (`key` seeds it), as many as the budget holds."""
    from policies.selection import select_units

    rng = random.Random(key)
    scores = [rng.random() * u.tokens for u in units]
    return [(units[k].first, units[k].last) for k in select_units(units, scores, budget)]


def values_at(result: MethodResult, key: str, idx: Sequence[int]) -> list[float]:
    return [o.retention for i in idx if (o := result.outcomes[key][i]) is not None]


def session_of(case: Case) -> str:
    return case.output.id.split("#")[0]


def measured_at(result: MethodResult, key: str, idx: Sequence[int]) -> list[tuple[int, Outcome]]:
    return [(i, o) for i in idx if (o := result.outcomes[key][i]) is not None]


def retentions(result: MethodResult, key: str, idx: Sequence[int], cases: Sequence[Case]) -> tuple[list[float], list[str]]:
    """The shares measured on `idx` and the session of each (the groups its interval resamples)."""
    got = measured_at(result, key, idx)
    return [o.retention for _, o in got], [session_of(cases[i]) for i, _ in got]


def share_cell(result: MethodResult, key: str, idx: Sequence[int], cases: Sequence[Case]) -> str:
    """Mean share per output, its interval resampling sessions."""
    return ci_cell(*retentions(result, key, idx, cases))


def gold_line_cell(result: MethodResult, key: str, idx: Sequence[int], cases: Sequence[Case]) -> str:
    """Share of all gold lines (an output with many counts for more), its interval resampling sessions."""
    got = measured_at(result, key, idx)
    return pooled_cell([(o.retention * len(cases[i].output.gold), len(cases[i].output.gold)) for i, o in got],
                       [session_of(cases[i]) for i, _ in got])


def paired_gain(result: MethodResult, base: MethodResult, key: str, idx: Sequence[int],
                cases: Sequence[Case]) -> tuple[int, float, tuple[float, float]]:
    """Mean per-output difference against `base` on the outputs both measured (how many, the mean,
    its interval resampling sessions): pairing removes how hard each output is."""
    both = [(i, o.retention - b.retention) for i in idx
            if (o := result.outcomes[key][i]) is not None and (b := base.outcomes[key][i]) is not None]
    diffs = [d for _, d in both]
    point = sum(diffs) / len(diffs) if diffs else 0.0
    return len(diffs), point, bootstrap(diffs, groups=[session_of(cases[i]) for i, _ in both])
