"""The θ recall gate: on a later question, bring back omitted lines that matter now.

The drafter scores every unit of an earlier compressed message against the new question. If the
omitted units hold at least θ of the relevance mass, the best omitted units not yet recalled come
back, within a token budget, as labelled excerpts.

θ = 0.0 recalls whenever anything is omitted (and not yet recalled); θ = 1.0 recalls only when the
kept units have no relevance at all, which makes the gate effectively off.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from policies.rendering import Range, line_span_label
from policies.segmentation import Unit
from policies.selection import relevance_mass

DEFAULT_THETA = 0.075
DEFAULT_RECALL_BUDGET = 2048
RECALL_FLOOR = 0.3  # a recalled unit holds at least this share of the best omitted unit's mass


@dataclass(frozen=True)
class RecallDecision:
    recall: bool
    omitted_share: float
    units: tuple[int, ...]  # unit indices to bring back, in original order
    reason: str


def omitted_flags(units: Sequence[Unit], kept_ranges: Sequence[Range]) -> list[bool]:
    """Per unit: True when none of its lines was kept."""
    flags: list[bool] = []
    for u in units:
        kept = any(a <= u.last and b >= u.first for a, b in kept_ranges)
        flags.append(not kept)
    return flags


def decide_recall(
    scores: Sequence[float],
    tokens: Sequence[int],
    omitted: Sequence[bool],
    already_recalled: frozenset[int],
    theta: float = DEFAULT_THETA,
    budget_tokens: int = DEFAULT_RECALL_BUDGET,
) -> RecallDecision:
    """Whether to recall, and which units.

    omitted_share = relevance mass (see relevance_mass) of omitted units / mass of all units (0
    when there is no mass). Recall iff share >= θ and some omitted, not yet recalled unit fits the budget.
    Units are chosen by density (score per token, ties to the earlier unit), skipping those that
    do not fit; units with positive score only, unless none has any (then by position).
    """
    if not 0.0 <= theta <= 1.0:
        raise ValueError(f"theta must be in [0, 1], got {theta}")
    n = len(scores)
    if len(tokens) != n or len(omitted) != n:
        return RecallDecision(False, 0.0, (), f"scorer_failed: {n} scores, {len(tokens)} token counts, {len(omitted)} flags")
    if any(not math.isfinite(s) for s in scores):
        return RecallDecision(False, 0.0, (), "scorer_failed: non-finite score")
    if not any(omitted):
        return RecallDecision(False, 0.0, (), "nothing_omitted")
    mass = relevance_mass(scores)
    total = sum(mass)
    share = sum(m for m, o in zip(mass, omitted) if o) / total if total > 0 else 0.0
    if share < theta:
        return RecallDecision(False, share, (), "below_theta")
    candidates = [i for i in range(n) if omitted[i] and i not in already_recalled]
    if not candidates:
        return RecallDecision(False, share, (), "all_recalled")
    top = max((mass[i] for i in candidates), default=0.0)
    # Bring back what stands out, not everything above the background: each excerpt costs
    # prefill on the follow-up, and a unit far weaker than the best one rarely holds the answer.
    relevant = [i for i in candidates if mass[i] > 0 and mass[i] >= RECALL_FLOOR * top]
    # Irrelevant lines only when nothing is relevant (θ = 0 asked to recall anyway).
    pool = relevant or candidates

    def density(i: int) -> float:
        return math.inf if tokens[i] <= 0 else mass[i] / tokens[i]

    chosen: list[int] = []
    remaining = budget_tokens
    for i in sorted(pool, key=lambda i: (-density(i), i)):
        if tokens[i] <= remaining:
            chosen.append(i)
            remaining -= tokens[i]
    if not chosen:
        return RecallDecision(False, share, (), "over_budget")
    return RecallDecision(True, share, tuple(sorted(chosen)), "recall")


def render_excerpts(lines: Sequence[str], ranges: Sequence[Range], source_label: str) -> str:
    """One labelled block per range (in the given order): a header line, then the lines verbatim.

    `lines` are `split_lines` output; a block whose last line has no terminator (the text's final
    line) gets one so the next header starts on its own line.
    """
    parts: list[str] = []
    for first, last in ranges:
        if not 0 <= first <= last < len(lines):
            raise ValueError(f"range ({first}, {last}) outside 0..{len(lines) - 1}")
        nl = "\r\n" if lines[first].endswith("\r\n") else "\n"
        parts.append(f"[pflash: recalled {line_span_label(first, last)} of {source_label}]{nl}")
        block = list(lines[first : last + 1])
        if not block[-1].endswith("\n"):
            block[-1] += nl
        parts.extend(block)
    return "".join(parts)
