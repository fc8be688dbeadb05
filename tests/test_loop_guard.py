"""An answer that repeats one line ends (engine/loop_guard.py): the rule, fed as a stream."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from engine.loop_guard import LoopGuard


def trips(text: str, limit: int, chunk: int = 3) -> bool:
    guard = LoopGuard(limit)
    return any([guard.feed(text[i : i + chunk]) for i in range(0, len(text), chunk)])


def test_one_line_over_and_over_trips_it() -> None:
    gemma = "Here is what I found:\n" + " - You need to learn Claude Agent.\n" * 5
    assert trips(gemma, 5) and not trips(gemma, 6)
    assert trips("a\n\n a \n\na\n", 3)  # blank lines and surrounding spaces do not break a run
    assert not trips("a\nb\na\nb\na\nb\n", 3) and not trips("a\na\nb\na\n", 3)
    assert not trips("a\n" * 100, 0)  # 0: never
    assert not trips("a\na\na", 3)  # the last line is not finished yet


@given(st.lists(st.sampled_from(["x", "y", "", "  x"]), max_size=40), st.integers(1, 6), st.integers(1, 7))
def test_it_trips_exactly_when_some_run_of_equal_lines_is_long_enough(lines: list[str], limit: int,
                                                                      chunk: int) -> None:
    text = "".join(line + "\n" for line in lines)
    kept = [line.strip() for line in lines if line.strip()]
    longest, run = 0, 0
    for i, line in enumerate(kept):
        run = run + 1 if i and kept[i - 1] == line else 1
        longest = max(longest, run)
    assert trips(text, limit, chunk) == (longest >= limit)
