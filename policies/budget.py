"""The budget curve: what fraction of a long message's tokens is kept, by its size.

A curve is a sorted sequence of (total_tokens, keep_fraction) points. Between points the fraction is
linear in total_tokens; below the first point and above the last it is flat.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

Curve = tuple[tuple[int, float], ...]

DEFAULT_CURVE_SPEC = "16384:0.315 32768:0.270 65536:0.270 120000:0.225"


def parse_curve(spec: str) -> Curve:
    """Parse "TOKENS:FRACTION ..." (whitespace or comma separated) into a validated curve.

    Raises ValueError when a point is malformed, tokens are not positive integers strictly
    increasing, or a fraction is not in (0, 1].
    """
    items = [p for p in spec.replace(",", " ").split() if p]
    if not items:
        raise ValueError("budget curve is empty; expected points like '16384:0.315 32768:0.27'")
    points: list[tuple[int, float]] = []
    for item in items:
        left, sep, right = item.partition(":")
        if not sep:
            raise ValueError(f"budget curve point {item!r} is not TOKENS:FRACTION")
        try:
            tokens = int(left)
        except ValueError:
            raise ValueError(f"budget curve point {item!r}: tokens {left!r} is not an integer") from None
        try:
            fraction = float(right)
        except ValueError:
            raise ValueError(f"budget curve point {item!r}: fraction {right!r} is not a number") from None
        points.append((tokens, fraction))
    return validate_curve(points)


def validate_curve(points: Sequence[tuple[int, float]]) -> Curve:
    if not points:
        raise ValueError("budget curve has no points")
    for k, (tokens, fraction) in enumerate(points):
        if tokens <= 0:
            raise ValueError(f"budget curve point {k + 1}: tokens must be positive, got {tokens}")
        if not (math.isfinite(fraction) and 0.0 < fraction <= 1.0):
            raise ValueError(f"budget curve point {k + 1}: fraction must be in (0, 1], got {fraction}")
        if k and tokens <= points[k - 1][0]:
            raise ValueError(
                f"budget curve must be sorted by strictly increasing tokens: "
                f"{points[k - 1][0]} then {tokens}"
            )
    return tuple((int(t), float(f)) for t, f in points)


def keep_fraction(total_tokens: int, curve: Curve) -> float:
    """Fraction of `total_tokens` to keep: piecewise linear between points, flat outside."""
    if not curve:
        raise ValueError("budget curve has no points")
    if total_tokens <= curve[0][0]:
        return curve[0][1]
    for (x0, f0), (x1, f1) in zip(curve, curve[1:]):
        if total_tokens <= x1:
            return f0 + (f1 - f0) * (total_tokens - x0) / (x1 - x0)
    return curve[-1][1]


def token_budget(total_tokens: int, curve: Curve) -> int:
    """Tokens of original lines to keep (rounded down, so the budget is never exceeded)."""
    if total_tokens < 0:
        raise ValueError(f"total_tokens must be non-negative, got {total_tokens}")
    return math.floor(total_tokens * keep_fraction(total_tokens, curve))
