from __future__ import annotations

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from policies.budget import DEFAULT_CURVE_SPEC, keep_fraction, parse_curve, token_budget

CURVE = parse_curve(DEFAULT_CURVE_SPEC)


def test_parse_default_curve() -> None:
    assert CURVE == ((16384, 0.315), (32768, 0.270), (65536, 0.270), (120000, 0.225))
    assert parse_curve("100:0.5, 200:1") == ((100, 0.5), (200, 1.0))


@pytest.mark.parametrize(
    ("spec", "fragment"),
    [
        ("", "empty"),
        ("   ", "empty"),
        ("16384", "TOKENS:FRACTION"),
        ("abc:0.3", "not an integer"),
        ("100:x", "not a number"),
        ("100:0", "(0, 1]"),
        ("100:1.5", "(0, 1]"),
        ("100:-0.1", "(0, 1]"),
        ("100:nan", "(0, 1]"),
        ("0:0.3", "positive"),
        ("200:0.3 100:0.2", "sorted"),
        ("100:0.3 100:0.2", "sorted"),
    ],
)
def test_parse_rejects_bad_specs(spec: str, fragment: str) -> None:
    with pytest.raises(ValueError) as e:
        parse_curve(spec)
    assert fragment in str(e.value)


def test_keep_fraction_is_linear_between_points_and_flat_outside() -> None:
    assert keep_fraction(1000, CURVE) == 0.315
    assert keep_fraction(16384, CURVE) == 0.315
    assert keep_fraction(24576, CURVE) == pytest.approx((0.315 + 0.270) / 2)
    assert keep_fraction(50000, CURVE) == pytest.approx(0.270)
    assert keep_fraction(92768, CURVE) == pytest.approx((0.270 + 0.225) / 2)
    assert keep_fraction(120000, CURVE) == 0.225
    assert keep_fraction(10**7, CURVE) == 0.225


def test_token_budget_rounds_down() -> None:
    assert token_budget(16384, CURVE) == math.floor(16384 * 0.315)
    assert token_budget(0, CURVE) == 0
    with pytest.raises(ValueError):
        token_budget(-1, CURVE)


@given(st.integers(0, 400_000))
def test_fraction_stays_within_curve_and_budget_within_total(total: int) -> None:
    f = keep_fraction(total, CURVE)
    assert 0.225 <= f <= 0.315
    b = token_budget(total, CURVE)
    assert 0 <= b <= total
    assert b <= total * f < b + 1


@given(
    st.lists(st.tuples(st.integers(1, 10**6), st.floats(0.01, 1.0)), min_size=1, max_size=6),
    st.integers(0, 2 * 10**6),
)
def test_interpolation_bounded_by_neighbours(raw: list[tuple[int, float]], total: int) -> None:
    points = sorted({t: f for t, f in raw}.items())
    spec = " ".join(f"{t}:{f!r}" for t, f in points)
    curve = parse_curve(spec)
    f = keep_fraction(total, curve)
    fractions = [p[1] for p in curve]
    assert min(fractions) - 1e-12 <= f <= max(fractions) + 1e-12
    for (x0, f0), (x1, f1) in zip(curve, curve[1:]):
        if x0 <= total <= x1:
            assert min(f0, f1) - 1e-12 <= f <= max(f0, f1) + 1e-12
