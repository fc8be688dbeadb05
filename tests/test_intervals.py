"""Bootstrap intervals of the quality sections: resampling whole sessions, not outputs."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from benchmarks.intervals import bootstrap, ci_cell, pooled_cell, verdict


def test_without_groups_each_value_is_resampled_alone() -> None:
    values = [0.2, 0.9, 1.0, 0.4, 0.7, 1.0, 0.0]
    rng = np.random.default_rng(0)
    means = np.asarray(values)[rng.integers(0, len(values), (2000, len(values)))].mean(axis=1)
    expected = (np.percentile(means, 2.5), np.percentile(means, 97.5))
    assert bootstrap(values) == pytest.approx(expected)
    assert bootstrap(values, groups=list(range(len(values)))) == pytest.approx(expected)


def test_outputs_of_one_session_widen_the_interval() -> None:
    # Ten sessions of ten outputs each, every session all kept or all lost: ten independent
    # observations, not a hundred.
    values = [float(s % 2) for s in range(10) for _ in range(10)]
    sessions = [s for s in range(10) for _ in range(10)]
    lo_out, hi_out = bootstrap(values)
    lo_ses, hi_ses = bootstrap(values, groups=sessions)
    assert hi_ses - lo_ses > 2 * (hi_out - lo_out)
    assert lo_ses <= 0.5 <= hi_ses


def test_a_cluster_mean_weighs_outputs_not_sessions() -> None:
    # One session of three outputs kept, one of one output lost: the mean over outputs is 3/4,
    # and every resample's mean is a ratio of outputs, so the interval stays inside [0, 1].
    lo, hi = bootstrap([1.0, 1.0, 1.0, 0.0], groups=["a", "a", "a", "b"])
    assert 0.0 <= lo <= 0.75 <= hi <= 1.0
    assert ci_cell([1.0, 1.0, 1.0, 0.0], ["a", "a", "a", "b"]).startswith("75.0 %")


def test_pooled_share_counts_every_line() -> None:
    cell = pooled_cell([(1, 4), (3, 4), (0, 0)], ["s1", "s2", "s3"])
    assert cell.startswith("50.0 %") and cell.endswith("of 8")
    assert pooled_cell([(0, 0)]) == "n/a"


def test_groups_must_match_the_values() -> None:
    with pytest.raises(ValueError):
        bootstrap([1.0, 0.0], groups=["a"])


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.floats(0, 1), st.integers(0, 5)), min_size=1, max_size=40))
def test_the_interval_holds_the_mean(samples: list[tuple[float, int]]) -> None:
    values, groups = [v for v, _ in samples], [g for _, g in samples]
    lo, hi = bootstrap(values, n=300, groups=groups)
    assert min(values) - 1e-9 <= lo <= hi <= max(values) + 1e-9
    # One session holding every output: each resample is that session, so the interval is the mean.
    assert bootstrap(values, n=50, groups=[0] * len(values)) == pytest.approx((sum(values) / len(values),) * 2)


@pytest.mark.parametrize(("point", "interval", "said"), [
    (0.97, (0.955, 0.98), "met"),
    (0.96, (0.93, 0.98), "point estimate meets; the interval includes the goal"),
    (0.94, (0.91, 0.96), "not met; the interval includes the goal"),
    (0.90, (0.87, 0.93), "not met"),
])
def test_a_verdict_says_when_the_interval_crosses_the_goal(point: float, interval: tuple[float, float],
                                                           said: str) -> None:
    assert verdict(point, interval, 0.95) == said


def test_a_paired_gain_counts_only_outputs_both_measured_and_resamples_sessions() -> None:
    from types import SimpleNamespace

    from benchmarks.retention_cases import MethodResult, Outcome, paired_gain

    def result(shares: list[float | None]) -> MethodResult:
        return MethodResult(outcomes={"0.27": [None if s is None else Outcome(s, 0.27, True, "") for s in shares]})

    cases = [SimpleNamespace(output=SimpleNamespace(id=f"s{i // 2}#{i}")) for i in range(6)]
    mine = result([1.0, 1.0, 0.5, None, 1.0, 0.0])
    base = result([0.5, 0.5, 0.5, 1.0, None, 0.0])
    count, point, (lo, hi) = paired_gain(mine, base, "0.27", range(6), cases)  # type: ignore[arg-type]
    assert count == 4  # outputs 3 and 4 were measured by one method only
    assert point == pytest.approx((0.5 + 0.5 + 0.0 + 0.0) / 4)
    # Sessions s0 (both +0.5), s1 (0) and s2 (0): every resample mean is one of a few ratios within [0, 0.5].
    assert 0.0 <= lo <= point <= hi <= 0.5
    assert (lo, hi) == bootstrap([0.5, 0.5, 0.0, 0.0], groups=["s0", "s0", "s1", "s2"])
