"""The HTTP shell shared by the three client APIs: read the body, run the turn, answer in the
client's own format (JSON or SSE), with keep-alives during long prefills and cancellation when the
client goes away."""

from __future__ import annotations

import asyncio
import json
import logging
import re
import secrets
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from dataclasses import dataclass, replace
from typing import Any, Protocol

from aiohttp import web

from engine.base import EngineBusy, EngineEvent, EngineRejected, EngineUnavailable, PrefillDone
from gateway.api.wire import SSE_COMMENT_KEEPALIVE
from gateway.errors import ApiError, ApiFlavor, ErrorKind, overloaded
from gateway.metrics import note_first_output
from gateway.state import APP_STATE, TENANT
from gateway.turns import Turn
from policies.conversation_types import (
    Conversation,
    Finished,
    Message,
    ReasoningDelta,
    TextDelta,
    ToolCall,
    ToolCallDelta,
    TurnEvent,
)

log = logging.getLogger("pflash.http")


class StreamEncoderLike(Protocol):
    def begin(self, prompt_tokens: int, cached_tokens: int) -> bytes: ...
    def keepalive(self) -> bytes: ...
    def feed(self, event: TurnEvent) -> bytes: ...
    def error(self, err: ApiError) -> bytes: ...


@dataclass(frozen=True)
class ApiAdapter:
    flavor: ApiFlavor
    id_prefix: str
    parse_request: Callable[[object, Mapping[str, str]], Conversation]
    complete_response: Callable[..., dict[str, Any]]
    stream_encoder: Callable[[Conversation, str, int], StreamEncoderLike]


SSE_HEADERS = {"Content-Type": "text/event-stream", "Cache-Control": "no-cache", "X-Accel-Buffering": "no"}


async def read_json(request: web.Request) -> object:
    """The request body as JSON, or an ApiError a client can act on (413, 400)."""
    try:
        raw = await request.read()
    except web.HTTPRequestEntityTooLarge:
        raise ApiError(413, f"request body too large (limit {request.client_max_size} bytes)", "request_too_large") from None
    try:
        body = json.loads(raw.decode("utf-8"), parse_constant=_not_json)
    except UnicodeDecodeError:
        raise ApiError(400, "request body is not valid UTF-8") from None
    except RecursionError:
        raise ApiError(400, "request body is nested too deeply") from None
    except ValueError as exc:
        raise ApiError(400, f"request body is not valid JSON: {exc}") from None
    if _SURROGATE_ESCAPE.search(raw) and _has_lone_surrogate(body):
        # "\ud800" parses, but no UTF-8 text holds it: it would fail deep in tokenizing (a 500).
        raise ApiError(400, "request body is not valid JSON: a \\u escape is an unpaired UTF-16 surrogate")
    return body


_SURROGATE_ESCAPE = re.compile(rb"\\u[dD][89a-fA-F]")


def _not_json(constant: str) -> None:
    raise ValueError(f"{constant} is not a JSON value")  # Python's parser accepts NaN and Infinity


def _has_lone_surrogate(value: object) -> bool:
    stack: list[object] = [value]  # iterative: the body may be nested as deep as the parser allowed
    while stack:
        item = stack.pop()
        if isinstance(item, str):
            try:
                item.encode("utf-8")
            except UnicodeEncodeError:
                return True
        elif isinstance(item, dict):
            stack.extend(item.keys())
            stack.extend(item.values())
        elif isinstance(item, list):
            stack.extend(item)
    return False


def lower_headers(request: web.Request) -> dict[str, str]:
    return {k.lower(): v for k, v in request.headers.items()}


async def parse_conversation(request: web.Request, adapter: ApiAdapter) -> Conversation:
    body = await read_json(request)
    conv = adapter.parse_request(body, lower_headers(request))
    check_limits(request, conv)
    return conv


def check_limits(request: web.Request, conv: Conversation) -> None:
    limits = request.app[APP_STATE].settings
    if len(conv.messages) > limits.max_messages:
        raise ApiError(400, f"too many messages: {len(conv.messages)} > {limits.max_messages}", param="messages")


# Called once a turn finished normally: (response id, the assistant reply as a neutral message).
ReplyHook = Callable[[str, Message], None]


