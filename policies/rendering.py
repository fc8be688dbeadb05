"""Line splitting and the compressed message's text: one note, kept lines verbatim, gap markers.

Lines keep their terminators. `split_lines` breaks only after "\\n", so a "\\r\\n" pair stays at the
end of its line and a lone "\\r" is not a line break (the numbering then matches `cat -n`, grep and
editors). The last line has no terminator when the text does not end with "\\n"; a text ending
with "\\n" has no phantom empty last line. `join_lines` is plain concatenation, so
`join_lines(split_lines(t)) == t` for every string.

Rendering is a pure function of (lines, kept ranges, counts): the same inputs give the same bytes,
which is what lets a session re-serve a compressed message byte-identically every turn.
"""

from __future__ import annotations

from collections.abc import Sequence

from policies.segmentation import Unit

Range = tuple[int, int]


def split_lines(text: str) -> list[str]:
    """Split after every "\\n", keeping terminators; "" gives []."""
    if not text:
        return []
    lines = text.split("\n")
    out = [line + "\n" for line in lines[:-1]]
    if lines[-1]:
        out.append(lines[-1])
    return out


def join_lines(lines: Sequence[str]) -> str:
    """Inverse of `split_lines`."""
    return "".join(lines)


def bare(line: str) -> str:
    """A line without its terminator ("\\n" or "\\r\\n")."""
    return line.rstrip("\r\n")


def normalize_ranges(ranges: Sequence[Range], n_lines: int) -> tuple[Range, ...]:
    """Validate inclusive 0-based ranges (sorted, disjoint, in bounds) and merge adjacent ones."""
    out: list[Range] = []
    for first, last in ranges:
        if not (0 <= first <= last < n_lines):
            raise ValueError(f"range ({first}, {last}) outside 0..{n_lines - 1}")
        if out and first <= out[-1][1]:
            raise ValueError(f"ranges overlap or are unsorted at ({first}, {last})")
        if out and first == out[-1][1] + 1:
            out[-1] = (out[-1][0], last)
        else:
            out.append((first, last))
    return tuple(out)


def kept_ranges_from_units(units: Sequence[Unit], kept_indices: Sequence[int]) -> tuple[Range, ...]:
    """The maximal line ranges covered by the kept units (adjacent units merge into one range)."""
    out: list[Range] = []
    for i in sorted(set(kept_indices)):
        if not 0 <= i < len(units):
            raise ValueError(f"unit index {i} outside 0..{len(units) - 1}")
        u = units[i]
        if out and u.first <= out[-1][1] + 1:
            out[-1] = (out[-1][0], max(out[-1][1], u.last))
        else:
            out.append((u.first, u.last))
    return tuple(out)


def omitted_ranges(kept_ranges: Sequence[Range], n_lines: int) -> tuple[Range, ...]:
    """The gaps between kept ranges, including before the first and after the last."""
    gaps: list[Range] = []
    nxt = 0
    for first, last in normalize_ranges(kept_ranges, n_lines):
        if first > nxt:
            gaps.append((nxt, first - 1))
        nxt = last + 1
    if nxt < n_lines:
        gaps.append((nxt, n_lines - 1))
    return tuple(gaps)


def line_span_label(first: int, last: int) -> str:
    """0-based inclusive span as users read it: 1-based inclusive, "line 7" or "lines 7–9"."""
    if first == last:
        return f"line {first + 1}"
    return f"lines {first + 1}–{last + 1}"


def note_line(shown_lines: int, total_lines: int, kept_tokens: int, total_tokens: int) -> str:
    return (
        f"[pflash: showing {shown_lines:,} of {total_lines:,} lines "
        f"({kept_tokens:,} of {total_tokens:,} tokens); omitted ranges are marked below; "
        f"call the tool again for an omitted range]"
    )


def marker_line(first: int, last: int) -> str:
    return f"[… {line_span_label(first, last)} omitted …]"


def _newline_of(lines: Sequence[str]) -> str:
    # Note and markers follow the input's own line ending so a CRLF text stays CRLF throughout.
    return "\r\n" if lines and lines[0].endswith("\r\n") else "\n"


def render_compressed(
    lines: Sequence[str], kept_ranges: Sequence[Range], total_tokens: int, kept_tokens: int
) -> str:
    """Note line, then kept lines verbatim in order with exactly one marker line per gap.

    `lines` are `split_lines` output. Counts in the note: lines shown = lines in `kept_ranges`;
    tokens are the caller's exact counts (kept original lines, whole message).
    """
    ranges = normalize_ranges(kept_ranges, len(lines))
    nl = _newline_of(lines)
    shown = sum(last - first + 1 for first, last in ranges)
    parts: list[str] = [note_line(shown, len(lines), kept_tokens, total_tokens) + nl]
    nxt = 0
    for first, last in ranges:
        if first > nxt:
            parts.append(marker_line(nxt, first - 1) + nl)
        parts.extend(lines[first : last + 1])
        nxt = last + 1
    if nxt < len(lines):
        # A kept last line without terminator can't be followed by a gap, so no newline is missing.
        parts.append(marker_line(nxt, len(lines) - 1) + nl)
    return "".join(parts)
