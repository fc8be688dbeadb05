"""Bootstrap intervals for the quality sections' shares: 95 % percentile intervals, seeded so a rerun
prints the same cells. Outputs of one session (or turns of one conversation) are not independent, so
the sections pass each value's session and whole sessions are resampled (a cluster bootstrap);
without groups every value is its own."""

from __future__ import annotations

from collections.abc import Hashable, Sequence

import numpy as np

from benchmarks.common import pct

RESAMPLES = 2000


def _clusters(n_values: int, groups: Sequence[Hashable] | None) -> np.ndarray:
    """Each value's cluster index, 0..k-1 in order of first appearance."""
    if groups is None:
        return np.arange(n_values)
    if len(groups) != n_values:
        raise ValueError(f"{len(groups)} groups for {n_values} values")
    index: dict[Hashable, int] = {}
    return np.fromiter((index.setdefault(g, len(index)) for g in groups), dtype=int, count=n_values)


def _resampled_ratios(kept: Sequence[float], total: Sequence[float], groups: Sequence[Hashable] | None,
                      n: int, seed: int) -> np.ndarray:
    """Σ kept / Σ total over `n` resamples of whole clusters."""
    cluster = _clusters(len(kept), groups)
    k = np.bincount(cluster, weights=np.asarray(kept, dtype=float))
    t = np.bincount(cluster, weights=np.asarray(total, dtype=float))
    pick = np.random.default_rng(seed).integers(0, len(k), (n, len(k)))
    totals = t[pick].sum(axis=1)
    return k[pick].sum(axis=1) / np.where(totals == 0, np.nan, totals)


def bootstrap(values: Sequence[float], n: int = RESAMPLES, seed: int = 0,
              groups: Sequence[Hashable] | None = None) -> tuple[float, float]:
    """95 % percentile interval of the mean of `values`, resampling clusters (`groups`) or values."""
    if len(values) == 0:
        return (float("nan"), float("nan"))
    means = _resampled_ratios(values, [1.0] * len(values), groups, n, seed)
    return float(np.nanpercentile(means, 2.5)), float(np.nanpercentile(means, 97.5))


def pooled_cell(pairs: Sequence[tuple[float, float]], groups: Sequence[Hashable] | None = None,
                n: int = RESAMPLES, seed: int = 0) -> str:
    """Σ shown / Σ present, with its 95 % interval resampling clusters (or pairs)."""
    chosen = [i for i, p in enumerate(pairs) if p[1]]
    if not chosen:
        return "n/a"
    kept, total = [pairs[i][0] for i in chosen], [pairs[i][1] for i in chosen]
    ratios = _resampled_ratios(kept, total, None if groups is None else [groups[i] for i in chosen], n, seed)
    lo, hi = np.nanpercentile(ratios, [2.5, 97.5])
    return f"{pct(sum(kept) / sum(total))} ({pct(lo, 0)}–{pct(hi, 0)}) of {round(sum(total))}"


def ci_cell(values: Sequence[float], groups: Sequence[Hashable] | None = None) -> str:
    if not values:
        return "n/a"
    lo, hi = bootstrap(values, groups=groups)
    return f"{pct(sum(values) / len(values))} ({pct(lo, 0)}–{pct(hi, 0)})"


def verdict(point: float, interval: tuple[float, float], goal: float) -> str:
    """Whether a share meets `goal` ("≥ goal"), saying so when the interval crosses it."""
    lo, hi = interval
    if point < goal:
        return "not met" + ("; the interval includes the goal" if hi >= goal else "")
    return "met" if lo >= goal else "point estimate meets; the interval includes the goal"