async def handle_turn(
    request: web.Request, adapter: ApiAdapter, conv: Conversation | None = None, on_reply: ReplyHook | None = None
) -> web.StreamResponse:
    state = request.app[APP_STATE]
    if conv is None:
        conv = await parse_conversation(request, adapter)
    limit = state.settings.max_tokens_limit
    asked = conv.params.max_tokens or state.settings.default_max_tokens  # not "until the context is full"
    if asked != conv.params.max_tokens or (limit is not None and asked > limit):
        conv = replace(conv, params=replace(conv.params, max_tokens=min(asked, limit or asked)))
    tenant = request.get(TENANT, "")
    async with state.limiter.slot(tenant):
        waiting = WaitingStream(request, state.settings.keepalive_seconds if conv.stream else None)
        try:
            turn = await waiting.prepare(state.turns.prepare(conv, tenant))
        except ApiError as err:
            if waiting.response is not None or (conv.stream and adapter.flavor == "responses"
                                                and err.code == "context_length_exceeded"):
                # The stream has started (its status is sent), or Codex reads overflow from a
                # `response.failed` event (and then compacts): the error goes as the API's event.
                return await _failed_stream(request, adapter, conv, err, waiting.response)
            raise
        try:
            try:
                events = state.turns.stream(turn)
            except EngineBusy as exc:
                raise overloaded("the engine is busy; retry shortly", exc.retry_after) from None
            response_id = f"{adapter.id_prefix}{secrets.token_hex(12)}"
            created = int(time.time())
            if on_reply is not None:
                events = _tap_reply(events, lambda reply: on_reply(response_id, reply))
            if conv.stream:
                return await _stream(request, adapter, turn, events, response_id, created, waiting.response)
            return await _complete(request, adapter, turn, events, response_id, created)
        finally:
            state.turns.finish(turn)  # the next turn of this conversation may start


async def _complete(
    request: web.Request, adapter: ApiAdapter, turn: Turn, events: AsyncIterator[EngineEvent], response_id: str,
    created: int,
) -> web.Response:
    text: list[str] = []
    reasoning: list[str] = []
    calls: list[ToolCall] = []
    finished: Finished | None = None
    try:
        async for event in _until_client_leaves(request, events):
            if not isinstance(event, PrefillDone):
                note_first_output(request)  # time to first token (or to the end of an empty answer)
            if isinstance(event, TextDelta):
                text.append(event.text)
            elif isinstance(event, ReasoningDelta):
                reasoning.append(event.text)
            elif isinstance(event, ToolCallDelta):
                calls.append(event.call)
            elif isinstance(event, Finished):
                finished = event
    except ConnectionResetError:
        raise  # our client left: nothing to answer (the middleware logs it)
    except (EngineUnavailable, EngineRejected, OSError) as exc:
        raise engine_error(exc) from None
    finally:
        await _close(events)
    assert finished is not None, "engine ended a turn without Finished"
    log_turn(turn, finished, adapter.flavor)
    body = adapter.complete_response(
        turn.conversation, response_id, created, "".join(text), calls, finished, reasoning="".join(reasoning)
    )
    return web.json_response(body, headers=turn.headers())


