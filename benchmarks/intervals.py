"""Bootstrap intervals for the quality sections' shares: 95 % percentile intervals, resampling
outputs (or conversations), seeded so a rerun prints the same cells."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from benchmarks.common import mean, pct


def bootstrap(values: Sequence[float], n: int = 2000, seed: int = 0) -> tuple[float, float]:
    """95 % percentile interval of the mean, resampling outputs."""
    v = np.asarray(values, dtype=float)
    if len(v) == 0:
        return (float("nan"), float("nan"))
    rng = np.random.default_rng(seed)
    means = v[rng.integers(0, len(v), (n, len(v)))].mean(axis=1)
    return float(np.percentile(means, 2.5)), float(np.percentile(means, 97.5))


def pooled_cell(pairs: Sequence[tuple[int, int]], n: int = 2000, seed: int = 0) -> str:
    """Σ shown / Σ present over outputs, with a bootstrap 95 % interval resampling outputs."""
    kept = np.asarray([p[0] for p in pairs if p[1]], dtype=float)
    total = np.asarray([p[1] for p in pairs if p[1]], dtype=float)
    if not len(total):
        return "n/a"
    rng = np.random.default_rng(seed)
    pick = rng.integers(0, len(total), (n, len(total)))
    ratios = kept[pick].sum(axis=1) / total[pick].sum(axis=1)
    lo, hi = np.percentile(ratios, [2.5, 97.5])
    return f"{pct(kept.sum() / total.sum())} ({pct(lo, 0)}–{pct(hi, 0)}) of {int(total.sum())}"


def ci_cell(values: Sequence[float]) -> str:
    if not values:
        return "n/a"
    lo, hi = bootstrap(values)
    return f"{pct(mean(values))} ({pct(lo, 0)}–{pct(hi, 0)})"
