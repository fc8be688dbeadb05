"""The aiohttp application: routes, error and auth middlewares, and resource lifetime."""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import replace
from typing import Any

from aiohttp import web

from engine.base import Engine
from gateway import admin, ui
from gateway.api import chat as chat_api
from gateway.api import chat_output, messages_output, responses_output
from gateway.api import messages as messages_api
from gateway.api import responses as responses_api
from gateway.api_handler import (
    ApiAdapter,
    check_limits,
    handle_turn,
    lower_headers,
    parse_conversation,
    read_json,
)
from gateway.background_embedding import BackgroundEmbedder
from gateway.compressor import CompressionSettings
from gateway.config import Settings
from gateway.errors import ApiError, ApiFlavor, error_body, http_status
from gateway.forget import session_forgetter
from gateway.limits import ConcurrencyLimiter
from gateway.metrics import install as install_metrics
from gateway.response_history import ResponseHistory
from gateway.scorer_factory import build_scorer
from gateway.state import APP_STATE, IS_ADMIN, TENANT, AppState
from gateway.turns import TurnService
from policies.conversation_types import Message
from sessions.checkpoints import CheckpointStore
from sessions.files import StoreLock
from sessions.registry import SessionRegistry
from sessions.store import SessionStore

log = logging.getLogger("pflash.app")

EngineFactory = Callable[[Settings], Engine]

OPENAI_CHAT = ApiAdapter(
    "openai", "chatcmpl-", chat_api.parse_request, chat_output.complete_response, chat_output.StreamEncoder
)
ANTHROPIC = ApiAdapter(
    "anthropic", "msg_", messages_api.parse_request, messages_output.complete_response, messages_output.StreamEncoder
)
RESPONSES = ApiAdapter(
    "responses", "resp_", responses_api.parse_request, responses_output.complete_response, responses_output.StreamEncoder
)

# count_tokens: the same wire format, `max_tokens` not required.
ANTHROPIC_COUNT = replace(ANTHROPIC, parse_request=messages_api.parse_count_tokens_request)

_OPEN_PATHS = {"/health", "/metrics", "/api/hello"}

# Recent Responses per tenant, for previous_response_id (in memory only).
RESPONSE_HISTORY: web.AppKey[ResponseHistory] = web.AppKey("pflash_response_history", ResponseHistory)


def flavor_for(path: str) -> ApiFlavor:
    if path.startswith("/v1/messages"):
        return "anthropic"
    if path.startswith("/v1/responses"):
        return "responses"
    return "openai"


def error_response(err: ApiError, flavor: ApiFlavor) -> web.Response:
    headers = {"Retry-After": str(err.retry_after)} if err.retry_after is not None else None
    return web.json_response(error_body(err, flavor), status=http_status(err, flavor), headers=headers)


@web.middleware
async def error_middleware(request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]) -> web.StreamResponse:
    flavor = flavor_for(request.path)
    try:
        return await handler(request)
    except ApiError as err:
        log.info("%s %s -> %d %s", request.method, request.path, err.status, err.message)
        return error_response(err, flavor)
    except web.HTTPException as exc:
        if exc.status < 400:
            raise
        kind = "not_found_error" if exc.status == 404 else "invalid_request_error"
        return error_response(ApiError(exc.status, exc.reason or "error", kind), flavor)  # type: ignore[arg-type]
    except asyncio.CancelledError:
        raise
    except ConnectionResetError:
        # The client left (mid-body or mid-stream): no one to answer and no server error to log.
        # aiohttp's write of this placeholder fails quietly on the closed transport.
        log.info("%s %s: client went away", request.method, request.path)
        return web.Response(status=499)
    except Exception as exc:
        log.exception("unhandled error on %s", request.path)
        return error_response(ApiError(500, f"internal error: {type(exc).__name__}", "api_error"), flavor)


def tenant_of(key: str) -> str:
    return hashlib.sha256(b"pflash-tenant\x00" + key.encode()).hexdigest()[:32]


def request_key(request: web.Request) -> str | None:
    auth = request.headers.get("Authorization", "")
    if auth.lower().startswith("bearer "):
        return auth[7:].strip()
    return request.headers.get("x-api-key") or request.headers.get("api-key")


def auth_middleware(settings: Settings) -> Any:
    keys = settings.all_keys
    admins = set(settings.admin_keys)

    @web.middleware
    async def middleware(request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]) -> web.StreamResponse:
        if not keys:
            request[TENANT] = ""
            request[IS_ADMIN] = True
            return await handler(request)
        if request.path in _OPEN_PATHS or ui.is_ui_path(request.path):  # the page's shell holds no data
            return await handler(request)
        given = request_key(request)
        match = next((k for k in keys if given is not None and hmac.compare_digest(k.encode(), given.encode())), None)
        if match is None:
            raise ApiError(401, "invalid or missing API key", "authentication_error")
        request[TENANT] = tenant_of(match)
        request[IS_ADMIN] = match in admins
        return await handler(request)

    return middleware


