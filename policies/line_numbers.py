"""Line-number prefixes tools put in front of file lines: Claude Code's Read (`71→`), `cat -n` and
`nl` (`    71\t`), `grep -n` on one file (`71:` a hit, `71-` context) or on many (`path:71:`).
Segmentation reads them to find a listing's structure; the ranker, to see which lines a request
cites and which code a transcript shows twice."""

from __future__ import annotations

import re
from typing import Pattern

NUMBER_PREFIXES: tuple[Pattern[str], ...] = (
    re.compile(r"^[ \t]*(\d+)→"),
    re.compile(r"^[ \t]*(\d+)\t"),
    # "12:code" / "12-context"; not "12:30" (a time) nor "2024-01" (a date).
    re.compile(r"^[ \t]*(\d+)[:\-](?!\d)"),
)
_GREP = re.compile(r"^(?P<path>[^\s:]+?)[:\-](?P<num>\d+)[:\-]")
_LETTER = re.compile(r"[A-Za-z_]")


def _grep_match(text: str) -> re.Match[str] | None:
    m = _GREP.match(text)
    # A path has a letter in it: rules out "2024-01-01 ..." read as path "2024", line 01.
    return m if m is not None and _LETTER.search(m.group("path")) else None


def grep_path(text: str) -> tuple[str, int] | None:
    """The file and line of a multi-file `grep -n` hit or context line."""
    m = _grep_match(text)
    return (m.group("path"), int(m.group("num"))) if m is not None else None


def line_number(text: str) -> tuple[int, int] | None:
    """(the number, where the prefix ends) for a line carrying any of the prefixes, else None."""
    for pattern in NUMBER_PREFIXES:
        m = pattern.match(text)
        if m is not None:
            return int(m.group(1)), m.end()
    m = _grep_match(text)
    return (int(m.group("num")), m.end()) if m is not None else None


def without_line_number(text: str) -> str:
    found = line_number(text)
    return text[found[1] :] if found else text
