"""Choose units under a token budget, and tell when relevance is too flat to choose at all."""

from __future__ import annotations

import math
import numbers
from collections.abc import Sequence

from policies.segmentation import Unit

DEFAULT_SPREAD_THRESHOLD = 0.11


def competition_ranks(values: Sequence[float]) -> list[int]:
    """1-based competition ranks, best first: equal values share the better rank, so the order of
    tied units never decides. NaN ranks last, each NaN on its own rank, in order."""
    def best_first(i: int) -> tuple[bool, float]:
        return (True, 0.0) if math.isnan(values[i]) else (False, -values[i])

    order = sorted(range(len(values)), key=best_first)
    out = [0] * len(values)
    rank = 0
    for pos, i in enumerate(order):
        if pos == 0 or values[i] != values[order[pos - 1]]:
            rank = pos + 1
        out[i] = rank
    return out


def _density(score: float, tokens: int, size_exponent: float = 1.0) -> float:
    # A unit that costs nothing is free to keep: rank it first if it has any relevance.
    if tokens <= 0:
        return math.inf if score > 0 else 0.0
    return score / tokens**size_exponent


def relevance_mass(scores: Sequence[float]) -> list[float]:
    """Each unit's relevance above the median unit's, never negative (non-finite counts as 0).

    Scorers have a background: a term every unit shares gives each a little BM25; a drafter's
    cosine similarities sit in a narrow band far from 0. Summed over hundreds of units that
    background looks like spread-out relevance (compression would call it flat; the recall gate
    would see a large omitted share). Only what rises above the typical unit says where the
    answer is. Shift- and scale-free, so any scorer's raw values can be compared this way.
    """
    clean = sorted(_finite(s) for s in scores)
    if not clean:
        return []
    mid = len(clean) // 2
    median = clean[mid] if len(clean) % 2 else (clean[mid - 1] + clean[mid]) / 2
    return [max(_finite(s) - median, 0.0) for s in scores]



def _finite(score: float) -> float:
    return float(score) if math.isfinite(score) else 0.0


def select_units(
    units: Sequence[Unit],
    scores: Sequence[float],
    budget_tokens: int,
    pinned: frozenset[int] = frozenset(),
    size_exponent: float = 1.0,
) -> list[int]:
    """Unit indices to keep, in original order.

    Pinned units are always kept and spend the budget first (they alone may exceed it). The rest
    are taken by relevance density (score per token**size_exponent; ties: earlier unit first); a
    unit that does not fit is skipped and smaller ones after it may still fit. An exponent below 1
    suits a score that says whether a unit holds what is needed but not how much of it: a longer
    unit that holds it tends to hold more lines of it, so its size is discounted less than in full.
    """
    if len(units) != len(scores):
        raise ValueError(f"{len(units)} units but {len(scores)} scores")
    for i in pinned:
        if not 0 <= i < len(units):
            raise ValueError(f"pinned unit {i} outside 0..{len(units) - 1}")
    kept = set(pinned)
    remaining = budget_tokens - sum(units[i].tokens for i in kept)
    order = sorted(
        (i for i in range(len(units)) if i not in kept),
        key=lambda i: (-_density(scores[i], units[i].tokens, size_exponent), i),
    )
    for i in order:
        if units[i].tokens <= remaining:
            kept.add(i)
            remaining -= units[i].tokens
    return sorted(kept)


def relevance_spread(
    scores: Sequence[float],
    tokens: Sequence[int] | None = None,
    budget_fraction: float = 0.3,
) -> float:
    """How peaked relevance is for this budget: the Lorenz gap at the budget point, in [0, 1].

    Rank units by density (non-negative score per token; without `tokens` every unit weighs 1),
    take them until `budget_fraction` of the tokens is spent (the last one fractionally), and
    return the share of total relevance mass so captured minus `budget_fraction`. Scores
    proportional to size (a flat relevance) give 0: the budget would keep what a random cut
    keeps. All mass in a sliver gives close to 1 - budget_fraction, the most possible. Negative
    and non-finite scores count as 0; no mass at all is 0 (flat). "Too flat" is
    spread < threshold (`is_too_flat`, default 0.11).
    """
    n = len(scores)
    weights = [1] * n if tokens is None else [max(int(t), 0) for t in tokens]
    if len(weights) != n:
        raise ValueError(f"{n} scores but {len(weights)} token counts")
    mass = [s if math.isfinite(s) and s > 0 else 0.0 for s in scores]
    total_mass = sum(mass)
    total_weight = sum(weights)
    if n == 0 or total_mass <= 0 or total_weight <= 0:
        return 0.0
    fraction = min(max(budget_fraction, 0.0), 1.0)
    target = fraction * total_weight
    used = 0.0
    captured = 0.0
    for i in sorted(range(n), key=lambda i: (-_density(mass[i], weights[i]), i)):
        if weights[i] == 0:
            captured += mass[i]
            continue
        if used >= target:
            break
        take = min(float(weights[i]), target - used)
        captured += mass[i] * take / weights[i]
        used += take
    return min(max(captured / total_mass - fraction, 0.0), 1.0)


def is_too_flat(spread: float, threshold: float = DEFAULT_SPREAD_THRESHOLD) -> bool:
    return spread < threshold


def validate_scores(scores: Sequence[float] | None, n_units: int) -> str | None:
    """Why these scores cannot be used for `n_units` units, or None when they can."""
    if scores is None:
        return "no scores"
    if len(scores) != n_units:
        return f"expected {n_units} scores, got {len(scores)}"
    if n_units == 0:
        return "no units to score"
    for i, s in enumerate(scores):
        if not isinstance(s, numbers.Real) or isinstance(s, bool):
            return f"score {i} is not a number: {s!r}"
        if math.isnan(s):
            return f"score {i} is NaN"
        if math.isinf(s):
            return f"score {i} is infinite"
    if all(s == 0 for s in scores):
        return "all scores are zero"
    return None
