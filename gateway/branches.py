"""Which conversation of a session a request continues, and one turn at a time per conversation.

A session (its root record) lists its conversations; each is a branch with its own record (kept-line
maps, recall log, turn log) and its own KV state in the engine's tiers, so the RAM and disk
budgets and their LRU work per branch. The choice itself is pure (policies/branches.py); here it
meets the registry and the event loop. Turns of one branch are serialised by the branch's lock,
held from the choice to the end of the turn; turns of different branches interleave.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

from policies.branches import (
    BranchView,
    choose_branch,
    continues_conversation,
    is_side_request,
    request_digests,
    shared_prefix,
)
from policies.conversation_types import Conversation
from sessions.identity import SessionIdentity, branch_hint
from sessions.record import BranchEntry, SessionRecord
from sessions.registry import SessionRegistry

log = logging.getLogger("pflash.branches")

MAX_BRANCHES = 16  # per session: beyond it the least recently used idle branch is dropped
Forget = Callable[[str], Awaitable[None]]  # a session everywhere it lives: KV, checkpoints, record, files


@dataclass
class BranchTurn:
    """One turn's branch: held (its lock) until `BranchRouter.release`."""

    root: SessionRecord
    record: SessionRecord  # the branch's own record (the root's, for the session's main conversation)
    kind: str  # "main" | "agent" | "side" | "fork"
    hint: str
    digests: tuple[str, ...]  # of this request: what the branch has served once the turn finished
    extends: bool  # the request carries the branch's whole last request
    previous_prompt_tokens: int  # the branch's last prompt: what this turn should find cached
    released: bool = field(default=False, repr=False)

    @property
    def side(self) -> bool:
        return self.kind == "side"

    @property
    def label(self) -> str:
        return self.kind + (f" {self.hint}" if self.hint else "")


