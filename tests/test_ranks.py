"""The scorers' rank functions (engine/scoring/ranks.py): the tie rules the shipped weights were fit on.
Model: none (no model is loaded).
"""

from __future__ import annotations

import numpy as np
from hypothesis import given
from hypothesis import strategies as st

from engine.scoring.ranks import mean_ranks01, ranks, ranks01

values = st.lists(st.integers(0, 4).map(float), max_size=20)


def test_competition_and_mean_ranks_on_ties() -> None:
    assert ranks([3.0, 1.0, 3.0, 0.0]).tolist() == [1.0, 3.0, 1.0, 4.0]
    assert ranks01([3.0, 1.0, 3.0, 0.0]).tolist() == [0.0, 2 / 3, 0.0, 1.0]
    # mean ranks, lowest first: the two zeros share positions 0 and 1
    assert mean_ranks01(np.array([0.0, 2.0, 0.0])).tolist() == [0.25, 1.0, 0.25]


@given(values)
def test_ranks01_best_is_zero_and_ties_share_the_better_rank(xs: list[float]) -> None:
    r = ranks01(xs)
    assert len(r) == len(xs) and all(0.0 <= v <= 1.0 for v in r)
    for i, a in enumerate(xs):
        better = sum(b > a for b in xs)
        assert r[i] == (better / (len(xs) - 1) if len(xs) > 1 else 0.0)


@given(values)
def test_mean_ranks01_are_order_free_and_ties_equal(xs: list[float]) -> None:
    x = np.array(xs)
    r = mean_ranks01(x)
    perm = np.random.default_rng(len(xs)).permutation(len(xs))
    assert np.allclose(mean_ranks01(x[perm]), r[perm])
    for i in range(len(xs)):
        for j in range(len(xs)):
            assert (xs[i] == xs[j]) == bool(np.isclose(r[i], r[j])) or len(xs) < 2
