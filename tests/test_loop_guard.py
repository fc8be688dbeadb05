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


def test_a_sampled_loop_whose_lines_vary_a_little_trips_the_near_rule() -> None:
    variants = ["I need to use the Bash tool to list the files here.", "I need to use the Bash tool to list files here.",
                "I need to use the Bash tool to list the files here now.", "I will use the Bash tool to list the files here."]
    loop = "Let me think.\n" + "".join(variants[i % 4] + "\n" for i in range(12))
    guard = LoopGuard(10)
    assert any(guard.feed(loop[i : i + 5]) for i in range(0, len(loop), 5)) and guard.reason == "near"
    assert not trips("".join(variants[i % 4] + "\n" for i in range(10)), 10)  # the first line echoes nothing


def test_lists_and_tables_whose_lines_differ_in_what_matters_do_not_trip() -> None:
    counting = "".join(f"{i}\n" for i in range(1, 200))
    table = "".join(f"| {i} | {name} | {i * 3} ms |\n" for i, name in enumerate(["parse", "plan", "prefill", "decode"] * 30))
    steps = "".join(f"{i}. Open file_{i}.py and rename the function handler_{i} to serve_{i}.\n" for i in range(60))
    for text in (counting, table, steps):
        assert not trips(text, 32), text[:80]


def test_a_phrase_looping_without_a_newline_trips_the_phrase_rule() -> None:
    guard = LoopGuard(32)
    text = "The answer is " + "and then we read the file again, " * 120
    assert any(guard.feed(text[i : i + 7]) for i in range(0, len(text), 7)) and guard.reason == "phrase"
    assert not trips("x" * 10 + "".join(f"{i:05d}" for i in range(3000)), 32)  # long, never repeating
