"""The kept-line map: how to re-serve a compressed message byte-identically on every later turn.

Clients resend the original long output each turn. The map, keyed by the original's hash, holds the
cut (kept ranges and the counts the note shows) and the hash of what was served, so re-applying it
either reproduces the served bytes exactly or fails loudly: a silent difference would break the
cached token prefix.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from policies.rendering import Range, normalize_ranges, render_compressed, split_lines


def content_hash(text: str) -> str:
    """sha256 hex digest of the UTF-8 bytes."""
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


@dataclass(frozen=True)
class KeptLineMap:
    content_hash: str
    kept_ranges: tuple[Range, ...]
    total_tokens: int
    kept_tokens: int
    rendered_hash: str

    def to_dict(self) -> dict[str, Any]:
        """Plain types only (str, int, list), ready for msgpack."""
        return {
            "content_hash": self.content_hash,
            "kept_ranges": [[a, b] for a, b in self.kept_ranges],
            "total_tokens": self.total_tokens,
            "kept_tokens": self.kept_tokens,
            "rendered_hash": self.rendered_hash,
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> KeptLineMap:
        """Inverse of `to_dict`; ValueError on a missing or mistyped field."""
        try:
            ranges_raw = d["kept_ranges"]
            fields = (d["content_hash"], d["total_tokens"], d["kept_tokens"], d["rendered_hash"])
        except (KeyError, TypeError) as e:
            raise ValueError(f"kept-line map lacks field {e}") from None
        c_hash, total, kept, r_hash = fields
        if not isinstance(c_hash, str) or not isinstance(r_hash, str):
            raise ValueError("kept-line map hashes must be strings")
        if not all(isinstance(x, int) and not isinstance(x, bool) for x in (total, kept)):
            raise ValueError("kept-line map token counts must be integers")
        ranges: list[Range] = []
        if not isinstance(ranges_raw, (list, tuple)):
            raise ValueError("kept-line map kept_ranges must be a list")
        for r in ranges_raw:
            if (
                not isinstance(r, (list, tuple))
                or len(r) != 2
                or not all(isinstance(x, int) and not isinstance(x, bool) for x in r)
            ):
                raise ValueError(f"kept-line map range {r!r} is not a pair of integers")
            ranges.append((r[0], r[1]))
        return cls(c_hash, tuple(ranges), total, kept, r_hash)


def build_kept_map(
    original: str, kept_ranges: Sequence[Range], total_tokens: int, kept_tokens: int
) -> KeptLineMap:
    """The map of a cut just served (renders once to hash what was served)."""
    lines = split_lines(original)
    ranges = normalize_ranges(kept_ranges, len(lines))
    rendered = render_compressed(lines, ranges, total_tokens, kept_tokens)
    return KeptLineMap(content_hash(original), ranges, total_tokens, kept_tokens, content_hash(rendered))


def apply_kept_map(original: str, m: KeptLineMap) -> str:
    """Re-render `original` under `m`, byte-identical to what was served before.

    ValueError when `original` is not the content the map was made for, or the rendering does
    not hash to what was served (e.g. the renderer changed since).
    """
    if content_hash(original) != m.content_hash:
        raise ValueError("content hash mismatch: this map was made for another text")
    rendered = render_compressed(split_lines(original), m.kept_ranges, m.total_tokens, m.kept_tokens)
    if content_hash(rendered) != m.rendered_hash:
        raise ValueError("rendered hash mismatch: re-rendering does not reproduce what was served")
    return rendered
