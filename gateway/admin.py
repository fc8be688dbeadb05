"""Session admin endpoints, always scoped to the caller's tenant."""

from __future__ import annotations

import re
from dataclasses import asdict

from aiohttp import web

from gateway.errors import ApiError
from gateway.state import APP_STATE, IS_ADMIN, TENANT
from sessions.identity import session_hash
from sessions.record import SessionRecord

_HASH = re.compile(r"^[0-9a-f]{64}$")


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


async def list_sessions(request: web.Request) -> web.Response:
    tenant = _require_admin(request)
    infos = request.app[APP_STATE].registry.list(tenant)
    return web.json_response({"object": "list", "data": [_public(asdict(i)) for i in infos]})


async def get_session(request: web.Request) -> web.Response:
    record = await _lookup(request)
    registry = request.app[APP_STATE].registry
    info = next((i for i in registry.list(record.tenant) if i.session_id == record.session_id), None)
    body = _public(asdict(info)) if info else {"session_id": record.session_id}
    body.update(
        messages=len(record.served_hashes),
        compressed_messages=len(record.kept_maps),
        recalls=len(record.recall_log),
        counters=dict(record.counters),
        key_source=record.key_source,
    )
    return web.json_response(body)


async def delete_session(request: web.Request) -> web.Response:
    record = await _lookup(request)
    await request.app[APP_STATE].registry.delete(record.session_id)
    return web.json_response({"id": record.session_id, "deleted": True})


async def transcript(request: web.Request) -> web.Response:
    record = await _lookup(request)
    return web.json_response({"session_id": record.session_id, "messages": list(record.transcript)})


def _public(info: dict[str, object]) -> dict[str, object]:
    info = dict(info)
    info.pop("tenant", None)
    info["id"] = info["session_id"]
    return info


def add_routes(app: web.Application) -> None:
    app.router.add_get("/v1/sessions", list_sessions)
    app.router.add_get("/v1/sessions/{session_id}", get_session)
    app.router.add_delete("/v1/sessions/{session_id}", delete_session)
    app.router.add_get("/v1/sessions/{session_id}/transcript", transcript)
