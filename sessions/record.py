"""What the gateway remembers about one session (besides its KV state).

A record is changed from the event loop (compression, what was served) and from worker threads
(the recall gate), and read by the store's I/O thread: every change goes through a method that
holds the record's own lock and bumps `version`, and persistence works on `snapshot()`, a plain
copy taken under that lock. The lock is only ever held for in-memory work, never for I/O.
"""

from __future__ import annotations

import hashlib
import secrets
import threading
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from policies.kept_lines import KeptLineMap

TURN_LOG_LIMIT = 100  # turns kept per session for the status page (oldest dropped first)
SHARED_LIMIT = 256  # kept-line maps (and recalls) a session's pool holds, the least recently shared dropped


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
class BranchEntry:
    """One conversation of a session, as its root record lists it (policies/branches.py)."""

    branch_id: str  # the branch's own record and KV state go by this id
    kind: str  # "main" | "agent" | "side" | "fork"
    hint: str = ""  # the agent id it was opened for ("" for the agent's own turns)
    tools: bool = False  # its requests offer tools
    digests: tuple[str, ...] = ()  # of the last request it served
    prompt_tokens: int = 0  # of the last prompt it served: what the next turn should find cached
    last_used: float = field(default_factory=time.time)

    @property
    def side(self) -> bool:
        return self.kind == "side"

    def to_dict(self) -> dict[str, Any]:
        return {"branch_id": self.branch_id, "kind": self.kind, "hint": self.hint, "tools": self.tools,
                "digests": list(self.digests), "prompt_tokens": self.prompt_tokens, "last_used": self.last_used}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> BranchEntry:
        return cls(str(data["branch_id"]), str(data["kind"]), str(data.get("hint", "")), bool(data.get("tools")),
                   tuple(str(d) for d in data.get("digests", [])), int(data.get("prompt_tokens", 0)),
                   float(data.get("last_used", 0.0)))


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
    # A branch's session (its root record's id); "" for a root, whose `branches` lists every
    # conversation of the session (itself included once it served one).
    parent: str = ""
    kind: str = "main"
    hint: str = ""
    branches: dict[str, BranchEntry] = field(default_factory=dict)
    branch_serial: int = 0  # how many branches the session ever opened
    # A root's session-wide pool: every kept-line map and recall any of its conversations made, by
    # content (a map is a function of its message's content), so that a conversation that carries
    # the same message (a new branch, a tool list that changed, a follow-up without tools) serves
    # it exactly as it was served before, whichever branch the router chose.
    shared_maps: dict[str, KeptLineMap] = field(default_factory=dict)
    shared_labels: dict[str, str] = field(default_factory=dict)
    shared_recalls: dict[str, RecallEntry] = field(default_factory=dict)
    # Bumped by every change a later turn depends on; the registry compares it with what it wrote.
    version: int = field(default=0, compare=False)
    _lock: threading.RLock = field(default_factory=threading.RLock, init=False, repr=False, compare=False)

    # --- changes (each under the record's lock) ------------------------------------------------
    def count(self, name: str, amount: int = 1) -> None:
        with self._lock:
            self.counters[name] = self.counters.get(name, 0) + amount
            self.version += 1

    def add_kept_map(self, kept: KeptLineMap, label: str, features: Mapping[str, tuple[bytes, int]]) -> None:
        with self._lock:
            self.kept_maps[kept.content_hash] = kept
            self.map_labels[kept.content_hash] = label
            self.unit_features.update(features)
            self.version += 1

    def add_unit_features(self, features: Mapping[str, tuple[bytes, int]]) -> None:
        """Unit vectors computed after the turn (gateway/background_embedding.py)."""
        with self._lock:
            self.unit_features.update(features)
            self.version += 1

    def add_recall(self, entry: RecallEntry) -> None:
        with self._lock:
            self.recall_log.append(entry)
            self.version += 1

    def note_served(self, served_hashes: list[str], transcript: list[dict[str, str]], counts: Iterable[tuple[str, int]],
                    turn: dict[str, Any] | None = None, client_key: str | None = None) -> None:
        """One finished turn: what the model saw, its counts, its line in the turn log."""
        with self._lock:
            self.served_hashes = served_hashes
            self.transcript = transcript
            self.last_used = time.time()
            for name, amount in counts:
                self.counters[name] = self.counters.get(name, 0) + amount
            if client_key is not None:
                self.client_key = client_key
            if turn is not None:
                self.log_turn(turn)
            self.version += 1

    def forget_all_but(self, history: set[str]) -> None:
        """Drop the kept-line maps and recall entries of messages no longer in the conversation
        (`history`: the keys of the messages the client sent, by content for kept maps, by turn
        for recalls): an agent that compacted its history never resends them, and the record stays
        the size of what it still serves."""
        with self._lock:
            gone = [h for h in self.kept_maps if h not in history]
            stale = [e for e in self.recall_log if e.turn_hash not in history]
            if not gone and not stale:
                return
            for key in gone:
                del self.kept_maps[key]
                self.map_labels.pop(key, None)
            self.recall_log = [e for e in self.recall_log if e.turn_hash in history]
            self.version += 1

    def publish(self, branch: SessionRecord) -> None:
        """(On a root) Take a branch's kept-line maps and recalls into the session-wide pool."""
        with branch._lock:
            maps, labels, recalls = dict(branch.kept_maps), dict(branch.map_labels), list(branch.recall_log)
        with self._lock:
            changed = False
            for key, kept in maps.items():
                changed |= self.shared_maps.pop(key, None) != kept
                self.shared_maps[key] = kept  # re-inserted: the most recently shared
                self.shared_labels[key] = labels.get(key, "")
            for entry in recalls:
                changed |= self.shared_recalls.pop(entry.turn_hash, None) != entry
                self.shared_recalls[entry.turn_hash] = entry
            while len(self.shared_maps) > SHARED_LIMIT:
                oldest = next(iter(self.shared_maps))
                del self.shared_maps[oldest]
                self.shared_labels.pop(oldest, None)
            while len(self.shared_recalls) > SHARED_LIMIT:
                del self.shared_recalls[next(iter(self.shared_recalls))]
            if changed:
                self.version += 1

    def adopt(self, root: SessionRecord, contents: set[str], turns: set[str]) -> int:
        """(On a branch) Take from the session's pool the maps of the messages (`contents`: content
        hashes) and the recalls of the turns (`turns`: turn keys) this request carries and this
        branch lacks; how many."""
        with root._lock:
            maps = {h: (root.shared_maps[h], root.shared_labels.get(h, "")) for h in contents if h in root.shared_maps}
            recalls = [root.shared_recalls[k] for k in turns if k in root.shared_recalls]
        with self._lock:
            added = 0
            for key, (kept, label) in maps.items():
                if key not in self.kept_maps:
                    self.kept_maps[key], self.map_labels[key] = kept, label
                    added += 1
            have = {e.turn_hash for e in self.recall_log}
            for entry in recalls:
                if entry.turn_hash not in have:
                    self.recall_log.append(entry)
                    added += 1
            if added:
                self.version += 1
            return added

    def log_turn(self, entry: dict[str, Any]) -> None:
        with self._lock:
            self.turn_log.append(entry)
            del self.turn_log[:-TURN_LOG_LIMIT]
            self.version += 1

    def open_branch(self, kind: str, hint: str, tools: bool) -> BranchEntry:
        """A new conversation of this (root) session: the root's own id for its main conversation,
        else a fresh id derived from the root's."""
        with self._lock:
            if kind == "main" and self.session_id not in self.branches:
                branch_id = self.session_id
            else:
                self.branch_serial += 1
                # Random too: a root lost (a failed write) and made anew must not hand out an id
                # whose old record and KV state are still stored.
                salt = secrets.token_hex(8)
                branch_id = hashlib.sha256(f"{self.session_id}\x00branch\x00{self.branch_serial}\x00{salt}".encode()).hexdigest()
            entry = BranchEntry(branch_id, kind, hint, tools)
            self.branches[branch_id] = entry
            self.version += 1
            return entry

    def branch_served(self, branch_id: str, digests: tuple[str, ...], prompt_tokens: int) -> None:
        """A branch finished a turn: what it served is what the next request is matched against."""
        with self._lock:
            entry = self.branches.get(branch_id)
            if entry is None:
                return  # dropped meanwhile (the session's branch limit, or deleted)
            self.branches[branch_id] = BranchEntry(entry.branch_id, entry.kind, entry.hint, entry.tools, digests,
                                                   prompt_tokens, time.time())
            self.last_used = time.time()
            self.version += 1

    def drop_branch(self, branch_id: str) -> None:
        with self._lock:
            if self.branches.pop(branch_id, None) is not None:
                self.version += 1

    # --- consistent reads ----------------------------------------------------------------------
    def branch_entries(self) -> list[BranchEntry]:
        with self._lock:
            return list(self.branches.values())

    def recalled_units(self) -> set[tuple[str, int, int]]:
        with self._lock:
            return {unit for entry in self.recall_log for unit in entry.units}

    def features_copy(self) -> dict[str, tuple[bytes, int]]:
        with self._lock:
            return dict(self.unit_features)

    def seen_hashes(self) -> set[str]:
        with self._lock:
            return set(self.served_hashes) | set(self.kept_maps)

    def snapshot(self) -> tuple[int, dict[str, Any]]:
        """(version, the record as plain data): a copy that I/O can take its time over."""
        with self._lock:
            return self.version, self.to_dict()

    def approx_bytes(self) -> int:
        """What the record costs in RAM, roughly (for the RAM budget): texts, features, maps."""
        with self._lock:
            size = 512 + 80 * len(self.served_hashes) + 160 * len(self.kept_maps)
            size += sum(len(m["content"]) + 64 for m in self.transcript)
            size += sum(len(raw) + 96 for raw, _n in self.unit_features.values())
            size += sum(len(e.rendered) + 64 * len(e.units) + 96 for e in self.recall_log)
            size += sum(16 * len(m.kept_ranges) for m in self.kept_maps.values())
            size += sum(160 + 40 * len(e.digests) for e in self.branches.values())
            size += 200 * len(self.shared_maps) + sum(len(e.rendered) + 96 for e in self.shared_recalls.values())
            return size

    def to_dict(self) -> dict[str, Any]:
        with self._lock:
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
                "parent": self.parent,
                "kind": self.kind,
                "hint": self.hint,
                "branches": [e.to_dict() for e in self.branches.values()],
                "branch_serial": self.branch_serial,
                "shared_maps": {h: m.to_dict() for h, m in self.shared_maps.items()},
                "shared_labels": dict(self.shared_labels),
                "shared_recalls": [e.to_dict() for e in self.shared_recalls.values()],
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
            parent=str(data.get("parent", "")),
            kind=str(data.get("kind", "main")),
            hint=str(data.get("hint", "")),
            branches={e.branch_id: e for e in map(BranchEntry.from_dict, data.get("branches", []))},
            branch_serial=int(data.get("branch_serial", 0)),
            shared_maps={str(h): KeptLineMap.from_dict(m) for h, m in data.get("shared_maps", {}).items()},
            shared_labels={str(k): str(v) for k, v in data.get("shared_labels", {}).items()},
            shared_recalls={e.turn_hash: e for e in map(RecallEntry.from_dict, data.get("shared_recalls", []))},
        )
