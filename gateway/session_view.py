"""What `GET /v1/sessions/{id}` adds for the status page: the session's turns and each compressed
message as a strip of its original lines.

Read from the session record only, nothing kept twice: the turn log says what each turn did, the
kept-line maps hold the kept ranges, the recall log the recalled units, and the transcript (the
last prompt as served) where the model read each kept or recalled line. Line numbers are 0-based
inclusive; `message`/`line` point into the transcript's messages and their "\\n"-split lines.
"""

from __future__ import annotations

from typing import Any

from policies.kept_lines import KeptLineMap, content_hash
from policies.rendering import Range
from policies.strip import excerpts, note_total_lines, strip_bands
from sessions.record import SessionRecord

_UNKNOWN_SOURCE = "an earlier message"  # the recall gate's label when a map has none


def turns_view(record: SessionRecord) -> list[dict[str, Any]]:
    """The turn log, with the kept ranges and recalled units it refers to filled in."""
    units_by_turn = {entry.turn_hash: entry.units for entry in record.recall_log}
    out: list[dict[str, Any]] = []
    for entry in record.turn_log:
        turn = dict(entry)
        compression = entry.get("compression")
        if isinstance(compression, dict):
            kept = record.kept_maps.get(str(compression.get("message", "")))
            ranges = kept.kept_ranges if kept is not None and compression.get("compressed") else ()
            turn["compression"] = {**compression, "kept_ranges": [list(r) for r in ranges]}
        recall = entry.get("recall")
        if isinstance(recall, dict):
            units = units_by_turn.get(str(recall.get("turn", "")), ())
            turn["recall"] = {**recall, "units": [
                {"message": h, "label": record.map_labels.get(h, _UNKNOWN_SOURCE), "first": a, "last": b}
                for h, a, b in units]}
        out.append(turn)
    return out


def compressed_view(record: SessionRecord) -> list[dict[str, Any]]:
    """Every compressed message of the session: kept ranges, recalled ranges, and its strip."""
    hashes = [content_hash(m["content"]) for m in record.transcript]
    logged_lines = {
        str(c.get("message")): int(c.get("lines", 0))
        for entry in record.turn_log
        if isinstance(c := entry.get("compression"), dict) and c.get("compressed")
    }
    out: list[dict[str, Any]] = []
    for key, kept in record.kept_maps.items():
        served_in = hashes.index(kept.rendered_hash) if kept.rendered_hash in hashes else None
        recalled = _recalled(record, key, hashes)
        n_lines = logged_lines.get(key) or _lines_from(record, served_in) or _last_known_line(kept, recalled) + 1
        bands = strip_bands(kept.kept_ranges, recalled, n_lines, served_in)
        out.append({
            "message": key,
            "label": record.map_labels.get(key, _UNKNOWN_SOURCE),
            "lines": n_lines,
            "original_tokens": kept.total_tokens,
            "kept_tokens": kept.kept_tokens,
            "kept_ranges": [list(r) for r in kept.kept_ranges],
            "recalled_ranges": [list(r) for r, _, _ in recalled],
            "served_in": served_in,
            "bands": [{"first": b.first, "last": b.last, "kind": "kept" if b.kept else "omitted",
                       "recalled": b.recalled, "message": b.served_in, "line": b.served_line} for b in bands],
        })
    return out


def _recalled(record: SessionRecord, key: str, hashes: list[str]) -> list[tuple[Range, int | None, int | None]]:
    """This message's recalled lines as the model read them: each excerpt (adjacent units merged),
    with where it sits in the transcript; units whose excerpt is not at hand, as they are."""
    label = record.map_labels.get(key, _UNKNOWN_SOURCE)
    out: set[tuple[Range, int | None, int | None]] = set()
    for entry in record.recall_log:
        mine = [(a, b) for h, a, b in entry.units if h == key]
        if not mine:
            continue
        rendered_hash = content_hash(entry.rendered)
        at = hashes.index(rendered_hash) if rendered_hash in hashes else None
        blocks = [e for e in excerpts(entry.rendered) if e.label == label]
        for first, last in mine:
            block = next((e for e in blocks if e.first <= first and last <= e.last), None)
            if at is None or block is None:
                out.add(((first, last), None, None))
            else:
                out.add(((block.first, block.last), at, block.header_line + 1))
    return sorted(out, key=lambda r: r[0])


def _lines_from(record: SessionRecord, served_in: int | None) -> int | None:
    return note_total_lines(record.transcript[served_in]["content"]) if served_in is not None else None


def _last_known_line(kept: KeptLineMap, recalled: list[tuple[Range, int | None, int | None]]) -> int:
    return max([last for _, last in kept.kept_ranges] + [r[1] for r, _, _ in recalled] + [0])
