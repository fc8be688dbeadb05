"""What the admin API and the status page are told of one stored or live session or branch."""

from __future__ import annotations

from dataclasses import dataclass


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
