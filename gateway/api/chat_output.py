"""OpenAI Chat Completions output: engine events -> the `chat.completion` body or its SSE chunks."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from gateway.api.wire import (
    SSE_COMMENT_KEEPALIVE,
    sse_data,
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


def _finish_reason(finished: Finished, has_calls: bool) -> str:
    # A turn that produced tool calls must say so, or clients will not run them.
    if has_calls and finished.finish_reason == "stop":
        return "tool_calls"
    return finished.finish_reason


def _usage(finished: Finished) -> dict[str, Any]:
    u = finished.usage
    return {
        "prompt_tokens": u.prompt_tokens,
        "completion_tokens": u.completion_tokens,
        "total_tokens": u.total_tokens,
        "prompt_tokens_details": {"cached_tokens": u.cached_tokens},
    }


def complete_response(
    conv: Conversation,
    response_id: str,
    created: int,
    text: str,
    tool_calls: Sequence[ToolCall],
    finished: Finished,
    reasoning: str = "",
) -> dict[str, Any]:
    """The non-streaming `chat.completion` body."""
    message: dict[str, Any] = {
        "role": "assistant",
        # null, not "", when the turn is only tool calls: that is what OpenAI sends.
        "content": None if tool_calls and not text else text,
        "refusal": None,
    }
    if reasoning:
        message["reasoning_content"] = reasoning  # the de-facto field (DeepSeek, vLLM, llama.cpp)
    if tool_calls:
        message["tool_calls"] = [
            {"id": c.id, "type": "function", "function": {"name": c.name, "arguments": c.arguments}}
            for c in tool_calls
        ]
    return {
        "id": with_prefix(response_id, "chatcmpl-"),
        "object": "chat.completion",
        "created": created,
        "model": conv.model,
        "choices": [
            {
                "index": 0,
                "message": message,
                "logprobs": None,
                "finish_reason": _finish_reason(finished, bool(tool_calls)),
            }
        ],
        "usage": _usage(finished),
    }


class StreamEncoder:
    """Engine events -> `chat.completion.chunk` SSE frames.

    Each ToolCallDelta for a new index opens that call (id, name, first arguments); a later one
    for the same index appends its `arguments` as a fragment, as OpenAI streams them. (The
    Anthropic and Responses encoders need each call's fragments to arrive contiguously.)
    """

    def __init__(self, conv: Conversation, response_id: str, created: int, include_usage: bool | None = None):
        self.model = conv.model
        self.id = with_prefix(response_id, "chatcmpl-")
        self.created = created
        self.include_usage = conv.stream_usage if include_usage is None else include_usage
        self._started = False
        self._done = False
        self._call_indexes: set[int] = set()

    def _chunk(self, choices: list[dict[str, Any]], **extra: Any) -> bytes:
        chunk: dict[str, Any] = {
            "id": self.id,
            "object": "chat.completion.chunk",
            "created": self.created,
            "model": self.model,
            "choices": choices,
        }
        if self.include_usage:
            # OpenAI puts usage: null on every chunk but the last when include_usage is on.
            chunk["usage"] = None
        chunk.update(extra)
        return sse_data(chunk)

    def _delta(self, delta: dict[str, Any], finish_reason: str | None = None) -> bytes:
        return self._chunk([{"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish_reason}])

    def begin(self, prompt_tokens: int = 0, cached_tokens: int = 0) -> bytes:
        if self._started:
            return b""
        self._started = True
        return self._delta({"role": "assistant", "content": ""})

    def keepalive(self) -> bytes:
        return SSE_COMMENT_KEEPALIVE

    def feed(self, event: TurnEvent) -> bytes:
        if self._done:
            return b""
        out = self.begin()  # clients expect the role chunk first, even if begin() was skipped
        if isinstance(event, TextDelta):
            if event.text:
                out += self._delta({"content": event.text})
        elif isinstance(event, ReasoningDelta):
            if event.text:
                out += self._delta({"reasoning_content": event.text})
        elif isinstance(event, ToolCallDelta):
            call: dict[str, Any] = {"index": event.index}
            if event.index not in self._call_indexes:
                self._call_indexes.add(event.index)
                fn = {"name": event.call.name, "arguments": event.call.arguments}
                call.update(id=event.call.id, type="function", function=fn)
            else:
                call["function"] = {"arguments": event.call.arguments}
            out += self._delta({"tool_calls": [call]})
        else:
            self._done = True
            out += self._delta({}, _finish_reason(event, bool(self._call_indexes)))
            if self.include_usage:
                out += self._chunk([], usage=_usage(event))
            out += b"data: [DONE]\n\n"
        return out

    def error(self, err: ApiError) -> bytes:
        if self._done:
            return b""
        self._done = True
        return sse_data(error_body(err, "openai")) + b"data: [DONE]\n\n"
