"""Anthropic Messages output: engine events -> the Message body or its `event: NAME` SSE stream."""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from functools import partial
from typing import Any

from gateway.api.wire import (
    arguments_object,
    sse_event,
    validate,
    with_prefix,
)
from gateway.errors import ApiError, error_body
from policies.conversation_types import (
    Conversation,
    Finished,
    ReasoningDelta,
    TextDelta,
    ToolCall,
    ToolCallDelta,
    TurnEvent,
)

# Anthropic writes parameter paths with dots: "messages.0.content".
_validate = partial(validate, dotted=True)


def _stop_reason(finished: Finished, has_calls: bool) -> str:
    if finished.finish_reason == "length":
        return "max_tokens"
    if finished.finish_reason == "tool_calls" or has_calls:
        return "tool_use"  # Claude Code only runs tools when told the turn stopped for them
    return "stop_sequence" if finished.stop_sequence is not None else "end_turn"


def _usage(prompt_tokens: int, cached_tokens: int, output_tokens: int) -> dict[str, Any]:
    # Anthropic's input_tokens excludes cache reads; the two add up to the whole prompt.
    return {
        "input_tokens": max(prompt_tokens - cached_tokens, 0),
        "cache_creation_input_tokens": 0,
        "cache_read_input_tokens": cached_tokens,
        "output_tokens": output_tokens,
    }


def thinking_signature(thinking: str) -> str:
    """The `signature` of a thinking block. Anthropic's is an encrypted blob that only its API can
    verify; this gateway's is a plain digest (history thinking is dropped, never verified), marked
    so no one mistakes it for Anthropic's."""
    return "pflash-gateway:" + hashlib.sha256(thinking.encode("utf-8")).hexdigest()


def complete_response(
    conv: Conversation,
    response_id: str,
    created: int,
    text: str,
    tool_calls: Sequence[ToolCall],
    finished: Finished,
    reasoning: str = "",
) -> dict[str, Any]:
    """The non-streaming Message body."""
    content: list[dict[str, Any]] = []
    if reasoning:
        content.append({"type": "thinking", "thinking": reasoning, "signature": thinking_signature(reasoning)})
    if text:
        content.append({"type": "text", "text": text})
    for call in tool_calls:
        content.append({"type": "tool_use", "id": call.id, "name": call.name, "input": arguments_object(call.arguments)})
    stop_reason = _stop_reason(finished, bool(tool_calls))
    u = finished.usage
    return {
        "id": with_prefix(response_id, "msg_"),
        "type": "message",
        "role": "assistant",
        "model": conv.model,
        "content": content,
        "stop_reason": stop_reason,
        "stop_sequence": finished.stop_sequence if stop_reason == "stop_sequence" else None,
        "usage": _usage(u.prompt_tokens, u.cached_tokens, u.completion_tokens),
    }


class StreamEncoder:
    """Engine events -> Anthropic `event: NAME` SSE frames.

    Text and tool calls become content blocks in arrival order; a block is closed when the next
    one opens. A ToolCallDelta for the call already open appends `arguments` as a JSON fragment
    (engines that stream arguments send each call's fragments contiguously).
    """

    def __init__(self, conv: Conversation, response_id: str, created: int):
        self.model = conv.model
        self.id = with_prefix(response_id, "msg_")
        self._started = False
        self._done = False
        self._block = -1  # index of the open content block, -1 if none
        self._block_kind: str | None = None  # "thinking", "text" or "tool_use"
        self._thinking: list[str] = []  # the open thinking block's text, for its signature
        self._open_call: int | None = None  # ToolCallDelta.index of the open tool_use block
        self._has_calls = False

    def begin(self, prompt_tokens: int = 0, cached_tokens: int = 0) -> bytes:
        if self._started:
            return b""
        self._started = True
        message = {
            "id": self.id,
            "type": "message",
            "role": "assistant",
            "model": self.model,
            "content": [],
            "stop_reason": None,
            "stop_sequence": None,
            "usage": _usage(prompt_tokens, cached_tokens, 0),
        }
        return sse_event("message_start", {"type": "message_start", "message": message}) + self.keepalive()

    def keepalive(self) -> bytes:
        return sse_event("ping", {"type": "ping"})

    def _close_block(self) -> bytes:
        if self._block_kind is None:
            return b""
        out = b""
        if self._block_kind == "thinking":  # the signature closes a thinking block, as Anthropic's
            signature = thinking_signature("".join(self._thinking))
            out = self._delta({"type": "signature_delta", "signature": signature}, self._block)
            self._thinking = []
        self._block_kind = None
        return out + sse_event("content_block_stop", {"type": "content_block_stop", "index": self._block})

    def _open_block(self, kind: str, block: dict[str, Any]) -> bytes:
        out = self._close_block()
        self._block += 1
        self._block_kind = kind
        start = {"type": "content_block_start", "index": self._block, "content_block": block}
        return out + sse_event("content_block_start", start)

    def _delta(self, delta: dict[str, Any], index: int) -> bytes:
        return sse_event("content_block_delta", {"type": "content_block_delta", "index": index, "delta": delta})

    def feed(self, event: TurnEvent) -> bytes:
        if self._done:
            return b""
        out = self.begin()  # message_start must come first, even if begin() was skipped
        if isinstance(event, ReasoningDelta):
            if not event.text:
                return out
            if self._block_kind != "thinking":
                out += self._open_block("thinking", {"type": "thinking", "thinking": "", "signature": ""})
            self._thinking.append(event.text)
            out += self._delta({"type": "thinking_delta", "thinking": event.text}, self._block)
        elif isinstance(event, TextDelta):
            if not event.text:
                return out
            if self._block_kind != "text":
                out += self._open_block("text", {"type": "text", "text": ""})
            out += self._delta({"type": "text_delta", "text": event.text}, self._block)
        elif isinstance(event, ToolCallDelta):
            if self._block_kind != "tool_use" or self._open_call != event.index:
                call = event.call
                out += self._open_block("tool_use", {"type": "tool_use", "id": call.id, "name": call.name, "input": {}})
                self._open_call = event.index
                self._has_calls = True
            if event.call.arguments:
                out += self._delta({"type": "input_json_delta", "partial_json": event.call.arguments}, self._block)
        else:
            self._done = True
            out += self._close_block()
            stop_reason = _stop_reason(event, self._has_calls)
            u = event.usage
            delta = {
                "stop_reason": stop_reason,
                "stop_sequence": event.stop_sequence if stop_reason == "stop_sequence" else None,
            }
            usage = _usage(u.prompt_tokens, u.cached_tokens, u.completion_tokens)
            out += sse_event("message_delta", {"type": "message_delta", "delta": delta, "usage": usage})
            out += sse_event("message_stop", {"type": "message_stop"})
        return out

    def error(self, err: ApiError) -> bytes:
        if self._done:
            return b""
        self._done = True
        return sse_event("error", error_body(err, "anthropic"))
