from __future__ import annotations

import math
import re

from hypothesis import given, settings
from hypothesis import strategies as st

from policies.budget import DEFAULT_CURVE_SPEC, parse_curve, token_budget
from policies.compression import overhead_upper_bound, plan_compression
from policies.lexical import bm25_scores
from policies.rendering import omitted_ranges, split_lines
from policies.segmentation import segment

MARKER = re.compile(r"^\[… lines? (\d+)(?:–(\d+))? omitted …\]\n$")


def line_tokens_of(lines: list[str]) -> list[int]:
    return [max(1, len(line) // 4) for line in lines]


def big_python_file(n_funcs: int = 120) -> str:
    parts = ['"""A generated module."""\n\nimport os\n\n\n']
    for i in range(n_funcs):
        name = "restore_session_state" if i == 77 else f"helper_number_{i}"
        parts.append(
            f"def {name}(value: int) -> int:\n"
            f"    # step {i}: combine the value with a constant\n"
            f"    result = value * {i} + {i * 7}\n"
            f"    if result > {i * 100}:\n"
            f"        result -= {i}\n"
            f"    return result\n\n\n"
        )
    return "".join(parts)


def test_realistic_compression_keeps_the_relevant_function() -> None:
    text = big_python_file()
    lines = split_lines(text)
    lt = line_tokens_of(lines)
    units = segment(lines, lt)
    scores = bm25_scores(["".join(lines[u.first : u.last + 1]) for u in units], "restore_session_state")
    budget = token_budget(sum(lt), parse_curve(DEFAULT_CURVE_SPEC))
    plan = plan_compression(text, lt, scores, units, budget)
    assert plan.compressed and plan.reason == "compressed"
    assert plan.total_lines == len(lines) and plan.total_tokens == sum(lt)
    assert plan.kept_tokens == sum(sum(lt[a : b + 1]) for a, b in plan.kept_ranges)
    assert plan.kept_tokens <= budget
    target = next(i for i, line in enumerate(lines) if line.startswith("def restore_session_state"))
    assert any(a <= target <= b for a, b in plan.kept_ranges)
    assert "def restore_session_state(value: int) -> int:\n" in plan.text
    assert plan.text.startswith(
        f"[pflash: showing {sum(b - a + 1 for a, b in plan.kept_ranges):,} of {len(lines):,} lines "
        f"({plan.kept_tokens:,} of {plan.total_tokens:,} tokens);"
    )
    assert len(plan.text) < len(text)


def test_scorer_failures_serve_whole() -> None:
    text = big_python_file(10)
    lines = split_lines(text)
    lt = line_tokens_of(lines)
    units = segment(lines, lt)
    for bad, why in ((None, "no scores"), ([1.0], "expected"), ([math.nan] * len(units), "NaN"),
                     ([0.0] * len(units), "zero")):
        plan = plan_compression(text, lt, bad, units, 10)
        assert not plan.compressed
        assert plan.reason.startswith("scorer_failed: ") and why in plan.reason
        assert plan.text == text and plan.kept_ranges == ((0, len(lines) - 1),)
        assert plan.kept_tokens == plan.total_tokens == sum(lt)


def test_flat_relevance_serves_whole() -> None:
    text = big_python_file(40)
    lines = split_lines(text)
    lt = line_tokens_of(lines)
    units = segment(lines, lt)
    # Every unit at the background level (a scorer that saw nothing): nothing stands out.
    flat = [0.83] * len(units)
    plan = plan_compression(text, lt, flat, units, sum(lt) // 3)
    assert (plan.compressed, plan.reason) == (False, "flat_relevance")
    # The same band with one unit clearly above it: peaked, whatever the scale and offset.
    peaked = list(flat)
    peaked[len(units) // 2] = 0.95
    assert plan_compression(text, lt, peaked, units, sum(lt) // 3).compressed
    assert plan_compression(text, lt, [1000 * s - 7 for s in peaked], units, sum(lt) // 3).compressed


def test_nothing_omitted_and_no_gain() -> None:
    text = big_python_file(10)
    lines = split_lines(text)
    lt = line_tokens_of(lines)
    units = segment(lines, lt)
    scores = [1.0] + [0.0] * (len(units) - 1)
    assert plan_compression(text, lt, scores, units, sum(lt)).reason == "nothing_omitted"
    # Three tiny lines: dropping one saves less than the note costs.
    small = "alpha\nbeta\ngamma\n"
    small_units = segment(split_lines(small), [10, 10, 10], min_segment=1, max_segment=10)
    plan = plan_compression(small, [10, 10, 10], [1.0, 0.0, 0.0], small_units, 20)
    assert (plan.compressed, plan.reason) == (False, "no_gain")
    # With a real tokenizer's count of the overhead it is still no gain.
    plan = plan_compression(small, [10, 10, 10], [1.0, 0.0, 0.0], small_units, 20, count_tokens=lambda s: 50)
    assert plan.reason == "no_gain"


def test_bad_input_serves_whole() -> None:
    text = "a\nb\n"
    units = segment(split_lines(text), [1, 1], 1, 10)
    assert plan_compression(text, [1], [1.0], units, 1).reason.startswith("bad_input")
    assert plan_compression(text, [1, 1], [1.0] * len(units), units[:-1], 1).reason.startswith("bad_input")
    assert plan_compression(text, [1, 1], [1.0] * len(units), units, 1, pinned_lines=(0, 5)).reason.startswith(
        "bad_input"
    )


def test_pinned_question_lines_are_kept() -> None:
    text = big_python_file(60) + "Why does helper_number_3 overflow?\n"
    lines = split_lines(text)
    lt = line_tokens_of(lines)
    units = segment(lines, lt)
    scores = bm25_scores(["".join(lines[u.first : u.last + 1]) for u in units], "helper_number_3")
    last = len(lines) - 1
    plan = plan_compression(text, lt, scores, units, sum(lt) // 4, pinned_lines=(last, last))
    assert plan.compressed
    assert plan.kept_ranges[-1][1] == last
    assert plan.text.endswith("Why does helper_number_3 overflow?\n")


# --- properties ---------------------------------------------------------------------------------


@st.composite
def plans(draw: st.DrawFn) -> tuple:
    n = draw(st.integers(1, 120))
    words = st.text(alphabet=st.sampled_from("abc xyz_():"), min_size=0, max_size=30)
    raw = draw(st.lists(words, min_size=n, max_size=n))
    indent = draw(st.lists(st.booleans(), min_size=n, max_size=n))
    lines = [("    " if ind else "") + r + "\n" for r, ind in zip(raw, indent)]
    text = "".join(lines)
    lt = draw(st.lists(st.integers(0, 120), min_size=n, max_size=n))
    units = segment(lines, lt, min_segment=draw(st.integers(0, 40)), max_segment=draw(st.integers(40, 300)))
    scores = draw(st.lists(st.floats(0, 10, allow_nan=False), min_size=len(units), max_size=len(units)))
    budget = draw(st.integers(0, max(sum(lt), 1)))
    pin = None
    if draw(st.booleans()):
        a = draw(st.integers(0, n - 1))
        pin = (a, draw(st.integers(a, n - 1)))
    return text, lt, scores, units, budget, pin


@settings(max_examples=300)
@given(plans(), st.sampled_from([0.0, 0.11]))
def test_plan_invariants(case: tuple, threshold: float) -> None:
    text, lt, scores, units, budget, pin = case
    plan = plan_compression(text, lt, scores, units, budget, pinned_lines=pin, spread_threshold=threshold)
    lines = split_lines(text)
    assert plan.total_lines == len(lines) and plan.total_tokens == sum(lt)
    assert plan == plan_compression(text, lt, scores, units, budget, pinned_lines=pin, spread_threshold=threshold)
    if not plan.compressed:
        assert plan.text == text and plan.kept_tokens == plan.total_tokens
        return
    assert plan.reason == "compressed"
    kept_lines = [i for a, b in plan.kept_ranges for i in range(a, b + 1)]
    assert plan.kept_tokens == sum(lt[i] for i in kept_lines)
    # Budget respected except for what pinned units alone need.
    pinned_units = [u for u in units if pin and u.first <= pin[1] and u.last >= pin[0]]
    assert plan.kept_tokens <= max(budget, sum(u.tokens for u in pinned_units))
    if pin:
        assert all(any(a <= i <= b for a, b in plan.kept_ranges) for i in range(pin[0], pin[1] + 1))
    # Kept ranges follow unit boundaries.
    starts, ends = {u.first for u in units}, {u.last for u in units}
    assert all(a in starts and b in ends for a, b in plan.kept_ranges)
    # The rendering: kept lines verbatim in order, one marker per gap, really shorter.
    out = split_lines(plan.text)
    body = [line for line in out[1:] if not MARKER.match(line)]
    assert body == [lines[i] for i in kept_lines]
    markers = [MARKER.match(line) for line in out[1:] if MARKER.match(line)]
    spans = [(int(m.group(1)) - 1, int(m.group(2) or m.group(1)) - 1) for m in markers if m]
    assert spans == list(omitted_ranges(plan.kept_ranges, len(lines)))
    overhead = "".join(out[0:1]) + "".join(line for line in out[1:] if MARKER.match(line))
    assert plan.kept_tokens + overhead_upper_bound(overhead) < plan.total_tokens
