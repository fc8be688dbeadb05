"""What the gateway remembers about one session (besides its KV state)."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

from policies.kept_lines import KeptLineMap

TURN_LOG_LIMIT = 100  # turns kept per session for the status page (oldest dropped first)


@dataclass
class RecallEntry:
    """A follow-up turn that recalled omitted lines: the rewritten turn must render the same again."""

    turn_hash: str  # content hash of the client's original turn text
    rendered: str  # the turn as the model saw it (excerpts + original text)
    units: tuple[tuple[str, int, int], ...]  # (original content hash, first line, last line), 0-based

    def to_dict(self) -> dict[str, Any]:
        return {"turn_hash": self.turn_hash, "rendered": self.rendered, "units": [list(u) for u in self.units]}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> RecallEntry:
        return cls(str(data["turn_hash"]), str(data["rendered"]), tuple((str(h), int(a), int(b)) for h, a, b in data["units"]))


@dataclass
class SessionRecord:
    session_id: str
    tenant: str  # hash of the API key that owns it ("" without auth)
    key_source: str = ""
    created_at: float = field(default_factory=time.time)
    last_used: float = field(default_factory=time.time)
    served_hashes: list[str] = field(default_factory=list)  # per message, as the model saw it
    kept_maps: dict[str, KeptLineMap] = field(default_factory=dict)  # by original content hash
    # Which message (by original content hash) each kept map came from, for recall labels.
    map_labels: dict[str, str] = field(default_factory=dict)
    recall_log: list[RecallEntry] = field(default_factory=list)
    counters: dict[str, int] = field(default_factory=dict)
    transcript: list[dict[str, str]] = field(default_factory=list)  # last prompt as served
    # The drafter's per-unit features of this session's compressed messages (by unit-text sha256):
    # kept and persisted with the session so a follow-up's recall gate reads only the new question.
    unit_features: dict[str, tuple[bytes, int]] = field(default_factory=dict)
    client_key: str = ""  # the client's own session name (e.g. its X-Session-Id); "" when derived
    # What each recent turn did (tokens, timings, compression, recall): small plain dicts, bounded.
    turn_log: list[dict[str, Any]] = field(default_factory=list)

    def log_turn(self, entry: dict[str, Any]) -> None:
        self.turn_log.append(entry)
        del self.turn_log[:-TURN_LOG_LIMIT]

    def count(self, name: str, amount: int = 1) -> None:
        self.counters[name] = self.counters.get(name, 0) + amount

    def recalled_units(self) -> set[tuple[str, int, int]]:
        return {unit for entry in self.recall_log for unit in entry.units}

    def to_dict(self) -> dict[str, Any]:
        return {
            "session_id": self.session_id,
            "tenant": self.tenant,
            "key_source": self.key_source,
            "created_at": self.created_at,
            "last_used": self.last_used,
            "served_hashes": list(self.served_hashes),
            "kept_maps": {h: m.to_dict() for h, m in self.kept_maps.items()},
            "map_labels": dict(self.map_labels),
            "recall_log": [e.to_dict() for e in self.recall_log],
            "counters": dict(self.counters),
            "transcript": list(self.transcript),
            "unit_features": {k: [raw, n] for k, (raw, n) in self.unit_features.items()},
            "client_key": self.client_key,
            "turn_log": [dict(e) for e in self.turn_log],
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> SessionRecord:
        return cls(
            session_id=str(data["session_id"]),
            tenant=str(data["tenant"]),
            key_source=str(data.get("key_source", "")),
            created_at=float(data["created_at"]),
            last_used=float(data["last_used"]),
            served_hashes=[str(h) for h in data.get("served_hashes", [])],
            kept_maps={str(h): KeptLineMap.from_dict(m) for h, m in data.get("kept_maps", {}).items()},
            map_labels={str(k): str(v) for k, v in data.get("map_labels", {}).items()},
            recall_log=[RecallEntry.from_dict(e) for e in data.get("recall_log", [])],
            counters={str(k): int(v) for k, v in data.get("counters", {}).items()},
            transcript=[{"role": str(m["role"]), "content": str(m["content"])} for m in data.get("transcript", [])],
            unit_features={str(k): (bytes(raw), int(n)) for k, (raw, n) in data.get("unit_features", {}).items()},
            client_key=str(data.get("client_key", "")),
            turn_log=[dict(e) for e in data.get("turn_log", []) if isinstance(e, dict)][-TURN_LOG_LIMIT:],
        )
