"""Forgetting a session everywhere it lives: the KV the engine holds for it, the prompt checkpoints
it saved, its record and files. The admin API's delete and a branch dropped by the session's
branch limit both go this way, so neither leaves KV or checkpoints behind."""

from __future__ import annotations

from engine.base import Engine
from gateway.branches import Forget
from sessions.checkpoints import CheckpointStore
from sessions.registry import SessionRegistry


def session_forgetter(engine: Engine, registry: SessionRegistry, checkpoints: CheckpointStore | None) -> Forget:
    forget_kv = getattr(engine, "forget", None)

    async def forget(session_id: str) -> None:
        if forget_kv is not None:  # a new session under this key starts clean
            await forget_kv(session_id)
        if checkpoints is not None:
            checkpoints.forget_owner(session_id)
        await registry.delete(session_id)

    return forget
