"""The compression plan for one new long message: keep the best units, or step aside.

Every way this can go wrong (bad scores, a segmentation that does not cover the text, relevance too
flat to choose, nothing left out, no real saving) ends in "serve whole", never in an error: a
failure of the scorer must not fail the request.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from policies.rendering import (
    Range,
    marker_line,
    normalize_ranges,
    note_line,
    omitted_ranges,
    render_compressed,
    split_lines,
    kept_ranges_from_units,
)
from policies.segmentation import Unit, check_units
from policies.selection import DEFAULT_SPREAD_THRESHOLD, relevance_mass, relevance_spread, select_units, validate_scores

REASON_COMPRESSED = "compressed"
REASON_FLAT = "flat_relevance"
REASON_NOTHING_OMITTED = "nothing_omitted"
REASON_NO_GAIN = "no_gain"
REASON_SCORER_FAILED = "scorer_failed"
REASON_BAD_INPUT = "bad_input"


@dataclass(frozen=True)
class CompressionPlan:
    compressed: bool
    reason: str
    kept_ranges: tuple[Range, ...]  # 0-based inclusive; the whole text when not compressed
    text: str  # what to serve: the rendered message, or the original when not compressed
    total_lines: int
    total_tokens: int
    kept_tokens: int  # tokens of the kept original lines (note and markers not included)


def _whole(text: str, n_lines: int, total_tokens: int, reason: str) -> CompressionPlan:
    ranges = ((0, n_lines - 1),) if n_lines else ()
    return CompressionPlan(False, reason, ranges, text, n_lines, total_tokens, total_tokens)


def overhead_upper_bound(text: str) -> int:
    """Tokens `text` can cost at most: a byte-level tokenizer spends at most one token per byte."""
    return len(text.encode("utf-8"))


def plan_compression(
    text: str,
    line_tokens: Sequence[int],
    scores: Sequence[float] | None,
    units: Sequence[Unit],
    budget_tokens: int,
    pinned_lines: tuple[int, int] | None = None,
    spread_threshold: float = DEFAULT_SPREAD_THRESHOLD,
    count_tokens: Callable[[str], int] | None = None,
    size_exponent: float = 1.0,
) -> CompressionPlan:
    """Decide and render the compressed form of `text` (lines as `split_lines` gives them).

    `scores` has one entry per unit. Units overlapping `pinned_lines` are always kept; the rest by
    relevance per token**`size_exponent` (the scorer's own: `select_units`). The note
    and markers cost tokens too: they are counted with `count_tokens` when given, else bounded
    by their UTF-8 byte length, and the plan is only taken when kept lines plus that overhead is
    fewer tokens than the whole text ("no_gain" otherwise).
    """
    lines = split_lines(text)
    n = len(lines)
    total = sum(line_tokens)
    if len(line_tokens) != n:
        return _whole(text, n, total, f"{REASON_BAD_INPUT}: {n} lines but {len(line_tokens)} token counts")
    problem = check_units(units, line_tokens)
    if problem is not None:
        return _whole(text, n, total, f"{REASON_BAD_INPUT}: {problem}")
    if pinned_lines is not None and not (0 <= pinned_lines[0] <= pinned_lines[1] < n):
        return _whole(text, n, total, f"{REASON_BAD_INPUT}: pinned lines {pinned_lines} outside the text")
    problem = validate_scores(scores, len(units))
    if problem is not None or scores is None:
        return _whole(text, n, total, f"{REASON_SCORER_FAILED}: {problem}")
    pinned = frozenset(
        k for k, u in enumerate(units)
        if pinned_lines is not None and u.first <= pinned_lines[1] and u.last >= pinned_lines[0]
    )
    relevance = relevance_mass(scores)  # above the background: see relevance_mass
    kept_ranges = kept_ranges_from_units(units, select_units(units, relevance, budget_tokens, pinned, size_exponent))
    # Checked before flatness: with a budget covering everything, any relevance is "flat".
    if kept_ranges == ((0, n - 1),):
        return _whole(text, n, total, REASON_NOTHING_OMITTED)
    fraction = min(budget_tokens / total, 1.0) if total > 0 else 1.0
    if relevance_spread(relevance, [u.tokens for u in units], fraction) < spread_threshold:
        return _whole(text, n, total, REASON_FLAT)
    kept_tokens = sum(sum(line_tokens[a : b + 1]) for a, b in kept_ranges)
    shown = sum(b - a + 1 for a, b in kept_ranges)
    overhead_text = "\n".join(
        [note_line(shown, n, kept_tokens, total)] + [marker_line(a, b) for a, b in omitted_ranges(kept_ranges, n)]
    ) + "\n"
    overhead = count_tokens(overhead_text) if count_tokens is not None else overhead_upper_bound(overhead_text)
    if kept_tokens + overhead >= total:
        return _whole(text, n, total, REASON_NO_GAIN)
    rendered = render_compressed(lines, normalize_ranges(kept_ranges, n), total, kept_tokens)
    return CompressionPlan(True, REASON_COMPRESSED, kept_ranges, rendered, n, total, kept_tokens)
