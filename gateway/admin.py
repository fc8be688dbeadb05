"""Session admin endpoints and the status page's overview, always scoped to the caller's tenant."""

from __future__ import annotations

import asyncio
import re
from dataclasses import asdict
from typing import Any

from aiohttp import web

from gateway.errors import ApiError
from gateway.forget import session_forgetter
from gateway.metrics import scorer_name, snapshot
from gateway.session_view import compressed_view, turns_view
from gateway.state import APP_STATE, IS_ADMIN, TENANT, AppState
from policies.conversation_types import Message
from policies.observations import message_kind
from policies.strip import note_total_lines
from sessions.identity import session_hash
from sessions.record import SessionRecord
from sessions.registry import SessionRegistry
from sessions.session_info import SessionInfo

_HASH = re.compile(r"^[0-9a-f]{64}$")
_MIB = 1024 * 1024


def _require_admin(request: web.Request) -> str:
    if not request.get(IS_ADMIN, False):
        raise ApiError(403, "this endpoint needs an API key with the admin role", "permission_error")
    return str(request.get(TENANT, ""))


async def _lookup(request: web.Request) -> SessionRecord:
    """A session named by its hash or by the key the client used (e.g. its X-Session-Id)."""
    tenant = _require_admin(request)
    name = request.match_info["session_id"]
    registry = request.app[APP_STATE].registry
    candidates = [session_hash(tenant, name)] + ([name] if _HASH.match(name) else [])
    for session_id in candidates:
        record = await registry.find(session_id, tenant)
        if record is not None:
            return record
    raise ApiError(404, "no such session", "not_found_error")


def _sessions(registry: SessionRegistry, tenant: str) -> list[tuple[SessionInfo, list[SessionInfo]]]:
    """Each session (its root record) with its branches, the main conversation first. A branch
    whose session record is gone is listed as a session of its own."""
    infos = registry.list(tenant)
    ids = {i.session_id for i in infos}
    branches: dict[str, list[SessionInfo]] = {}
    for info in infos:
        if info.parent in ids:
            branches.setdefault(info.parent, []).append(info)
    return [(root, [root, *branches.get(root.session_id, [])]) for root in infos if root.parent not in ids]


async def list_sessions(request: web.Request) -> web.Response:
    tenant = _require_admin(request)
    registry = request.app[APP_STATE].registry
    data = [{**_public(root, registry.loaded(root.session_id)),
             "branches": [_public(b, registry.loaded(b.session_id)) for b in branches]}
            for root, branches in _sessions(registry, tenant)]
    return web.json_response({"object": "list", "data": data})


async def get_session(request: web.Request) -> web.Response:
    record = await _lookup(request)
    registry = request.app[APP_STATE].registry
    listed = _sessions(registry, record.tenant)
    info = next((root for root, _ in listed if root.session_id == record.session_id), None)
    branches = next((b for root, b in listed if root.session_id == record.session_id), [])
    body = _public(info, record) if info else {"id": record.session_id, "session_id": record.session_id}
    body["branches"] = [_public(b, registry.loaded(b.session_id)) for b in branches]
    body.update(
        messages=len(record.served_hashes),
        compressed_messages=len(record.kept_maps),
        recalls=len(record.recall_log),
        counters=dict(record.counters),
        key_source=record.key_source,
        turn_log=turns_view(record),
        compressed=compressed_view(record),
    )
    return web.json_response(body)


async def delete_session(request: web.Request) -> web.Response:
    """A session and every conversation in it (or one branch, named by its own id)."""
    record = await _lookup(request)
    state = request.app[APP_STATE]
    registry = state.registry
    branches = {b.session_id for root, bs in _sessions(registry, record.tenant) if root.session_id == record.session_id
                for b in bs} | {e.branch_id for e in record.branch_entries()}
    forget = session_forgetter(state.engine, registry, state.checkpoints)
    for session_id in [*(branches - {record.session_id}), record.session_id]:
        await forget(session_id)
    root = await registry.find(record.parent, record.tenant) if record.parent else None
    if root is not None:  # one branch: its session no longer lists it
        root.drop_branch(record.session_id)
        await registry.save_record(root)
    return web.json_response({"id": record.session_id, "deleted": True})


