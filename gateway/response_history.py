"""Recent OpenAI Responses kept in memory, so `previous_response_id` can continue from them.

A response is stored as the neutral conversation it continued (without the request's
`instructions`, which the Responses API does not carry over) plus the assistant reply. Messages are
immutable and a continuation reuses the stored tuple's objects, so a chain of responses shares its
history instead of copying it. Nothing is written to disk: after a restart an old id is simply
unknown, and the client gets a clear 400 and can resend the full input (what Codex does anyway
with `store: false`).
"""

from __future__ import annotations

from cachetools import LRUCache

from policies.conversation_types import Message

DEFAULT_CAPACITY = 256


class ResponseHistory:
    """The last `capacity` stored responses of each tenant, least recently used evicted first."""

    def __init__(self, capacity: int = DEFAULT_CAPACITY) -> None:
        if capacity < 1:
            raise ValueError("capacity must be at least 1")
        self.capacity = capacity
        self._by_tenant: dict[str, LRUCache[str, tuple[Message, ...]]] = {}

    def put(self, tenant: str, response_id: str, messages: tuple[Message, ...]) -> None:
        self._by_tenant.setdefault(tenant, LRUCache(self.capacity))[response_id] = messages

    def get(self, tenant: str, response_id: str) -> tuple[Message, ...] | None:
        """The stored conversation (reply included), or None; scoped so tenants never see each other's."""
        entries = self._by_tenant.get(tenant)
        return entries.get(response_id) if entries is not None else None  # a read renews it

    def __len__(self) -> int:
        return sum(len(entries) for entries in self._by_tenant.values())
