"""OpenAI Responses (POST /v1/responses, what Codex CLI speaks) <-> the neutral conversation.

Pure, h11-style: request bodies in, `Conversation` out (the way back is responses_output). Only
`input` is parsed here: the caller prepends the history stored under `previous_response_id`.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Annotated, Any, Literal

from pydantic import Field, StrictBool, StrictFloat, StrictStr

from gateway.api.attachments import openai_image, openai_part
from gateway.api.codex_tools import LOCAL_SHELL, custom_call, custom_tool, local_shell_call, local_shell_tool
from gateway.api.wire import (
    PART_SEPARATOR,
    PositiveInt,
    UnitFloat,
    WireModel,
    response_format,
    session_hints,
    string_tool_choice,
    validate,
)
from gateway.errors import invalid
from policies.conversation_types import (
    Attachment,
    Conversation,
    Message,
    SamplingParams,
    ToolCall,
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
    parallel_tool_calls: StrictBool | None = None
    text: dict[str, Any] | None = None  # {"format": {...}, "verbosity": ...}


# --------------------------------------------------------------------------------------------
# Parsing
# --------------------------------------------------------------------------------------------

_ROLES = {"user": "user", "assistant": "assistant", "system": "system", "developer": "system"}
_TEXT_PARTS = ("input_text", "output_text")


def _parts_text(content: object, param: str, allowed: tuple[str, ...] = _TEXT_PARTS,
                images: list[Attachment] | None = None) -> str:
    """A string or a list of parts as one string; non-text parts become placeholders, the images
    behind them collected into `images`."""
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise invalid(f"Invalid type for '{param}': expected a string or an array of content parts.", param)
    texts: list[str] = []
    for i, part in enumerate(content):
        where = f"{param}[{i}]"
        if not isinstance(part, dict):
            raise invalid(f"Invalid type for '{where}': expected an object.", where)
        kind = part.get("type")
        if kind not in allowed:
            if not isinstance(kind, str):
                raise invalid(f"Missing required parameter: '{where}.type'.", f"{where}.type")
            texts.append(openai_part(part))  # input_image, input_file, ...: a placeholder
            if images is not None and (image := openai_image(part, texts[-1])) is not None:
                images.append(image)
            continue
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
            images: list[Attachment] = []
            text = _parts_text(msg.content, f"{param}.content", allowed, images)
            messages.append(Message(role, text, attachments=tuple(images)))
        elif kind == "function_call":
            fc = validate(FunctionCallItem, item, ("input", i))
            call_names[fc.call_id] = fc.name
            _add_call(messages, ToolCall(fc.call_id, fc.name, fc.arguments))
        elif kind in ("function_call_output", "custom_tool_call_output", "local_shell_call_output"):
            call_id = item.get("call_id") or item.get("id")  # local_shell_call_output may carry only `id`
            if not isinstance(call_id, str):
                raise invalid(f"Missing required parameter: '{param}.call_id'.", f"{param}.call_id")
            if "output" not in item:
                raise invalid(f"Missing required parameter: '{param}.output'.", f"{param}.output")
            images = []
            text = _parts_text(item["output"], f"{param}.output", images=images)
            # The call may live in stored history the caller prepends, so no match is required here.
            messages.append(Message("tool", text, tool_call_id=call_id, name=call_names.get(call_id),
                                    attachments=tuple(images)))
        elif kind in ("custom_tool_call", "local_shell_call"):
            call = custom_call(item, param) if kind == "custom_tool_call" else local_shell_call(item, param)
            call_names[call.id] = call.name
            _add_call(messages, call)
        else:
            continue  # reasoning (dropped from the prompt), web_search_call, ...: nothing to render
    return messages


def _add_call(messages: list[Message], call: ToolCall) -> None:
    # Responses lists each call as its own item; the neutral form keeps the calls of one
    # assistant turn on that turn's message.
    if messages and messages[-1].role == "assistant":
        last = messages[-1]
        messages[-1] = Message("assistant", last.content, tool_calls=(*last.tool_calls, call))
    else:
        messages.append(Message("assistant", "", tool_calls=(call,)))


def _parse_tools(raw: list[dict[str, Any]] | None) -> tuple[ToolSpec, ...]:
    specs: list[ToolSpec] = []
    for i, item in enumerate(raw or ()):
        kind = item.get("type")
        if kind == "function":
            tool = validate(FunctionTool, item, ("tools", i))
            specs.append(ToolSpec(tool.name, tool.description or "", tool.parameters or {}))
        elif kind == "custom":
            specs.append(custom_tool(item, i))
        elif kind == LOCAL_SHELL:
            specs.append(local_shell_tool())
        # hosted tools (web_search, file_search, ...) cannot run locally: dropped
    return tuple(specs)


def _parse_tool_choice(raw: object, tools: tuple[ToolSpec, ...]) -> str | dict[str, Any] | None:
    if raw is None:
        return None
    if isinstance(raw, str):
        return string_tool_choice(raw)
    if not isinstance(raw, dict):
        raise invalid("Invalid type for 'tool_choice': expected a string or an object.", "tool_choice")
    if raw.get("type") == LOCAL_SHELL and any(t.name == LOCAL_SHELL for t in tools):
        return {"name": LOCAL_SHELL}
    if raw.get("type") not in ("function", "custom"):
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
        parallel_tool_calls=req.parallel_tool_calls is not False,
        response_format=response_format((req.text or {}).get("format"), "text.format"),
    )


def previous_response_id(body: object) -> str | None:
    """The response whose stored history precedes this request's `input`, if any."""
    value = body.get("previous_response_id") if isinstance(body, dict) else None
    return value if isinstance(value, str) and value else None