def _served_kind(role: str, served: str) -> str:
    """Tells a tool output sent as a user message (mini-swe-agent, Aider...) from the user's words,
    by its wrapper, which a compressed message shows after the gateway's note."""
    body = served.split("\n", 1)[-1] if note_total_lines(served) is not None else served
    return message_kind(Message(role, body))  # type: ignore[arg-type]


async def transcript(request: web.Request) -> web.Response:
    record = await _lookup(request)
    messages = [{**m, "kind": _served_kind(m["role"], m["content"])} for m in record.transcript]
    return web.json_response({"session_id": record.session_id, "messages": messages})


async def overview(request: web.Request) -> web.Response:
    """The status page's header: the same numbers /metrics reads (engine, registry, turn service)."""
    _require_admin(request)
    state = request.app[APP_STATE]
    return web.json_response(await asyncio.to_thread(_overview, state))


def _overview(state: AppState) -> dict[str, Any]:
    stats = snapshot(state)
    engine, sessions, turns = stats.engine, stats.sessions, stats.turns
    reused, evaluated = stats.prefill_tokens("reused"), stats.prefill_tokens("evaluated")
    return {
        "engine": state.settings.engine,
        "model": state.engine.model_id,
        "n_ctx": state.engine.n_ctx,
        "scorer": scorer_name(state),
        "queue_depth": int(engine.get("queue_depth", 0)),
        "tiers": {
            "context": {"sessions": int(sessions.get("sessions_context", 0))},
            "ram": {"sessions": int(sessions.get("sessions_ram", 0)), "used_bytes": int(sessions.get("ram_bytes", 0)),
                    "budget_bytes": state.settings.ram_budget_mb * _MIB},
            "disk": {"sessions": int(sessions.get("sessions_disk", 0)), "used_bytes": int(sessions.get("disk_bytes", 0)),
                     "budget_bytes": state.settings.disk_budget_mb * _MIB},
        },
        "totals": {
            "prompt_tokens": int(reused + evaluated),
            "reused_tokens": int(reused),
            "evaluated_tokens": int(evaluated),
            "completion_tokens": int(engine.get("completion_tokens", 0)),
            "saved_by_compression": int(turns.get("compression_tokens_in", 0) - turns.get("compression_tokens_out", 0)),
            "compressions": int(turns.get("compressions", 0)),
            "recalls": int(turns.get("recalls", 0)),
            "resumes_from_ram": int(engine.get("restores_ram", 0)),
            "resumes_from_disk": int(engine.get("restores_disk", 0)),
            "checkpoint_hits": int(engine.get("checkpoint_hits", 0)),
            "checkpoint_tokens_reused": int(engine.get("checkpoint_tokens_reused", 0)),
        },
        "checkpoints": _checkpoints(state),
    }


def _checkpoints(state: AppState) -> dict[str, Any] | None:
    """Prefix checkpoints (tokens, hits, tier), newest first; None where the engine keeps none."""
    store = state.checkpoints
    if store is None:
        return None
    s = store.stats()
    return {"ram": {"count": int(s["checkpoints_ram"]), "used_bytes": int(s["checkpoint_ram_bytes"]),
                    "budget_bytes": state.settings.checkpoint_ram_mb * _MIB},
            "disk": {"count": int(s["checkpoints_disk"]), "used_bytes": int(s["checkpoint_disk_bytes"]),
                     "budget_bytes": state.settings.checkpoint_disk_mb * _MIB},
            "list": store.listing()[:50]}


def _public(info: SessionInfo, record: SessionRecord | None) -> dict[str, Any]:
    """A listing row: never the tenant; the client's own session name and turns when in memory."""
    row: dict[str, Any] = asdict(info)
    row.pop("tenant", None)
    row["id"] = info.session_id
    if record is not None:
        row["client_key"] = record.client_key or None
        row["turns"] = record.counters.get("turns", 0)
    return row


def add_routes(app: web.Application) -> None:
    app.router.add_get("/v1/overview", overview)
    app.router.add_get("/v1/sessions", list_sessions)
    app.router.add_get("/v1/sessions/{session_id}", get_session)
    app.router.add_delete("/v1/sessions/{session_id}", delete_session)
    app.router.add_get("/v1/sessions/{session_id}/transcript", transcript)
