"""Which session a request belongs to, scoped by tenant, as a hash safe to use as a directory name."""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass

from policies.conversation_types import Conversation, SessionHints

# Claude Code's legacy metadata.user_id: "user_<hash>_account_<uuid>_session_<uuid>".
_LEGACY_SESSION = re.compile(r"_session_([0-9a-fA-F-]{8,})$")


@dataclass(frozen=True)
class SessionIdentity:
    key: str  # the client's own key, or a derived one ("prefix:<hash>")
    source: str  # which hint it came from
    session_id: str  # sha256 of (tenant, key): the only form used for storage and logs


def session_hash(tenant: str, key: str) -> str:
    return hashlib.sha256(f"{tenant}\x00{key}".encode()).hexdigest()


def _from_metadata_user_id(value: str) -> str | None:
    text = value.strip()
    if text.startswith("{"):
        try:
            decoded = json.loads(text)
        except ValueError:
            decoded = None
        if isinstance(decoded, dict) and isinstance(decoded.get("session_id"), str) and decoded["session_id"]:
            return decoded["session_id"]
    match = _LEGACY_SESSION.search(text)
    if match:
        return match.group(1)
    return None


def _prefix_key(conv: Conversation) -> str:
    """Without any hint: the system prompt + tools + first user message name the session."""
    digest = hashlib.sha256()
    for message in conv.messages:
        if message.role == "system":
            digest.update(b"S" + message.content.encode())
    for tool in conv.tools:
        digest.update(b"T" + json.dumps([tool.name, tool.description, tool.parameters], sort_keys=True).encode())
    first_user = next((m.content for m in conv.messages if m.role == "user"), "")
    digest.update(b"U" + first_user.encode())
    return "prefix:" + digest.hexdigest()


def resolve_session(conv: Conversation, tenant: str) -> SessionIdentity:
    hints = conv.hints
    candidates: list[tuple[str, str | None]] = [
        ("x-session-id", hints.x_session_id),
        ("x-claude-code-session-id", hints.claude_code_session_id),
        ("session_id", hints.session_id_header),
        ("prompt_cache_key", hints.prompt_cache_key),
        ("metadata.user_id", _from_metadata_user_id(hints.metadata_user_id) if hints.metadata_user_id else None),
        ("user", hints.user),
    ]
    for source, value in candidates:
        if value and value.strip():
            key = value.strip()
            return SessionIdentity(key, source, session_hash(tenant, key))
    key = _prefix_key(conv)
    return SessionIdentity(key, "prefix", session_hash(tenant, key))


def branch_hint(hints: SessionHints, session_key: str) -> str:
    """The conversation a request names inside its session, "" for the agent's own turns: a
    Claude Code sub-agent's id, or a Codex thread other than the session's main thread."""
    if hints.agent_id and hints.agent_id.strip():
        return "agent:" + hints.agent_id.strip()
    thread = (hints.thread_id or "").strip()
    if thread and thread not in (session_key, hints.session_id_header, hints.prompt_cache_key):
        return "thread:" + thread
    return ""
