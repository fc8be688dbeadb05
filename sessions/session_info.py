"""What the admin API and the status page are told of one stored or live session or branch."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from engine.base import SavedState
from sessions.state_buffers import held_bytes


@dataclass(frozen=True)
class SessionInfo:
    session_id: str
    tenant: str
    parent: str  # "" for a session; its root record's id for a branch
    kind: str  # of the conversation: "main" | "agent" | "side" | "fork"
    hint: str  # the agent id (Claude Code's sub-agent, Codex's thread) a branch was opened for
    tier: str  # "context" | "ram" | "disk" | "none": where the engine finds its KV next
    tokens: int
    ram_bytes: int
    disk_bytes: int
    last_used: float
    created_at: float


def session_info(session_id: str, record: Any, disk: Any, ram: SavedState | None, in_context: int | None) -> SessionInfo:
    """One session as listed: its live record (a SessionRecord) or its store index entry (a
    StoreEntry), and where its KV is: the engine's context (`in_context` tokens), RAM, disk."""
    if in_context is not None:
        tier, tokens = "context", in_context
    elif ram is not None:
        tier, tokens = "ram", len(ram.tokens)
    elif disk is not None and disk.kv_tokens:
        tier, tokens = "disk", disk.kv_tokens
    else:
        tier, tokens = "none", 0
    source = record or disk
    return SessionInfo(
        session_id=session_id,
        tenant=source.tenant if source else "",
        parent=source.parent if source else "",
        kind=source.kind if source else "main",
        hint=source.hint if source else "",
        tier=tier,
        tokens=tokens,
        ram_bytes=held_bytes(ram.blob) if ram is not None else 0,
        disk_bytes=disk.total_bytes if disk else 0,
        last_used=source.last_used if source else 0.0,
        created_at=record.created_at if record else 0.0,
    )