def turn_route(adapter: ApiAdapter) -> Callable[[web.Request], Awaitable[web.StreamResponse]]:
    async def handler(request: web.Request) -> web.StreamResponse:
        return await handle_turn(request, adapter)

    return handler


async def count_tokens(request: web.Request) -> web.Response:
    """Anthropic count_tokens: the prompt as the model would read it; no session state changes."""
    state = request.app[APP_STATE]
    conv = await parse_conversation(request, ANTHROPIC_COUNT)
    tenant = request.get(TENANT, "")
    async with state.limiter.slot(tenant):  # counting tokenizes the whole prompt: it counts as a request
        # An over-long prompt is still counted: the client asks precisely to learn whether it fits.
        return web.json_response({"input_tokens": await state.turns.count(conv, tenant)})


async def responses(request: web.Request) -> web.StreamResponse:
    """OpenAI Responses: `previous_response_id` continues a stored response; `store: false` is not kept."""
    body = await read_json(request)
    conv = RESPONSES.parse_request(body, lower_headers(request))
    assert isinstance(body, dict)  # parse_request refuses anything else
    tenant = request.get(TENANT, "")
    history = request.app[RESPONSE_HISTORY]
    # `instructions` (parsed as the first message) are not carried over to a continuation.
    n_instructions = 1 if body.get("instructions") else 0
    head, items = conv.messages[:n_instructions], conv.messages[n_instructions:]
    previous = responses_api.previous_response_id(body)
    if previous is not None:
        stored = history.get(tenant, previous)
        if stored is None:
            raise ApiError(400, f"Previous response with id '{previous}' not found.",
                           code="previous_response_not_found", param="previous_response_id")
        items = (*stored, *_name_outputs(items, stored))
        conv = replace(conv, messages=(*head, *items))
    check_limits(request, conv)

    def remember(response_id: str, reply: Message) -> None:
        history.put(tenant, response_id, (*items, reply))

    return await handle_turn(request, RESPONSES, conv, None if body.get("store") is False else remember)


def _name_outputs(items: tuple[Message, ...], stored: tuple[Message, ...]) -> tuple[Message, ...]:
    """Name tool outputs that answer a call made in the stored history (templates show the name)."""
    names = {call.id: call.name for m in stored for call in m.tool_calls}
    return tuple(replace(m, name=names.get(m.tool_call_id or "")) if m.role == "tool" and m.name is None else m
                 for m in items)


async def health(request: web.Request) -> web.Response:
    state = request.app.get(APP_STATE)
    if state is None or not state.ready:
        return web.json_response({"status": "loading"}, status=503)
    healthy = getattr(state.engine, "healthy", None)
    if healthy is not None and not healthy():
        return web.json_response({"status": "engine scheduler stopped"}, status=503)
    return web.json_response({"status": "ok", "model": state.settings.model_name})


async def hello(request: web.Request) -> web.Response:
    """Claude Code's reachability probe (`HEAD /api/hello`, before its first request)."""
    return web.json_response({"status": "ok"})


async def models(request: web.Request) -> web.Response:
    state = request.app[APP_STATE]
    entry = {"id": state.settings.model_name, "object": "model", "created": 0, "owned_by": "pflash-gateway",
             # The context size, as vLLM names it, so clients can set their compaction window from it.
             "max_model_len": state.engine.n_ctx}
    return web.json_response({"object": "list", "data": [entry]})


def open_sessions(settings: Settings, fingerprint: str) -> SessionRegistry:
    """The store (held shared: `sessions rm|gc` refuse while we run) and the registry over it."""
    lock = StoreLock(settings.store_dir)
    lock.hold_shared()
    store = SessionStore(settings.store_dir, fingerprint, settings.zstd_level, settings.disk_budget_mb * 1024 * 1024)
    return SessionRegistry(store, settings.ram_budget_mb * 1024 * 1024, settings.record_sync, lock)


def open_checkpoints(settings: Settings, fingerprint: str) -> CheckpointStore:
    return CheckpointStore(settings.store_dir, fingerprint, settings.checkpoint_ram_mb * 1024 * 1024,
                           settings.checkpoint_disk_mb * 1024 * 1024, settings.zstd_level)


