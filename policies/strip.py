"""The status page's picture of one compressed message: its original lines as bands (kept,
omitted, recalled), each pointing at where the model saw those lines, if it saw them.

Pure functions over the kept-line map's ranges and the texts the gateway served; they read the
gateway's own formats back (the note's line count, the recalled-excerpt headers), which
`policies/rendering.py` and `policies/recall.py` write.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

from policies.rendering import Range

_NOTE = re.compile(r"^\[pflash: showing [\d,]+ of ([\d,]+) lines")
_EXCERPT = re.compile(r"^\[pflash: recalled lines? (\d+)(?:–(\d+))? of (.+)\]\r?$")


@dataclass(frozen=True)
class Band:
    first: int  # original lines, 0-based inclusive
    last: int
    kept: bool
    recalled: bool
    # Where the model read these lines: a served text and the index of `first` among its lines.
    served_in: int | None = None  # which text (the caller's numbering)
    served_line: int | None = None


@dataclass(frozen=True)
class Excerpt:
    first: int  # original lines, 0-based inclusive
    last: int
    header_line: int  # index of the excerpt's header line in the rendered turn
    label: str


def note_total_lines(served: str) -> int | None:
    """The original's line count, read from a compressed message's note (its first line)."""
    match = _NOTE.match(served)
    return int(match.group(1).replace(",", "")) if match else None


def excerpts(rendered_turn: str) -> list[Excerpt]:
    """The recalled excerpts at the top of a rewritten turn, as `render_excerpts` wrote them."""
    out: list[Excerpt] = []
    for index, line in enumerate(rendered_turn.split("\n")):
        match = _EXCERPT.match(line)
        if match:
            first = int(match.group(1)) - 1
            last = int(match.group(2) or match.group(1)) - 1
            out.append(Excerpt(first, last, index, match.group(3)))
    return out


def _boundaries(ranges: Sequence[Range], n_lines: int) -> set[int]:
    return {b for first, last in ranges for b in (first, last + 1) if 0 <= b <= n_lines}


def _served_line(line: int, kept: Sequence[Range]) -> int:
    """Index of a kept original line in the rendered message: the note, then kept lines and one
    marker per gap, in order (see `render_compressed`)."""
    index, nxt = 1, 0
    for first, last in kept:
        if first > nxt:
            index += 1  # the gap's marker line
        if first <= line <= last:
            return index + line - first
        index += last - first + 1
        nxt = last + 1
    raise ValueError(f"line {line} is not kept")


def strip_bands(
    kept: Sequence[Range],
    recalled: Sequence[tuple[Range, int | None, int | None]],
    n_lines: int,
    served_in: int | None,
) -> list[Band]:
    """Bands covering lines 0..n_lines-1 in order, split wherever kept or recalled state changes.

    `kept`: the kept-line map's ranges (sorted, disjoint). `recalled`: ((first, last), text, line)
    for each recalled excerpt: the text it was served in and the line of its first original line
    (None, None when that text is no longer at hand).
    `served_in`: the text holding the compressed message as served, or None when it is not at hand.
    """
    cuts = sorted(_boundaries(kept, n_lines) | _boundaries([r for r, _, _ in recalled], n_lines) | {0, n_lines})
    bands: list[Band] = []
    for start, end in zip(cuts, cuts[1:]):
        if start >= end:
            continue
        is_kept = any(first <= start <= last for first, last in kept)
        covering = [(text, line + start - r[0] if line is not None else None)
                    for r, text, line in recalled if r[0] <= start <= r[1]]
        located = [c for c in covering if c[0] is not None]
        where: tuple[int | None, int | None] = (None, None)
        if is_kept and served_in is not None:
            where = (served_in, _served_line(start, kept))
        elif located:
            where = located[0]
        bands.append(Band(start, end - 1, is_kept, bool(covering), *where))
    return bands
