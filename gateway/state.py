"""Typed application state shared by the handlers (aiohttp AppKey)."""

from __future__ import annotations

from dataclasses import dataclass

from aiohttp import web

from engine.base import Engine
from gateway.config import Settings
from gateway.limits import ConcurrencyLimiter
from gateway.turns import TurnService
from sessions.checkpoints import CheckpointStore
from sessions.registry import SessionRegistry


@dataclass
class AppState:
    settings: Settings
    engine: Engine
    registry: SessionRegistry
    turns: TurnService
    limiter: ConcurrencyLimiter
    checkpoints: CheckpointStore | None = None  # prefix checkpoints (the in-process engine only)
    ready: bool = False


APP_STATE: web.AppKey[AppState] = web.AppKey("pflash_state", AppState)
# Per-request: the tenant (hash of the caller's API key, "" without auth) and whether it is admin.
TENANT: web.RequestKey[str] = web.RequestKey("pflash_tenant", str)
IS_ADMIN: web.RequestKey[bool] = web.RequestKey("pflash_is_admin", bool)
