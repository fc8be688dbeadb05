"""OpenAI Responses (POST /v1/responses, what Codex CLI speaks) <-> the neutral conversation.

Pure, h11-style: request bodies in, `Conversation` out; engine events in, SSE bytes out. Only
`input` is parsed here: the caller prepends the history stored under `previous_response_id`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Annotated, Any, Literal

from pydantic import Field, StrictBool, StrictFloat, StrictStr

from gateway.errors import ApiError, invalid
from gateway.openai_chat import (
    PART_SEPARATOR,
    SSE_COMMENT_KEEPALIVE,
    PositiveInt,
    UnitFloat,
    WireModel,
    session_hints,
    sse_event,
    string_tool_choice,
    validate,
    with_prefix,
)
from policies.conversation import (
    Conversation,
    Finished,
    Message,
    SamplingParams,
    TextDelta,
    ToolCall,
    ToolCallDelta,
    ToolSpec,
)

# --------------------------------------------------------------------------------------------
# Request wire models
# --------------------------------------------------------------------------------------------


class MessageItem(WireModel):
    type: Literal["message"] = "message"
    role: StrictStr
    content: object  # string or list of parts; checked by hand


class FunctionCallItem(WireModel):
    type: Literal["function_call"]
    call_id: StrictStr
    name: StrictStr
    arguments: StrictStr = "{}"


class FunctionCallOutputItem(WireModel):
    type: Literal["function_call_output"]
    call_id: StrictStr
    output: object  # string or list of input_text parts; checked by hand


class FunctionTool(WireModel):
    type: Literal["function"]
    name: Annotated[StrictStr, Field(min_length=1)]
    description: StrictStr | None = None
    parameters: dict[str, Any] | None = None


class ResponsesRequest(WireModel):
    # A local gateway serves one model, so a missing name is not worth a 400.
    model: StrictStr = ""
    instructions: StrictStr | None = None
    input: object  # string or list of items; checked by hand
    tools: list[dict[str, Any]] | None = None
    tool_choice: object = None
    max_output_tokens: PositiveInt | None = None
    temperature: Annotated[StrictFloat, Field(ge=0, le=2)] | None = None
    top_p: UnitFloat | None = None
    stream: StrictBool | None = None
    store: StrictBool | None = None
    prompt_cache_key: StrictStr | None = None
    previous_response_id: StrictStr | None = None


# --------------------------------------------------------------------------------------------
# Parsing
# --------------------------------------------------------------------------------------------

_ROLES = {"user": "user", "assistant": "assistant", "system": "system", "developer": "system"}
_TEXT_PARTS = ("input_text", "output_text")


def _parts_text(content: object, param: str, allowed: tuple[str, ...] = _TEXT_PARTS) -> str:
    """A string or a list of text parts as one string."""
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise invalid(f"Invalid type for '{param}': expected a string or an array of content parts.", param)
    texts: list[str] = []
    for i, part in enumerate(content):
        where = f"{param}[{i}]"
        kind = part.get("type") if isinstance(part, dict) else None
        if kind not in allowed:
            raise invalid(f"Invalid value for '{where}.type': unsupported content part type {kind!r}.", f"{where}.type")
        field = "refusal" if kind == "refusal" else "text"
        value = part.get(field)
        if not isinstance(value, str):
            raise invalid(f"Invalid type for '{where}.{field}': expected a string.", f"{where}.{field}")
        texts.append(value)
    return PART_SEPARATOR.join(texts)


def _parse_input(raw: object) -> list[Message]:
    if isinstance(raw, str):
        return [Message("user", raw)]
    if not isinstance(raw, list) or not raw:
        raise invalid("Invalid value for 'input': expected a string or a non-empty array of items.", "input")
    messages: list[Message] = []
    call_names: dict[str, str] = {}  # call_id -> function name, for naming the outputs
    for i, item in enumerate(raw):
        param = f"input[{i}]"
        if not isinstance(item, dict):
            raise invalid(f"Invalid type for '{param}': expected an object.", param)
        kind = item.get("type")
        # Easy-input messages ({"role", "content"}) leave out the type.
        if kind == "message" or (kind is None and "role" in item):
            msg = validate(MessageItem, item, ("input", i))
            role = _ROLES.get(msg.role)
            if role is None:
                raise invalid(
                    f"Invalid value for '{param}.role': unknown role {msg.role!r} "
                    "(expected user, assistant, system or developer).",
                    f"{param}.role",
                )
            allowed = (*_TEXT_PARTS, "refusal") if role == "assistant" else _TEXT_PARTS
            messages.append(Message(role, _parts_text(msg.content, f"{param}.content", allowed)))
        elif kind == "function_call":
            fc = validate(FunctionCallItem, item, ("input", i))
            call = ToolCall(fc.call_id, fc.name, fc.arguments)
            call_names[fc.call_id] = fc.name
            # Responses lists each call as its own item; the neutral form keeps the calls of one
            # assistant turn on that turn's message.
            if messages and messages[-1].role == "assistant":
                last = messages[-1]
                messages[-1] = Message("assistant", last.content, tool_calls=(*last.tool_calls, call))
            else:
                messages.append(Message("assistant", "", tool_calls=(call,)))
        elif kind == "function_call_output":
            out = validate(FunctionCallOutputItem, item, ("input", i))
            text = _parts_text(out.output, f"{param}.output", ("input_text",))
            # The call may live in stored history the caller prepends, so no match is required here.
            messages.append(Message("tool", text, tool_call_id=out.call_id, name=call_names.get(out.call_id)))
        else:
            continue  # reasoning, web_search_call, ...: nothing the local model can use
    return messages


def _parse_tools(raw: list[dict[str, Any]] | None) -> tuple[ToolSpec, ...]:
    specs: list[ToolSpec] = []
    for i, item in enumerate(raw or ()):
        if item.get("type") != "function":
            continue  # hosted tools (web_search, file_search, custom, ...) cannot run locally
        tool = validate(FunctionTool, item, ("tools", i))
        specs.append(ToolSpec(tool.name, tool.description or "", tool.parameters or {}))
    return tuple(specs)


def _parse_tool_choice(raw: object, tools: tuple[ToolSpec, ...]) -> str | dict[str, Any] | None:
    if raw is None:
        return None
    if isinstance(raw, str):
        return string_tool_choice(raw)
    if not isinstance(raw, dict):
        raise invalid("Invalid type for 'tool_choice': expected a string or an object.", "tool_choice")
    if raw.get("type") != "function":
        return None  # a hosted tool or an allowed-tools list: those tools were dropped above
    name = raw.get("name")
    if not isinstance(name, str):
        raise invalid("Missing required parameter: 'tool_choice.name'.", "tool_choice.name")
    if name not in {t.name for t in tools}:
        raise invalid(f"Invalid value for 'tool_choice': no function named {name!r} in 'tools'.", "tool_choice")
    return {"name": name}


def parse_request(body: object, headers: Mapping[str, str]) -> Conversation:
    """A Responses request body as a neutral Conversation of `instructions` + `input` only."""
    req = validate(ResponsesRequest, body)
    assert isinstance(body, dict)
    messages = _parse_input(req.input)
    if req.instructions:
        messages.insert(0, Message("system", req.instructions))
    tools = _parse_tools(req.tools)
    defaults = SamplingParams()
    params = SamplingParams(
        max_tokens=req.max_output_tokens,
        temperature=defaults.temperature if req.temperature is None else req.temperature,
        top_p=defaults.top_p if req.top_p is None else req.top_p,
    )
    return Conversation(
        messages=tuple(messages),
        tools=tools,
        tool_choice=_parse_tool_choice(req.tool_choice, tools),
        params=params,
        hints=session_hints(body, headers),
        model=req.model,
        stream=bool(req.stream),
    )


def previous_response_id(body: object) -> str | None:
    """The response whose stored history precedes this request's `input`, if any."""
    value = body.get("previous_response_id") if isinstance(body, dict) else None
    return value if isinstance(value, str) and value else None


