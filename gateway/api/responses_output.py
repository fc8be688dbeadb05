"""OpenAI Responses output: engine events -> the response object or its `event: NAME` SSE stream."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from gateway.api.codex_tools import call_item, wire_kinds, wire_tool
from gateway.api.wire import (
    SSE_COMMENT_KEEPALIVE,
    sse_event,
    with_prefix,
)
from gateway.errors import ApiError
from policies.conversation_types import (
    Conversation,
    Finished,
    ReasoningDelta,
    TextDelta,
    ToolCall,
    ToolCallDelta,
    TurnEvent,
)


def _usage(finished: Finished) -> dict[str, Any]:
    u = finished.usage
    return {
        "input_tokens": u.prompt_tokens,
        "input_tokens_details": {"cached_tokens": u.cached_tokens, "cache_write_tokens": 0},
        "output_tokens": u.completion_tokens,
        "output_tokens_details": {"reasoning_tokens": 0},
        "total_tokens": u.total_tokens,
    }


def _error_code(err: ApiError) -> str:
    # Codex keys its handling on these codes: context_length_exceeded triggers compaction,
    # rate_limit_exceeded a delayed retry, invalid_prompt a hard failure, anything else a retry.
    if err.code:
        return err.code
    return {"rate_limit_error": "rate_limit_exceeded", "invalid_request_error": "invalid_prompt"}.get(
        err.kind, "server_error"
    )


def _message_item(item_id: str, text: str, status: str) -> dict[str, Any]:
    return {
        "type": "message",
        "id": item_id,
        "status": status,
        "role": "assistant",
        "content": [{"type": "output_text", "text": text, "annotations": []}],
    }


def _reasoning_item(item_id: str, text: str, status: str) -> dict[str, Any]:
    return {
        "type": "reasoning",
        "id": item_id,
        "status": status,
        "summary": [],
        "content": [{"type": "reasoning_text", "text": text}],
        "encrypted_content": None,
    }


class _ResponseShell:
    """The parts of a response object that do not depend on the generated output."""

    def __init__(self, conv: Conversation, response_id: str, created: int):
        self.conv = conv
        self.id = with_prefix(response_id, "resp_")
        self.created = created
        # Item ids derive from the response id so they are unique without a random source.
        self._base = self.id.removeprefix("resp_")

    def item_id(self, prefix: str, output_index: int) -> str:
        return f"{prefix}_{self._base}_{output_index}"

    def body(
        self,
        status: str,
        output: list[dict[str, Any]],
        usage: dict[str, Any] | None = None,
        error: dict[str, Any] | None = None,
    ) -> dict[str, Any]:
        conv = self.conv
        choice = conv.tool_choice
        return {
            "id": self.id,
            "object": "response",
            "created_at": self.created,
            "status": status,
            "error": error,
            "incomplete_details": {"reason": "max_output_tokens"} if status == "incomplete" else None,
            "instructions": None,
            "max_output_tokens": conv.params.max_tokens,
            "model": conv.model,
            "output": output,
            "parallel_tool_calls": conv.parallel_tool_calls,
            "previous_response_id": None,
            "reasoning": {"effort": None, "summary": None},
            "temperature": conv.params.temperature,
            "text": {"format": conv.response_format or {"type": "text"}},
            "tool_choice": {"type": "function", **choice} if isinstance(choice, dict) else (choice or "auto"),
            "tools": [wire_tool(t) for t in conv.tools],
            "top_p": conv.params.top_p,
            "truncation": "disabled",
            "usage": usage,
            "user": None,
            "metadata": {},
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
    """The non-streaming response object."""
    shell = _ResponseShell(conv, response_id, created)
    incomplete = finished.finish_reason == "length"
    output: list[dict[str, Any]] = []
    if reasoning:
        output.append(_reasoning_item(shell.item_id("rs", 0), reasoning, "completed"))
    if text:
        output.append(_message_item(shell.item_id("msg", len(output)), text, "incomplete" if incomplete else "completed"))
    kinds = wire_kinds(conv.tools)
    for call in tool_calls:
        output.append(call_item(kinds.get(call.name), shell.item_id("fc", len(output)), call, "completed"))
    return shell.body("incomplete" if incomplete else "completed", output, usage=_usage(finished))


class StreamEncoder:
    """Engine events -> Responses `event: NAME` SSE frames with increasing sequence numbers.

    Output items are emitted one after another: text opens a message item, each new
    ToolCallDelta index a function_call item, and the open item is closed when the next opens.
    A ToolCallDelta for the index already open appends `arguments` as a fragment.
    """

    def __init__(self, conv: Conversation, response_id: str, created: int):
        self._shell = _ResponseShell(conv, response_id, created)
        self._seq = 0
        self._started = False
        self._done = False
        self._output: list[dict[str, Any]] = []  # finished items, for the final response object
        self._open: dict[str, Any] | None = None  # the item being streamed
        self._open_call: int | None = None  # ToolCallDelta.index of the open function_call
        self._kinds = wire_kinds(conv.tools)  # custom / local_shell tools: items of their own type
        self._call: ToolCall | None = None  # the open call of such a tool, its arguments so far

    def _event(self, event_type: str, /, **fields: Any) -> bytes:
        data = {"type": event_type, "sequence_number": self._seq, **fields}
        self._seq += 1
        return sse_event(event_type, data)

    def begin(self, prompt_tokens: int = 0, cached_tokens: int = 0) -> bytes:
        if self._started:
            return b""
        self._started = True
        response = self._shell.body("in_progress", [])
        return self._event("response.created", response=response) + self._event(
            "response.in_progress", response=response
        )

    def keepalive(self) -> bytes:
        return SSE_COMMENT_KEEPALIVE

    def _close(self, status: str = "completed") -> bytes:
        item = self._open
        if item is None:
            return b""
        self._open = self._open_call = None
        index = len(self._output)
        item["status"] = status
        out = b""
        if self._call is not None:  # custom / local_shell: the item is only known whole
            item = call_item(self._kinds.get(self._call.name), item["id"], self._call, status)
            self._call = None
        elif item["type"] == "reasoning":
            out += self._event(
                "response.reasoning_text.done",
                item_id=item["id"],
                output_index=index,
                content_index=0,
                text=item["content"][0]["text"],
            )
        elif item["type"] == "message":
            part = item["content"][0]
            out += self._event(
                "response.output_text.done",
                item_id=item["id"],
                output_index=index,
                content_index=0,
                text=part["text"],
                logprobs=[],
            )
            out += self._event(
                "response.content_part.done", item_id=item["id"], output_index=index, content_index=0, part=part
            )
        elif item["type"] == "function_call":
            out += self._event(
                "response.function_call_arguments.done",
                item_id=item["id"],
                output_index=index,
                name=item["name"],
                arguments=item["arguments"],
            )
        self._output.append(item)
        return out + self._event("response.output_item.done", output_index=index, item=item)

    def _add_item(self, item: dict[str, Any]) -> bytes:
        self._open = item
        shown = {**item, "content": []} if item["type"] in ("message", "reasoning") else item
        return self._event("response.output_item.added", output_index=len(self._output), item=shown)

    def feed(self, event: TurnEvent) -> bytes:
        if self._done:
            return b""
        out = self.begin()  # response.created must come first, even if begin() was skipped
        index = len(self._output)
        if isinstance(event, ReasoningDelta):
            if not event.text:
                return out
            if self._open is None or self._open["type"] != "reasoning":
                out += self._close()
                index = len(self._output)
                out += self._add_item(_reasoning_item(self._shell.item_id("rs", index), "", "in_progress"))
            assert self._open is not None
            self._open["content"][0]["text"] += event.text
            out += self._event(
                "response.reasoning_text.delta",
                item_id=self._open["id"],
                output_index=index,
                content_index=0,
                delta=event.text,
            )
        elif isinstance(event, TextDelta):
            if not event.text:
                return out
            if self._open is None or self._open["type"] != "message":
                out += self._close()
                index = len(self._output)
                item = _message_item(self._shell.item_id("msg", index), "", "in_progress")
                out += self._add_item(item)
                out += self._event(
                    "response.content_part.added",
                    item_id=item["id"],
                    output_index=index,
                    content_index=0,
                    part=item["content"][0],
                )
            assert self._open is not None
            part = self._open["content"][0]
            part["text"] += event.text
            out += self._event(
                "response.output_text.delta",
                item_id=self._open["id"],
                output_index=index,
                content_index=0,
                delta=event.text,
                logprobs=[],
            )
        elif isinstance(event, ToolCallDelta):
            if self._open_call != event.index:
                out += self._close()
                index = len(self._output)
                call = ToolCall(event.call.id, event.call.name, "")
                kind = self._kinds.get(call.name)
                out += self._add_item(call_item(kind, self._shell.item_id("fc", index), call, "in_progress"))
                self._open_call = event.index
                self._call = call if kind else None
            assert self._open is not None
            if self._call is not None:  # no argument deltas for these: the whole item comes at the end
                self._call = ToolCall(self._call.id, self._call.name, self._call.arguments + event.call.arguments)
            elif event.call.arguments:
                self._open["arguments"] += event.call.arguments
                out += self._event(
                    "response.function_call_arguments.delta",
                    item_id=self._open["id"],
                    output_index=index,
                    delta=event.call.arguments,
                )
        else:
            self._done = True
            incomplete = event.finish_reason == "length"
            out += self._close("incomplete" if incomplete else "completed")
            status = "incomplete" if incomplete else "completed"
            response = self._shell.body(status, self._output, usage=_usage(event))
            # Sent as response.completed even when incomplete: Codex treats response.incomplete
            # as a stream failure and retries, while the status field still tells the truth.
            out += self._event("response.completed", response=response)
        return out

    def error(self, err: ApiError) -> bytes:
        if self._done:
            return b""
        self._done = True
        out = self.begin()
        error = {"code": _error_code(err), "message": err.message}
        return out + self._event("response.failed", response=self._shell.body("failed", self._output, error=error))