class BranchRouter:
    def __init__(self, registry: SessionRegistry, max_branches: int = MAX_BRANCHES,
                 forget: Forget | None = None) -> None:
        self.registry = registry
        self.max_branches = max_branches
        self._forget = forget  # None: the registry's delete alone
        self._dropping: set[asyncio.Task[None]] = set()  # dropped branches being forgotten, off any turn's path
        # branch id -> (its lock, turns holding or waiting for it); entries live while in use.
        self._locks: dict[str, tuple[asyncio.Lock, int]] = {}
        # A busy branch is matched against the request it will have served once its queue drains
        # (a retry or a continuation of it waits for it; a sibling of it opens its own branch).
        self._planned: dict[str, tuple[str, ...]] = {}
        self.counters: dict[str, float] = {}

    def _count(self, name: str, amount: float = 1) -> None:
        self.counters[name] = self.counters.get(name, 0) + amount

    def busy(self, branch_id: str) -> bool:
        return branch_id in self._locks

    async def enter(self, conv: Conversation, identity: SessionIdentity, tenant: str) -> BranchTurn:
        """Choose the request's branch (opening one if none fits) and wait for its turn."""
        root = await self.registry.get_or_create(identity.session_id, tenant, identity.source)
        hint = branch_hint(conv.hints, identity.key)
        digests = request_digests(conv.tools, conv.messages)
        entries = root.branch_entries()
        views = [BranchView(e.branch_id, e.hint, e.side, self._planned.get(e.branch_id, e.digests), e.last_used,
                            self.busy(e.branch_id)) for e in entries]
        side = (is_side_request(bool(conv.tools), conv.response_format is not None, any(e.tools for e in entries))
                and not continues_conversation(digests, views))
        choice = choose_branch(digests, hint, side, views)
        # No await from the choice to _hold: a concurrent request of this session sees the branch busy.
        if choice.branch_id is None:
            entry = root.open_branch(_new_kind(root, side, hint), hint, bool(conv.tools))
            self._count(f"branches_opened:{entry.kind}")
            log.info("session %s: new %s branch %s", root.session_id[:12], entry.kind, entry.branch_id[:12])
            branch_id = entry.branch_id
        else:
            branch_id = choice.branch_id
        for victim in self._over_limit(root, keep=branch_id):
            self._drop_later(victim)
        lock = self._hold(branch_id)
        self._planned[branch_id] = digests
        acquired = False
        try:
            acquired = await lock.acquire()
            entry = next((e for e in root.branch_entries() if e.branch_id == branch_id), None)
            record = None
            if entry is not None:
                record = root if branch_id == root.session_id else await self.registry.get_or_create(
                    branch_id, tenant, identity.source, parent=root.session_id, kind=entry.kind, hint=entry.hint)
        except BaseException:
            self._let_go(branch_id, lock, acquired)
            raise
        if entry is None or record is None:  # dropped while this turn waited: choose afresh
            self._let_go(branch_id, lock, acquired)
            return await self.enter(conv, identity, tenant)
        # Read again under the lock: a turn that ran meanwhile changed what the branch served.
        extends = bool(entry.digests) and shared_prefix(entry.digests, digests) == len(entry.digests)
        self._count(f"branch_turns:{entry.kind}")
        return BranchTurn(root, record, entry.kind, entry.hint, digests, extends,
                          entry.prompt_tokens if extends else 0)

    async def find(self, conv: Conversation, identity: SessionIdentity, tenant: str) -> SessionRecord | None:
        """The record of the branch this request would continue, if any; changes nothing."""
        root = await self.registry.find(identity.session_id, tenant)
        if root is None:
            return None
        entries = root.branch_entries()
        digests = request_digests(conv.tools, conv.messages)
        views = [BranchView(e.branch_id, e.hint, e.side, e.digests, e.last_used, False) for e in entries]
        side = (is_side_request(bool(conv.tools), conv.response_format is not None, any(e.tools for e in entries))
                and not continues_conversation(digests, views))
        choice = choose_branch(digests, branch_hint(conv.hints, identity.key), side, views)
        if choice.branch_id is None:
            return None
        return root if choice.branch_id == root.session_id else await self.registry.find(choice.branch_id, tenant)

    def served(self, turn: BranchTurn, prompt_tokens: int) -> None:
        """The turn finished: the branch has served this request."""
        turn.root.branch_served(turn.record.session_id, turn.digests, prompt_tokens)

    def release(self, turn: BranchTurn) -> None:
        """End the turn's hold on its branch (idempotent)."""
        if turn.released:
            return
        turn.released = True
        held = self._locks.get(turn.record.session_id)
        if held is not None:
            self._let_go(turn.record.session_id, held[0], True)

    def _hold(self, branch_id: str) -> asyncio.Lock:
        lock, users = self._locks.get(branch_id, (None, 0))
        lock = lock or asyncio.Lock()
        self._locks[branch_id] = (lock, users + 1)
        return lock

    def _let_go(self, branch_id: str, lock: asyncio.Lock, acquired: bool) -> None:
        if acquired:
            lock.release()
        _lock, users = self._locks.get(branch_id, (lock, 1))
        if users <= 1:
            self._locks.pop(branch_id, None)
            self._planned.pop(branch_id, None)
        else:
            self._locks[branch_id] = (lock, users - 1)

    def _drop_later(self, branch_id: str) -> None:
        """Forget a dropped branch in the background: no turn waits for it, and a turn whose wait is
        cancelled leaves nothing behind (the root no longer lists it, so nothing reopens it)."""
        task = asyncio.get_running_loop().create_task(self._drop(branch_id))
        self._dropping.add(task)
        task.add_done_callback(self._dropping.discard)

    async def _drop(self, branch_id: str) -> None:
        try:
            await (self._forget or self.registry.delete)(branch_id)
        except Exception:
            log.exception("dropped branch %s: forgetting it failed (its files stay until deleted)", branch_id[:12])

    async def settle(self) -> None:
        """Wait for dropped branches to be forgotten (shutdown: none is left half deleted)."""
        while self._dropping:
            await asyncio.gather(*list(self._dropping), return_exceptions=True)

    def _over_limit(self, root: SessionRecord, keep: str) -> list[str]:
        """Branches dropped to keep the session within `max_branches`: idle ones, least recently
        used first, never the root's own conversation."""
        entries: list[BranchEntry] = sorted(root.branch_entries(), key=lambda e: e.last_used)
        excess = len(entries) - self.max_branches
        dropped: list[str] = []
        for entry in entries:
            if excess <= 0:
                break
            if entry.branch_id in (root.session_id, keep) or self.busy(entry.branch_id):
                continue
            root.drop_branch(entry.branch_id)
            dropped.append(entry.branch_id)
            excess -= 1
        if dropped:
            self._count("branches_dropped", len(dropped))
        return dropped


def _new_kind(root: SessionRecord, side: bool, hint: str) -> str:
    """A new branch's kind: the session's first own conversation is its main one (and takes the
    root's id: a session with one conversation is stored as before branches existed)."""
    if side:
        return "side"
    if hint:
        return "agent"
    return "fork" if root.session_id in root.branches else "main"
