from __future__ import annotations

import textwrap

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from policies.rendering import split_lines
from policies.segmentation import TAIL_SLACK, TIGHT_KINDS, TIGHT_SHARE, Unit, check_units, detect_kind, is_tight, segment, unit_limit


def toks(lines: list[str]) -> list[int]:
    # Roughly 4 characters a token, at least one per non-empty line.
    return [max(1, len(line) // 4) if line.strip() else 0 for line in lines]


def units_text(lines: list[str], u: Unit) -> str:
    return "".join(lines[u.first : u.last + 1])


def assert_cover(units: list[Unit], line_tokens: list[int]) -> None:
    assert check_units(units, line_tokens) is None, check_units(units, line_tokens)


PYTHON_FILE = textwrap.dedent(
    '''\
    """A module docstring that
    spans two lines."""

    import os
    import sys
    from dataclasses import dataclass


    @dataclass(frozen=True)
    class Point:
        x: int
        y: int

        def norm(self) -> float:
            return (self.x ** 2 + self.y ** 2) ** 0.5


    # A comment directly above a function stays with it.
    def helper(value: int) -> int:
        total = 0
        for i in range(value):

            total += i
        return total


    class Registry:
        """Holds things."""

        def __init__(self) -> None:
            self.items: dict[str, int] = {}

        @property
        def size(self) -> int:
            return len(self.items)

        def add(self, name: str, value: int) -> None:
            if name in self.items:
                raise KeyError(name)
            else:
                self.items[name] = value


    def main() -> None:
        try:
            print(helper(3))
        except Exception:
            sys.exit(1)
    '''
)


def start_line(lines: list[str], needle: str) -> int:
    return next(i for i, line in enumerate(lines) if line.startswith(needle))


def test_python_definitions_stay_whole_with_decorators_and_comments() -> None:
    lines = split_lines(PYTHON_FILE)
    units = segment(lines, [1] * len(lines), min_segment=1, max_segment=1000)
    assert_cover(units, [1] * len(lines))
    starts = [u.first for u in units]
    # Each top-level definition starts a unit at its decorator / leading comment.
    assert start_line(lines, "@dataclass") in starts
    assert start_line(lines, "class Point") not in starts
    assert start_line(lines, "# A comment directly") in starts
    assert start_line(lines, "def helper") not in starts
    assert start_line(lines, "class Registry") in starts
    assert start_line(lines, "def main") in starts
    # Bodies (including an inner blank line and else/except closers) never start a unit.
    assert start_line(lines, "        total += i") not in starts
    assert start_line(lines, "    except Exception") not in starts
    # The import block is one unit.
    imp = next(u for u in units if u.first <= start_line(lines, "import os") <= u.last)
    assert imp.first <= start_line(lines, "from dataclasses") <= imp.last
    registry = next(u for u in units if u.first == start_line(lines, "class Registry"))
    assert registry.last >= start_line(lines, "            self.items[name] = value")
    assert all(u.kind == "code" for u in units)


def test_big_class_splits_at_nested_definitions() -> None:
    lines = split_lines(PYTHON_FILE)
    line_tokens = [5 if line.strip() else 0 for line in lines]
    reg_first = start_line(lines, "class Registry")
    units = segment(lines, line_tokens, min_segment=10, max_segment=40)
    assert_cover(units, line_tokens)
    assert all(u.tokens <= 40 for u in units)
    starts = {u.first for u in units}
    # Cuts inside the class land on method starts, the decorated one above its decorator.
    inside = {s for s in starts if reg_first < s < start_line(lines, "def main")}
    allowed = {
        start_line(lines, "    def __init__"),
        start_line(lines, "    @property"),
        start_line(lines, "    def add"),
    }
    assert inside and inside <= allowed
    assert start_line(lines, "    def size") not in starts


def test_cat_n_numbered_file_is_read_as_code() -> None:
    body = PYTHON_FILE.splitlines()
    numbered = "".join(f"{i + 1:6d}\t{line}\n" for i, line in enumerate(body))
    arrow = "".join(f"{i + 1:6d}→{line}\n" for i, line in enumerate(body))
    colon = "".join(f"{i + 1}:{line}\n" for i, line in enumerate(body))
    plain = split_lines(PYTHON_FILE)
    want = [(u.first, u.last) for u in segment(plain, [1] * len(plain), 1, 1000)]
    for text in (numbered, arrow, colon):
        lines = split_lines(text)
        units = segment(lines, [1] * len(lines), min_segment=1, max_segment=1000)
        # The prefixes do not change the structure found, and lines stay intact in the units.
        assert [(u.first, u.last) for u in units] == want
        assert all(u.kind == "code" for u in units)
        assert "".join(units_text(lines, u) for u in units) == text


GREP_OUTPUT = """\
src/app/server.py:12:def handle_request(req):
src/app/server.py:40:    return handle_request(req)
src/app/server.py:41:    # handle_request retries
src/app/util-helpers.py:3:from .server import handle_request
src/app/util-helpers.py:9:def wrap(handle_request):
--
src/app/util-helpers.py:55:    handle_request(x)
tests/test_server.py:1:from app.server import handle_request
tests/test_server.py:8:    assert handle_request(None) is None
"""


def test_grep_hits_group_by_file() -> None:
    lines = split_lines(GREP_OUTPUT)
    units = segment(lines, [1] * len(lines), min_segment=1, max_segment=100)
    assert detect_kind([x.rstrip("\n") for x in lines]) == "grep"
    assert [(u.first, u.last) for u in units] == [(0, 2), (3, 6), (7, 8)]
    assert {u.kind for u in units} == {"grep"}


def test_grep_big_group_splits_at_separators_or_line_jumps() -> None:
    text = "".join(f"lib/big.py:{n}:    value_{n} = compute({n})\n" for n in (1, 2, 3, 50, 51, 52, 90, 91, 92))
    lines = split_lines(text)
    units = segment(lines, [10] * len(lines), min_segment=10, max_segment=35)
    assert [(u.first, u.last) for u in units] == [(0, 2), (3, 5), (6, 8)]


LOG_OUTPUT = """\
2024-05-01 12:00:01,123 INFO server: starting on port 8080
2024-05-01 12:00:02,001 DEBUG db: pool size 10
2024-05-01 12:00:03,500 ERROR handler: request failed
Traceback (most recent call last):
  File "/app/handler.py", line 42, in handle
    result = process(req)
  File "/app/proc.py", line 7, in process
    raise ValueError("bad input")
ValueError: bad input
2024-05-01 12:00:04,000 INFO handler: recovered
[WARN] cache: miss rate high
"""


def test_log_records_keep_their_tracebacks() -> None:
    lines = split_lines(LOG_OUTPUT)
    units = segment(lines, [1] * len(lines), min_segment=1, max_segment=100)
    assert [(u.first, u.last) for u in units] == [(0, 0), (1, 1), (2, 8), (9, 9), (10, 10)]
    assert {u.kind for u in units} == {"log"}


def test_small_log_records_merge_forward_and_last_backward() -> None:
    lines = split_lines(LOG_OUTPUT)
    line_tokens = [10] * len(lines)
    units = segment(lines, line_tokens, min_segment=25, max_segment=200)
    # (0)+(1)+(2..8) merge forward; (9) merges into (10); (9..10) is 20 < 25 so it goes back.
    assert [(u.first, u.last) for u in units] == [(0, 10)]
    units = segment(lines, line_tokens, min_segment=20, max_segment=200)
    assert [(u.first, u.last) for u in units] == [(0, 1), (2, 8), (9, 10)]


PROSE = """\
# Title

The first paragraph talks about things.
It wraps onto a second line.

The second paragraph is here.

```
code block

with a blank line inside
```

Last words.
"""


def test_prose_paragraphs_and_fences() -> None:
    lines = split_lines(PROSE)
    units = segment(lines, [1] * len(lines), min_segment=1, max_segment=100)
    firsts = [u.first for u in units]
    assert firsts == [0, 2, 5, 7, 13]
    assert {u.kind for u in units} == {"prose"}


def test_blank_only_text_is_one_blank_unit() -> None:
    lines = split_lines("\n\n\n")
    assert segment(lines, [0, 0, 0]) == [Unit(0, 2, 0, "blank")]
    assert segment([], []) == []


def test_long_line_is_its_own_unit_and_never_cut() -> None:
    lines = ["a = 1\n", "b = 2\n", "x" * 100 + "\n", "c = 3\n", "d = 4\n"]
    line_tokens = [5, 5, 700, 5, 5]  # past the tail slack too
    units = segment(lines, line_tokens, min_segment=8, max_segment=512)
    assert_cover(units, line_tokens)
    assert Unit(2, 2, 700, "code") in units


def test_split_preference_blank_over_any_line() -> None:
    # One long top-level function without nested definitions: cut after the blank line.
    body = ["def f():\n"] + [f"    x{i} = {i}\n" for i in range(6)] + ["\n"] + [f"    y{i} = {i}\n" for i in range(6)]
    line_tokens = [10] * len(body)
    units = segment(body, line_tokens, min_segment=10, max_segment=100)
    assert [(u.first, u.last) for u in units] == [(0, 7), (8, 13)]


def test_passage_a_little_over_max_segment_stays_whole() -> None:
    # One paragraph of 12 lines x 50 tokens = 600 (<= 1.25 x 512): cutting it would leave a
    # ~90-token tail that ranks apart from its head.
    para = [f"Sentence {i} of a long retrieved passage about one topic.\n" for i in range(12)]
    units = segment(para, [50] * 12, min_segment=32, max_segment=512)
    assert [(u.first, u.last, u.tokens) for u in units] == [(0, 11, 600)]
    # 14 lines = 700 tokens is past the slack: it is cut, and no piece exceeds the slack.
    para = para + para[:2]
    units = segment(para, [50] * 14, min_segment=32, max_segment=512)
    assert len(units) == 2
    assert all(u.tokens <= TAIL_SLACK * 512 for u in units)


def test_tail_of_a_long_span_joins_the_last_piece() -> None:
    # 26 lines x 40 tokens = 1040 at max 512: the first piece takes 480; the remaining 560 is
    # within the slack (640), so it stays whole instead of leaving a 48-token tail.
    para = [f"Line {i} of one long paragraph without any blank line.\n" for i in range(26)]
    units = segment(para, [40] * 26, min_segment=32, max_segment=512)
    assert [(u.first, u.last) for u in units] == [(0, 11), (12, 25)]
    assert [u.tokens for u in units] == [480, 560]


def test_bad_arguments() -> None:
    with pytest.raises(ValueError):
        segment(["a\n"], [1, 2])
    with pytest.raises(ValueError):
        segment(["a\n"], [1], min_segment=10, max_segment=5)
    with pytest.raises(ValueError):
        segment(["a\n"], [-1])


# --- properties -----------------------------------------------------------------------------

LINE_SHAPES = st.sampled_from(
    [
        "",
        "def f(x):",
        "    return x",
        "@decorator",
        "class K:",
        "    def m(self):",
        "        pass",
        "}",
        "# comment",
        "2024-01-01 10:00:00 INFO started",
        "ERROR something broke",
        "  File \"x.py\", line 1",
        "src/a.py:10:hit",
        "src/b.py:11:other hit",
        "--",
        "Plain words in a sentence.",
        "     7\tnumbered",
        "12:numbered colon",
        "```",
        "## Heading",
    ]
)


@st.composite
def documents(draw: st.DrawFn, max_tokens: int = 80) -> tuple[list[str], list[int]]:
    shapes = draw(st.lists(LINE_SHAPES, min_size=0, max_size=60))
    crlf = draw(st.booleans())
    end = "\r\n" if crlf else "\n"
    lines = [s + end for s in shapes]
    if lines and draw(st.booleans()):
        lines[-1] = lines[-1].rstrip("\r\n")
    line_tokens = draw(st.lists(st.integers(0, max_tokens), min_size=len(lines), max_size=len(lines)))
    return lines, line_tokens


@settings(max_examples=300)
@given(documents(max_tokens=700), st.integers(0, 64), st.integers(1, 600))
def test_units_cover_every_line_once_in_order(doc: tuple[list[str], list[int]], lo: int, hi: int) -> None:
    lines, line_tokens = doc
    min_segment, max_segment = min(lo, hi), max(lo, hi)
    units = segment(lines, line_tokens, min_segment, max_segment)
    assert_cover(units, line_tokens)
    for u in units:
        # Only a single line, or a remainder within the tail slack, may exceed max_segment.
        assert u.tokens <= TAIL_SLACK * max_segment or u.first == u.last
        assert u.kind in ("code", "grep", "log", "prose", "blank")
    # Deterministic.
    assert segment(lines, line_tokens, min_segment, max_segment) == units


@settings(max_examples=300)
@given(documents(max_tokens=16), st.integers(4, 16), st.integers(4, 8))
def test_units_reach_min_segment_when_lines_are_small(
    doc: tuple[list[str], list[int]], min_segment: int, factor: int
) -> None:
    lines, line_tokens = doc
    line_tokens = [min(t, min_segment) for t in line_tokens]
    max_segment = factor * min_segment
    units = segment(lines, line_tokens, min_segment, max_segment)
    assert_cover(units, line_tokens)
    if sum(line_tokens) >= min_segment:
        assert all(min_segment <= u.tokens <= TAIL_SLACK * max_segment for u in units)
    else:
        assert len(units) <= 1


def test_units_of_code_are_half_as_long_under_a_tight_budget() -> None:
    assert not is_tight(0.27) and not is_tight(TIGHT_SHARE)  # the default curve's shares (22.5 % and up)
    assert is_tight(0.15)
    assert unit_limit("code", False, 32, 512) == 512
    assert unit_limit("code", True, 32, 512) == 256
    assert unit_limit("log", True, 40, 64) == 40  # never below the merge size
    lines = [f"value_{i} = compute({i})\n" for i in range(400)]
    tokens = [6] * len(lines)
    tight = segment(lines, tokens, 8, 64, tight=True)
    assert max(u.tokens for u in tight) <= 32 * TAIL_SLACK < max(u.tokens for u in segment(lines, tokens, 8, 64))


def test_prose_keeps_its_full_units_under_a_tight_budget() -> None:
    """A passage is evidence only whole: halving prose units lost MTRAG gold (segmentation.TIGHT_KINDS)."""
    assert "prose" not in TIGHT_KINDS and unit_limit("prose", True, 32, 512) == 512
    paragraph = [f"The council approved sentence {j} of the harbour plan after a long debate.\n" for j in range(8)]
    lines = [line for i in range(30) for line in ([f"Passage {i}.\n", *paragraph, "\n"])]
    tokens = [12] * len(lines)
    assert {u.kind for u in segment(lines, tokens, 8, 128)} <= {"prose", "blank"}
    assert segment(lines, tokens, 8, 128, tight=True) == segment(lines, tokens, 8, 128)
    assert max(u.tokens for u in segment(lines, tokens, 8, 128)) > 64