async def _stream(
    request: web.Request,
    adapter: ApiAdapter,
    turn: Turn,
    events: AsyncIterator[EngineEvent],
    response_id: str,
    created: int,
    started: web.StreamResponse | None = None,
) -> web.StreamResponse:
    state = request.app[APP_STATE]
    encoder = adapter.stream_encoder(turn.conversation, response_id, created)
    response = started or web.StreamResponse(headers={**SSE_HEADERS, **turn.headers()})
    iterator = events.__aiter__()
    pending: asyncio.Future[EngineEvent] | None = asyncio.ensure_future(iterator.__anext__())
    # An engine that fails at once (an upstream that is down) still gets a real HTTP status,
    # unless the stream started while the turn waited (its failure is then the API's event).
    await asyncio.wait({pending}, timeout=state.settings.keepalive_seconds)
    if started is None and pending.done() and isinstance(pending.exception(), (EngineUnavailable, EngineRejected)):
        failure = engine_error(pending.exception())  # type: ignore[arg-type]
        await _close(events)
        if adapter.flavor == "responses" and failure.code == "context_length_exceeded":
            return await _failed_stream(request, adapter, turn.conversation, failure)  # Codex compacts on it
        raise failure from None
    try:
        if not response.prepared:
            await response.prepare(request)
        await response.write(encoder.begin(turn.prompt.n_tokens, 0))
        while True:
            if pending is None:
                pending = asyncio.ensure_future(iterator.__anext__())
            done, _ = await asyncio.wait({pending}, timeout=state.settings.keepalive_seconds)
            if not done:
                await response.write(encoder.keepalive())  # also how we notice a client that left
                continue
            try:
                event = pending.result()
            except StopAsyncIteration:
                break
            finally:
                pending = None
            if isinstance(event, PrefillDone):
                continue
            await response.write(encoder.feed(event))
            note_first_output(request)  # time to first token (or to the end of an empty answer)
            if isinstance(event, Finished):
                log_turn(turn, event, adapter.flavor)
        await response.write_eof()
    except (ConnectionResetError, asyncio.CancelledError, ConnectionError):
        log.info("client went away mid-stream; generation cancelled")
        raise
    except ApiError as err:
        await _write_quietly(response, encoder.error(err))
    except (EngineUnavailable, EngineRejected) as exc:
        await _write_quietly(response, encoder.error(engine_error(exc)))
    except Exception as exc:
        log.exception("stream failed")
        await _write_quietly(response, encoder.error(ApiError(500, f"internal error: {exc}", "api_error")))
    finally:
        if pending is not None:
            pending.cancel()
        await _close(events)
    return response


# How often a non-streaming turn checks that its client is still connected while no event comes.
DISCONNECT_POLL_SECONDS = 0.5


class WaitingStream:
    """A turn being prepared (its conversation's branch busy with another turn, a long new output
    being compressed) while its client waits. A client that leaves cancels the wait, so its turn
    never runs; a stream still waiting after `keepalive` seconds starts (200, SSE headers, no
    X-PFlash headers yet) and gets a comment line every `keepalive` seconds, which every SSE reader
    skips, so the client's idle timeout does not fire before the first event."""

    def __init__(self, request: web.Request, keepalive: float | None) -> None:
        self._request = request
        self._keepalive = keepalive  # None: not streaming (nothing can be sent before the answer)
        self.response: web.StreamResponse | None = None  # the stream, once started

    async def prepare(self, preparing: Awaitable[Turn]) -> Turn:
        task = asyncio.ensure_future(preparing)
        quiet = 0.0
        try:
            while True:
                done, _ = await asyncio.wait({task}, timeout=DISCONNECT_POLL_SECONDS)
                if done:
                    return task.result()
                if client_gone(self._request):
                    log.info("client went away while its turn waited; the turn is dropped")
                    raise ConnectionResetError("client disconnected")
                quiet += DISCONNECT_POLL_SECONDS
                if self._keepalive is not None and quiet >= self._keepalive:
                    quiet = 0.0
                    if self.response is None:
                        self.response = web.StreamResponse(headers=SSE_HEADERS)
                        await self.response.prepare(self._request)
                    await self.response.write(SSE_COMMENT_KEEPALIVE)
        finally:
            if not task.done():
                task.cancel()  # the turn lets its branch go (TurnService.prepare)
                await asyncio.wait({task})


def client_gone(request: web.Request) -> bool:
    transport = request.transport
    return transport is None or transport.is_closing()


async def _until_client_leaves(request: web.Request, events: AsyncIterator[EngineEvent]) -> AsyncIterator[EngineEvent]:
    """The events, with the connection checked at every event and every DISCONNECT_POLL_SECONDS
    between events: aiohttp does not cancel a handler whose client left (its handler_cancellation,
    off here, would cancel at any await, a record's write-ahead included), and a non-streaming
    turn writes nothing that would notice. Checked only while waiting for an event,
    a client that left while tokens came faster than the poll went unnoticed until max_tokens.
    A client that left ends the turn (ConnectionResetError) once the engine was told to stop."""
    iterator = events.__aiter__()
    while True:
        pending = asyncio.ensure_future(iterator.__anext__())
        while not pending.done() and not client_gone(request):
            await asyncio.wait({pending}, timeout=DISCONNECT_POLL_SECONDS)
        if client_gone(request):
            await _discard(pending)
            await _close(events)  # the turn's cleanup has run: the engine stops at its next token
            log.info("client went away before the answer; generation cancelled")
            raise ConnectionResetError("client disconnected")
        try:
            yield pending.result()
        except StopAsyncIteration:
            return