def create_app(settings: Settings, engine_factory: EngineFactory) -> web.Application:
    app = web.Application(
        client_max_size=int(settings.max_body_mb * 1024 * 1024),
        middlewares=[error_middleware, auth_middleware(settings)],
    )
    install_metrics(app)  # GET /metrics (open: no session data) and the request metrics middleware

    async def lifetime(app: web.Application) -> AsyncIterator[None]:
        engine = await asyncio.to_thread(engine_factory, settings)
        registry = await asyncio.to_thread(open_sessions, settings, engine.fingerprint)
        attach = getattr(engine, "attach_tier", None)
        if attach is not None:
            attach(registry)
        checkpoints = None
        if (attach_checkpoints := getattr(engine, "attach_checkpoints", None)) is not None:
            checkpoints = await asyncio.to_thread(open_checkpoints, settings, engine.fingerprint)
            attach_checkpoints(checkpoints)
        compression = CompressionSettings(settings.threshold, settings.budget_curve, settings.min_segment,
                                          settings.max_segment, settings.request_tokens, settings.fallback_spread,
                                          settings.recall_theta, settings.recall_budget,
                                          settings.recall_context)
        choice = build_scorer(settings)
        encoder = choice.scorers.encoder
        if encoder is not None:  # every core for the encoder while no turn needs them
            encoder.engine_idle = engine.idle
            log.info("sentence encoder: %d thread(s) while a turn runs, %d while the engine is idle",
                     encoder.busy_threads, encoder.idle_threads)
        dense = choice.scorers.background
        background = BackgroundEmbedder(dense, registry, engine.idle) if dense is not None else None
        turns = TurnService(engine, registry, choice.scorers, compression, background,
                            session_forgetter(engine, registry, checkpoints))
        if choice.fallback is not None:  # /metrics: the configured scorer did not load
            turns.counters["scorer_fallbacks"] = 1
        if choice.gate_fallback is not None:  # /metrics: the recall gate's encoder did not load
            turns.counters["gate_embedder_fallbacks"] = 1
        state = AppState(settings, engine, registry, turns, ConcurrencyLimiter(settings.per_key_concurrency),
                         checkpoints)
        app[APP_STATE] = state
        await engine.start()
        if background is not None:
            background.start()
        state.ready = True
        log.info("ready: model %s, n_ctx %d, store %s (%d sessions on disk), records written ahead: %s",
                 engine.model_id, engine.n_ctx, registry.store.dir, len(registry.list(None)), settings.record_sync)
        yield
        state.ready = False
        if background is not None:
            await background.stop()  # a message not embedded by now keeps BM25 at the gate
        await turns.branches.settle()  # dropped branches: forgotten whole, not half
        try:
            await engine.close()  # the live session's KV goes to the RAM tier ...
        except Exception:  # whatever failed there, what the tiers hold still goes to disk
            log.exception("engine shutdown failed; flushing the sessions anyway")
        finally:
            await asyncio.to_thread(registry.flush)  # ... and everything changed to disk
            await asyncio.to_thread(registry.close)
            log.info("sessions flushed to %s", registry.store.dir)
            if checkpoints is not None:
                await asyncio.to_thread(checkpoints.flush)
                await asyncio.to_thread(checkpoints.close)

    async def stop_turns(app: web.Application) -> None:
        """SIGTERM: the listening socket is closed already; turns still running get a short grace
        period, then are cancelled, so the flush runs well inside systemd's TimeoutStopSec."""
        state = app.get(APP_STATE)
        cancel_all = getattr(state.engine, "cancel_all", None) if state is not None else None
        if cancel_all is None:
            return

        async def cancel_later() -> None:
            await asyncio.sleep(settings.shutdown_grace_seconds)
            if cancelled := cancel_all():
                log.info("shutdown: %d turns still running after %.1f s cancelled", cancelled,
                         settings.shutdown_grace_seconds)

        shutdown_tasks.add(asyncio.create_task(cancel_later()))  # a reference keeps it alive

    shutdown_tasks: set[asyncio.Task[None]] = set()
    app.on_shutdown.append(stop_turns)
    app.cleanup_ctx.append(lifetime)
    app[RESPONSE_HISTORY] = ResponseHistory()
    app.router.add_get("/health", health)
    app.router.add_get("/api/hello", hello)  # also answers HEAD
    app.router.add_get("/v1/models", models)
    app.router.add_post("/v1/chat/completions", turn_route(OPENAI_CHAT))
    app.router.add_post("/v1/messages", turn_route(ANTHROPIC))
    app.router.add_post("/v1/messages/count_tokens", count_tokens)
    app.router.add_post("/v1/responses", responses)
    admin.add_routes(app)
    ui.add_routes(app)
    return app
