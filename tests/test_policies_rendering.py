from __future__ import annotations

import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from policies.rendering import (
    join_lines,
    kept_ranges_from_units,
    omitted_ranges,
    render_compressed,
    split_lines,
)
from policies.segmentation import Unit

MARKER = re.compile(r"^\[… lines? (\d+)(?:–(\d+))? omitted …\]\r?\n$")
NOTE = re.compile(
    r"^\[pflash: showing ([\d,]+) of ([\d,]+) lines \(([\d,]+) of ([\d,]+) tokens\); "
    r"omitted ranges are marked below; call the tool again for an omitted range\]\r?\n$"
)


def test_split_join_examples() -> None:
    assert split_lines("") == []
    assert split_lines("a") == ["a"]
    assert split_lines("a\n") == ["a\n"]
    assert split_lines("a\nb") == ["a\n", "b"]
    assert split_lines("a\r\nb\r\n") == ["a\r\n", "b\r\n"]
    assert split_lines("\n\n") == ["\n", "\n"]
    assert split_lines("x\ry\n") == ["x\ry\n"]  # a lone CR is not a line break


@given(st.text(alphabet=st.sampled_from("ab \t\r\n\u2028\x0c€"), max_size=80))
def test_split_join_round_trip_is_exact(text: str) -> None:
    lines = split_lines(text)
    assert join_lines(lines) == text
    assert all(line.endswith("\n") for line in lines[:-1])
    assert all("\n" not in line[:-1] for line in lines)
    assert len(lines) == text.count("\n") + (0 if text.endswith("\n") or not text else 1)


def test_render_example() -> None:
    lines = split_lines("".join(f"line {i}\n" for i in range(1, 11)))
    out = render_compressed(lines, [(0, 1), (4, 4), (6, 7)], total_tokens=18211, kept_tokens=4902)
    assert out == (
        "[pflash: showing 5 of 10 lines (4,902 of 18,211 tokens); omitted ranges are marked below; "
        "call the tool again for an omitted range]\n"
        "line 1\nline 2\n"
        "[… lines 3–4 omitted …]\n"
        "line 5\n"
        "[… line 6 omitted …]\n"
        "line 7\nline 8\n"
        "[… lines 9–10 omitted …]\n"
    )


def test_render_crlf_and_missing_final_newline() -> None:
    lines = split_lines("a\r\nb\r\nc")
    out = render_compressed(lines, [(2, 2)], 3, 1)
    assert out.endswith("\r\n[… lines 1–2 omitted …]\r\nc")
    assert out.count("\n") == out.count("\r\n")


def test_render_rejects_bad_ranges() -> None:
    lines = split_lines("a\nb\nc\n")
    for bad in ([(0, 3)], [(1, 0)], [(1, 2), (0, 0)], [(0, 1), (1, 2)], [(-1, 0)]):
        with pytest.raises(ValueError):
            render_compressed(lines, bad, 3, 1)


def test_kept_ranges_merge_adjacent_units() -> None:
    units = [Unit(0, 2, 5, "code"), Unit(3, 3, 5, "code"), Unit(4, 8, 5, "code"), Unit(9, 9, 5, "code")]
    assert kept_ranges_from_units(units, [0, 1, 3]) == ((0, 3), (9, 9))
    assert kept_ranges_from_units(units, [3, 0, 1, 2]) == ((0, 9),)
    assert kept_ranges_from_units(units, []) == ()
    with pytest.raises(ValueError):
        kept_ranges_from_units(units, [4])
    assert omitted_ranges([(0, 3), (9, 9)], 10) == ((4, 8),)
    assert omitted_ranges([], 3) == ((0, 2),)


# --- properties ---------------------------------------------------------------------------------


@st.composite
def rendering_cases(draw: st.DrawFn) -> tuple[list[str], tuple[tuple[int, int], ...], int, int]:
    # Lines may not start with "[" so a kept line can never be mistaken for a marker.
    body = st.text(alphabet=st.sampled_from("ab ]…–\t\r"), max_size=12)
    raw = draw(st.lists(body, min_size=1, max_size=50))
    end = draw(st.sampled_from(["\n", "\r\n"]))
    lines = [r + end for r in raw]
    if raw[-1] and draw(st.booleans()):
        lines[-1] = raw[-1]  # no final terminator (split_lines never yields an empty last line)
    flags = draw(st.lists(st.booleans(), min_size=len(lines), max_size=len(lines)))
    ranges: list[tuple[int, int]] = []
    for i, keep in enumerate(flags):
        if keep:
            if ranges and ranges[-1][1] == i - 1:
                ranges[-1] = (ranges[-1][0], i)
            else:
                ranges.append((i, i))
    total = draw(st.integers(0, 10**6))
    kept = draw(st.integers(0, total))
    return lines, tuple(ranges), total, kept


def parse(rendered: str, lines: list[str]) -> tuple[list[int], list[tuple[int, int]], tuple[int, int, int, int]]:
    """Kept line indices and marker spans (0-based) read back from the rendering."""
    out = split_lines(rendered)
    m = NOTE.match(out[0])
    assert m, out[0]
    counts = tuple(int(g.replace(",", "")) for g in m.groups())
    kept: list[int] = []
    markers: list[tuple[int, int]] = []
    nxt = 0
    for line in out[1:]:
        mm = MARKER.match(line)
        if mm:
            first = int(mm.group(1)) - 1
            last = int(mm.group(2) or mm.group(1)) - 1
            assert first == nxt, "a marker must start right after what precedes it"
            markers.append((first, last))
            nxt = last + 1
        else:
            assert line == lines[nxt], "a kept line must be the next original line, verbatim"
            kept.append(nxt)
            nxt += 1
    assert nxt == len(lines)
    return kept, markers, counts  # type: ignore[return-value]


@settings(max_examples=300)
@given(rendering_cases())
def test_rendering_invariants(case: tuple[list[str], tuple[tuple[int, int], ...], int, int]) -> None:
    lines, ranges, total, kept_tokens = case
    rendered = render_compressed(lines, ranges, total, kept_tokens)
    kept, markers, counts = parse(rendered, lines)
    expected_kept = [i for a, b in ranges for i in range(a, b + 1)]
    assert kept == expected_kept  # exactly the kept lines, in order
    assert markers == list(omitted_ranges(ranges, len(lines)))  # one marker per gap, right numbers
    for (a, b), (c, _) in zip(markers, markers[1:]):
        assert c > b + 1  # markers never sit next to each other: one per maximal gap
    assert counts == (len(expected_kept), len(lines), kept_tokens, total)
    assert len(kept) + sum(b - a + 1 for a, b in markers) == len(lines)
    # A pure function of its inputs.
    assert render_compressed(list(lines), tuple(ranges), total, kept_tokens) == rendered