# --------------------------------------------------------------------------------------------
# Responses
# --------------------------------------------------------------------------------------------


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


def _call_item(item_id: str, call: ToolCall, status: str) -> dict[str, Any]:
    return {
        "type": "function_call",
        "id": item_id,
        "call_id": call.id,
        "name": call.name,
        "arguments": call.arguments,
        "status": status,
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
            "parallel_tool_calls": True,
            "previous_response_id": None,
            "reasoning": {"effort": None, "summary": None},
            "temperature": conv.params.temperature,
            "text": {"format": {"type": "text"}},
            "tool_choice": {"type": "function", **choice} if isinstance(choice, dict) else (choice or "auto"),
            "tools": [
                {"type": "function", "name": t.name, "description": t.description, "parameters": t.parameters}
                for t in conv.tools
            ],
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
) -> dict[str, Any]:
    """The non-streaming response object."""
    shell = _ResponseShell(conv, response_id, created)
    incomplete = finished.finish_reason == "length"
    output: list[dict[str, Any]] = []
    if text:
        output.append(_message_item(shell.item_id("msg", 0), text, "incomplete" if incomplete else "completed"))
    for call in tool_calls:
        output.append(_call_item(shell.item_id("fc", len(output)), call, "completed"))
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
        if item["type"] == "message":
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
        else:
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
        shown = {**item, "content": []} if item["type"] == "message" else item
        return self._event("response.output_item.added", output_index=len(self._output), item=shown)

    def feed(self, event: TextDelta | ToolCallDelta | Finished) -> bytes:
        if self._done:
            return b""
        out = self.begin()  # response.created must come first, even if begin() was skipped
        index = len(self._output)
        if isinstance(event, TextDelta):
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
                out += self._add_item(_call_item(self._shell.item_id("fc", index), call, "in_progress"))
                self._open_call = event.index
            assert self._open is not None
            if event.call.arguments:
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
