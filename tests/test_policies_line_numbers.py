"""Line-number prefixes (policies/line_numbers.py): one reading for segmentation and the ranker."""

from __future__ import annotations

import pytest
from hypothesis import given, strategies as st

from policies.line_numbers import grep_path, line_number, without_line_number


@pytest.mark.parametrize(("line", "number", "rest"), [
    ("    71\t    return x\n", 71, "    return x\n"),  # cat -n / nl -ba
    ("71→    return x\n", 71, "    return x\n"),  # Claude Code's Read
    ("71:    return x\n", 71, "    return x\n"),  # grep -n, one file: a hit
    ("71-    return x\n", 71, "    return x\n"),  # ... and its context
    ("src/app.py:71:    return x\n", 71, "    return x\n"),  # grep -n over files
])
def test_each_tool_prefix_gives_its_number_and_the_line_behind_it(line: str, number: int, rest: str) -> None:
    found = line_number(line)
    assert found is not None and found[0] == number
    assert without_line_number(line) == rest


@pytest.mark.parametrize("line", ["12:30 the job started\n", "2024-01-05 INFO ready\n", "return 71\n", "\n"])
def test_times_dates_and_plain_lines_carry_no_line_number(line: str) -> None:
    assert line_number(line) is None and without_line_number(line) == line


def test_a_grep_path_needs_a_letter() -> None:
    assert grep_path("django/forms.py:140:    value = 1") == ("django/forms.py", 140)
    assert grep_path("2024-01-01 started") is None


@given(st.integers(min_value=0, max_value=10**6), st.text(max_size=40).filter(lambda t: "\n" not in t))
def test_a_numbered_line_gives_back_exactly_what_followed_the_prefix(number: int, body: str) -> None:
    line = f"{number:6d}\t{body}"
    assert line_number(line) == (number, 7 if number < 10**6 else len(str(number)) + 1)
    assert without_line_number(line) == body
