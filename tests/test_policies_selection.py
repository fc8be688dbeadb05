from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from policies.segmentation import Unit
from policies.selection import competition_ranks, is_too_flat, relevance_spread, select_units, validate_scores


def make_units(tokens: list[int]) -> list[Unit]:
    units, line = [], 0
    for t in tokens:
        units.append(Unit(line, line, t, "code"))
        line += 1
    return units


def test_select_by_density_skipping_what_does_not_fit() -> None:
    units = make_units([50, 10, 30, 10])
    scores = [10.0, 5.0, 9.0, 0.5]  # densities 0.2, 0.5, 0.3, 0.05
    assert select_units(units, scores, 40) == [1, 2]
    # 1 (10) then 2 (30) leave 20: 0 (50) does not fit, 3 (10) does.
    assert select_units(units, scores, 60) == [1, 2, 3]
    assert select_units(units, scores, 9) == []


def test_a_size_exponent_below_one_discounts_a_longer_unit_less() -> None:
    units = make_units([100, 25])
    scores = [0.8, 0.3]  # per token 0.008 against 0.012; per sqrt(token) 0.08 against 0.06
    assert select_units(units, scores, 100) == [1]
    assert select_units(units, scores, 100, size_exponent=0.5) == [0]
    assert select_units(units, scores, 100, size_exponent=1.0) == select_units(units, scores, 100)


def test_ties_go_to_the_earlier_unit() -> None:
    units = make_units([10, 10, 10])
    assert select_units(units, [1.0, 1.0, 1.0], 20) == [0, 1]


def test_pinned_kept_even_over_budget() -> None:
    units = make_units([100, 10, 10])
    assert select_units(units, [0.0, 5.0, 5.0], 15, pinned=frozenset({0})) == [0]
    assert select_units(units, [0.0, 5.0, 5.0], 115, pinned=frozenset({0})) == [0, 1]
    with pytest.raises(ValueError):
        select_units(units, [0.0, 1.0, 1.0], 10, pinned=frozenset({3}))
    with pytest.raises(ValueError):
        select_units(units, [0.0], 10)


def test_spread_flat_is_zero_and_peaked_is_high() -> None:
    assert relevance_spread([1.0] * 10, [5] * 10, 0.3) == pytest.approx(0.0)
    # Scores proportional to size are flat too.
    assert relevance_spread([1.0, 2.0, 4.0], [10, 20, 40], 0.3) == pytest.approx(0.0)
    peaked = relevance_spread([10.0] + [0.0] * 9, [5] * 10, 0.3)
    assert peaked == pytest.approx(0.7)
    # Half the mass in 10% of tokens, the rest spread: captured = 0.5 + 0.5 * 0.2/0.9.
    half = relevance_spread([9.0] + [1.0] * 9, [5] * 10, 0.3)
    assert half == pytest.approx(0.5 + 0.5 * (2 / 9) - 0.3)
    assert relevance_spread([0.0, 0.0], [1, 1]) == 0.0
    assert relevance_spread([], []) == 0.0
    assert is_too_flat(0.05) and not is_too_flat(0.2) and is_too_flat(0.2, threshold=0.3)


def test_validate_scores() -> None:
    assert validate_scores([1.0, 0.0], 2) is None
    assert validate_scores(None, 2) == "no scores"
    assert "expected 2" in (validate_scores([1.0], 2) or "")
    assert "NaN" in (validate_scores([1.0, math.nan], 2) or "")
    assert "infinite" in (validate_scores([math.inf, 1.0], 2) or "")
    assert validate_scores([0.0, 0.0], 2) == "all scores are zero"
    assert validate_scores([], 0) == "no units to score"
    assert "not a number" in (validate_scores([1.0, "x"], 2) or "")  # type: ignore[list-item]


@st.composite
def selection_cases(draw: st.DrawFn) -> tuple[list[Unit], list[float], int, frozenset[int]]:
    tokens = draw(st.lists(st.integers(0, 300), min_size=0, max_size=40))
    scores = draw(
        st.lists(st.floats(-5, 50, allow_nan=False), min_size=len(tokens), max_size=len(tokens))
    )
    budget = draw(st.integers(0, sum(tokens) + 10))
    pinned = draw(st.frozensets(st.integers(0, max(len(tokens) - 1, 0)), max_size=3)) if tokens else frozenset()
    return make_units(tokens), scores, budget, pinned


@settings(max_examples=300)
@given(selection_cases())
def test_selection_respects_budget_and_is_maximal(case: tuple[list[Unit], list[float], int, frozenset[int]]) -> None:
    units, scores, budget, pinned = case
    kept = select_units(units, scores, budget, pinned)
    assert kept == sorted(set(kept))
    assert pinned <= set(kept)
    pinned_tokens = sum(units[i].tokens for i in pinned)
    kept_tokens = sum(units[i].tokens for i in kept)
    # Never over budget, except by what pinned units alone cost.
    assert kept_tokens <= max(budget, pinned_tokens)
    remaining = budget - kept_tokens
    for i in range(len(units)):
        if i not in kept:
            assert units[i].tokens > remaining  # greedy: nothing left out would still fit
    assert select_units(units, scores, budget, pinned) == kept


@given(
    st.lists(st.floats(-10, 100, allow_nan=False), min_size=1, max_size=30),
    st.floats(0.0, 1.0),
)
def test_spread_in_unit_interval(scores: list[float], fraction: float) -> None:
    s = relevance_spread(scores, [3] * len(scores), fraction)
    assert 0.0 <= s <= 1.0
    assert s <= 1.0 - fraction + 1e-9


def test_competition_ranks_share_the_better_rank_and_put_nan_last() -> None:
    assert competition_ranks([0.5, 2.0, 0.5, -1.0]) == [2, 1, 2, 4]
    assert competition_ranks([math.nan, 1.0, math.nan, -math.inf]) == [3, 1, 4, 2]  # each NaN its own rank
    assert competition_ranks([]) == []
