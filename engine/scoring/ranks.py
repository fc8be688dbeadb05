"""Ranks of per-unit values, the one place scorers turn values into ranks.

Two tie rules, both kept because shipped weights were fitted on them: competition ranks (equal values
share the better rank; the drafter's fusion and the head's features) and mean ranks (equal values
share their mean rank; the ranker's features, where most units tie at zero matches).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from policies.selection import competition_ranks


def ranks(values: Sequence[float] | np.ndarray) -> np.ndarray:
    """1-based competition ranks, best (highest) first; equal values share the better rank."""
    return np.asarray(competition_ranks(np.asarray(values, dtype=np.float64).tolist()), dtype=np.float64)


def ranks01(values: Sequence[float] | np.ndarray) -> np.ndarray:
    """Competition ranks scaled to [0, 1], 0 = best."""
    n = len(values)
    return (ranks(values) - 1.0) / (n - 1) if n > 1 else np.zeros(n)


def mean_ranks01(values: np.ndarray) -> np.ndarray:
    """Each value's rank in [0, 1], lowest = 0; tied values share their mean rank, so units that
    tie (most match nothing) are not ordered by their place in the message."""
    n = len(values)
    if n < 2:
        return np.zeros(n)
    order_ranks = np.empty(n)
    order_ranks[np.argsort(values, kind="stable")] = np.arange(n)
    _, tie, count = np.unique(values, return_inverse=True, return_counts=True)
    return np.bincount(tie, weights=order_ranks)[tie] / count[tie] / (n - 1)