async def _discard(pending: asyncio.Future[EngineEvent]) -> None:
    """Cancel a pending event and wait until the iterator behind it has unwound."""
    pending.cancel()
    await asyncio.wait({pending})
    if not pending.cancelled():
        pending.exception()  # retrieved: a finished turn's result or error is not wanted any more


def engine_error(exc: BaseException) -> ApiError:
    """An engine failure as the client should see it: an upstream's refusal keeps its status
    (a context overflow stays a 400), an unreachable engine is a 503 with Retry-After."""
    if isinstance(exc, EngineRejected):
        kinds: dict[int, ErrorKind] = {400: "invalid_request_error", 429: "rate_limit_error"}
        status = exc.status if exc.status in (400, 429) else 502
        return ApiError(status, exc.message, kinds.get(status, "api_error"), code=exc.code,
                        retry_after=1 if status == 429 else None)
    return overloaded(f"engine unavailable: {exc}", 5)


async def _tap_reply(events: AsyncIterator[EngineEvent], done: Callable[[Message], None]) -> AsyncIterator[EngineEvent]:
    """Pass events through; on Finished, hand the assembled reply to `done` (before the client sees it)."""
    text: list[str] = []
    calls: dict[int, ToolCall] = {}  # by delta index: fragments of one call are joined
    try:
        async for event in events:
            if isinstance(event, TextDelta):
                text.append(event.text)
            elif isinstance(event, ToolCallDelta):
                prior = calls.get(event.index)
                calls[event.index] = event.call if prior is None else ToolCall(
                    prior.id, prior.name, prior.arguments + event.call.arguments)
            elif isinstance(event, Finished):
                done(Message("assistant", "".join(text), tuple(calls[i] for i in sorted(calls))))
            yield event
    finally:
        await _close(events)  # closing this wrapper must still end the engine turn


async def _failed_stream(request: web.Request, adapter: ApiAdapter, conv: Conversation, err: ApiError,
                         started: web.StreamResponse | None = None) -> web.StreamResponse:
    encoder = adapter.stream_encoder(conv, f"{adapter.id_prefix}{secrets.token_hex(12)}", int(time.time()))
    response = started or web.StreamResponse(headers=SSE_HEADERS)
    if not response.prepared:
        await response.prepare(request)
    await response.write(encoder.begin(0, 0))
    await _write_quietly(response, encoder.error(err))
    return response


async def _write_quietly(response: web.StreamResponse, data: bytes) -> None:
    try:
        await response.write(data)
        await response.write_eof()
    except (ConnectionError, RuntimeError):
        pass


async def _close(events: AsyncIterator[EngineEvent]) -> None:
    aclose = getattr(events, "aclose", None)
    if aclose is not None:
        try:
            await aclose()
        except (RuntimeError, StopAsyncIteration):
            pass


def log_turn(turn: Turn, finished: Finished, api: str) -> None:
    usage = finished.usage
    fields: dict[str, Any] = {
        "event": "turn",
        "api": api,
        "session": turn.identity.session_id[:16],
        "session_source": turn.identity.source,
        "branch": turn.branch.label,
        "tokens_in": usage.prompt_tokens,
        "tokens_reused": usage.cached_tokens,
        "tokens_evaluated": usage.prompt_tokens - usage.cached_tokens,
        "tokens_out": usage.completion_tokens,
        "finish": finished.finish_reason,
        "seconds": round(time.perf_counter() - turn.started, 3),
    }
    if turn.compression is not None:
        c = turn.compression
        fields.update(compressed=c.compressed, compression_reason=c.reason, scorer=c.scorer,
                      original_tokens=c.original_tokens, kept_tokens=c.kept_tokens,
                      scorer_seconds=round(c.scorer_seconds, 3))
    recall = getattr(turn, "recall", None)
    if recall is not None:
        fields.update(recall_fired=recall.fired, recall_reason=recall.reason,
                      recall_added_tokens=recall.added_tokens, recall_seconds=round(recall.seconds, 3))
    log.info("turn", extra={"fields": fields})
    if log.isEnabledFor(logging.DEBUG):  # prompt text only when debug logging was asked for
        last = turn.prompt.messages[-1].content if turn.prompt.messages else ""
        log.debug("turn prompt", extra={"fields": {"session": fields["session"], "prompt_tail": last[-2000:]}})

