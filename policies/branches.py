"""Conversation branches inside one session: which branch a request continues. Pure, no I/O.

Real agents send several conversations under one session id (tests/test_captures_e2e.py replays
them): Claude Code's main agent, its sub-agents (header `x-claude-code-agent-id`) and side requests
(a title, the auto-mode safety classifier); Codex's main thread and the threads it spawns
(`thread-id`). Each
conversation is a branch with its own KV state and kept-line maps, so a sub-agent's turn between
two main turns costs the main agent nothing.

A request is described by its digests: one for its tools, then one per message as the client sent
it (after the adapters' normalisation: a string and one text block are the same message, cache
markers are not part of it). A branch remembers the digests of the last request it served. A
request continues the branch whose served request it extends the furthest; an agent id (the
`hint`) splits branches up front, and a side request never joins a branch of the agent's own turns.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from dataclasses import dataclass

from policies.conversation_types import Message, ToolSpec

DIGEST_HEX = 32  # 128 bits of sha256 per message: the served history of a branch, compared by digest


def message_digest(message: Message) -> str:
    """Everything of a message that reaches the prompt, as one digest."""
    parts = [message.role, message.content, message.tool_call_id or "", message.name or "",
             "1" if message.is_error else "0"]
    for call in message.tool_calls:
        parts += [call.id, call.name, call.arguments]
    for attachment in message.attachments:  # another image behind the same placeholder is another message
        parts += [attachment.placeholder, attachment.url]
    return hashlib.sha256("\x00".join(parts).encode("utf-8", "surrogatepass")).hexdigest()[:DIGEST_HEX]


def tools_digest(tools: Sequence[ToolSpec]) -> str:
    listing = [[t.name, t.description, t.parameters] for t in tools]
    return hashlib.sha256(json.dumps(listing, sort_keys=True).encode()).hexdigest()[:DIGEST_HEX]


def request_digests(tools: Sequence[ToolSpec], messages: Sequence[Message]) -> tuple[str, ...]:
    """The request as a branch sees it: its tools first (they render before the conversation),
    then each message in order."""
    return (tools_digest(tools), *(message_digest(m) for m in messages))


def shared_prefix(a: Sequence[str], b: Sequence[str]) -> int:
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n


def carries_messages(request: Sequence[str], served: Sequence[str]) -> bool:
    """Whether a request carries a branch's whole last request's messages (at least one), whatever
    its tools: a follow-up without `tools`, or after the tool list changed, is that conversation's turn."""
    return len(served) > 1 and tuple(request[1 : len(served)]) == tuple(served[1:])


def continues_conversation(request: Sequence[str], branches: Sequence[BranchView]) -> bool:
    """Whether the request continues one of the session's own (non-side) conversations."""
    return any(not b.side and carries_messages(request, b.digests) for b in branches)


def is_side_request(has_tools: bool, structured_output: bool, session_uses_tools: bool) -> bool:
    """A one-shot request beside the agent's own turns: no tools offered, and either a
    schema-shaped answer asked for (Claude Code's and Codex's title requests) or a session whose
    agent does use tools (Claude Code's safety classifier). A plain chat without tools is not one."""
    return not has_tools and (structured_output or session_uses_tools)


@dataclass(frozen=True)
class BranchView:
    """What the choice reads of one branch."""

    branch_id: str
    hint: str  # the agent id it was opened for; "" for the agent's own unhinted turns
    side: bool
    digests: tuple[str, ...]  # of the last request it served; () before its first
    last_used: float
    busy: bool  # a turn of it is running or queued


@dataclass(frozen=True)
class BranchChoice:
    branch_id: str | None  # None: open a new branch
    common: int  # leading digests shared with the branch's last served request
    extends: bool  # the request carries the branch's whole last request, then more (or the same)


def choose_branch(request: Sequence[str], hint: str, side: bool, branches: Sequence[BranchView]) -> BranchChoice:
    """The branch this request continues.

    Only branches of the same hint and the same side-ness are candidates. Among them:
    1. one whose last request this request extends, the longest such (then the most recent): its
       cache holds everything before the new messages, so the turn prefills only those; a busy one
       is waited for (turns of one branch are serialised); then one whose messages it carries under
       another tool list;
    2. else an idle one sharing the longest leading part beyond the tool list (an edited or rewound
       conversation: the engine reuses what it safely can; a side request: anything shared); for a
       hint, one sharing nothing too (the same agent);
    3. else a new branch. A busy branch is never forked into: a parallel request gets its own.
    """
    candidates = [b for b in branches if b.hint == hint and b.side == side]
    scored = [(shared_prefix(b.digests, request), b) for b in candidates]
    extended = [(common, b) for common, b in scored if b.digests and common == len(b.digests)]
    if extended:
        common, best = max(extended, key=lambda cb: (cb[0], cb[1].last_used))
        return BranchChoice(best.branch_id, common, True)
    # The same messages under another tool list (a follow-up without tools, a tool that connected
    # late): the same conversation, though its prompt now renders differently from the start.
    carried = [b for b in candidates if carries_messages(request, b.digests)]
    if carried:
        best = max(carried, key=lambda b: (len(b.digests), b.last_used))
        return BranchChoice(best.branch_id, 0, False)
    # Sharing only the tool list (digest 0) is no sign of one conversation: two conversations of one
    # agent under one session key share it. Side requests are one-shots of a few kinds (a title, the
    # classifier): any idle one of them that shares anything will do.
    least = 0 if side else 1
    idle = [(common, b) for common, b in scored if not b.busy and (common > least or hint or not b.digests)]
    if idle:
        common, best = max(idle, key=lambda cb: (cb[0], cb[1].last_used))
        return BranchChoice(best.branch_id, common, not best.digests)
    return BranchChoice(None, 0, False)
