"""OpenAI Chat Completions (POST /v1/chat/completions) <-> the neutral conversation.

Pure, h11-style: request bodies in, `Conversation` out (the way back is chat_output). No
sockets, no framework.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Annotated, Any, Literal

from pydantic import Field, StrictBool, StrictFloat, StrictInt, StrictStr

from gateway.api.attachments import openai_image, openai_part
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


class ChatFunctionCall(WireModel):
    name: StrictStr
    # Spec requires it; an absent one means "no arguments".
    arguments: StrictStr = "{}"


class ChatToolCall(WireModel):
    id: StrictStr
    type: Literal["function"] = "function"
    function: ChatFunctionCall


class ChatMessage(WireModel):
    role: StrictStr
    # str | list of parts | None: checked by hand for clearer messages than a pydantic union.
    content: object = None
    name: StrictStr | None = None
    tool_calls: list[ChatToolCall] | None = None
    tool_call_id: StrictStr | None = None


class ChatToolFunction(WireModel):
    name: Annotated[StrictStr, Field(min_length=1)]
    description: StrictStr | None = None
    parameters: dict[str, Any] | None = None


class ChatTool(WireModel):
    type: StrictStr = "function"
    function: ChatToolFunction


class ChatStreamOptions(WireModel):
    include_usage: StrictBool | None = None


class ChatRequest(WireModel):
    # A local gateway serves one model, so a missing name is not worth a 400.
    model: StrictStr = ""
    messages: Annotated[list[dict[str, Any]], Field(min_length=1)]
    tools: list[dict[str, Any]] | None = None
    tool_choice: object = None
    max_tokens: PositiveInt | None = None
    max_completion_tokens: PositiveInt | None = None
    temperature: Annotated[StrictFloat, Field(ge=0, le=2)] | None = None
    top_p: UnitFloat | None = None
    stop: object = None
    seed: StrictInt | None = None
    stream: StrictBool | None = None
    stream_options: ChatStreamOptions | None = None
    n: StrictInt | None = None
    parallel_tool_calls: StrictBool | None = None
    response_format: object = None  # checked by hand (wire.response_format)


# --------------------------------------------------------------------------------------------
# Parsing
# --------------------------------------------------------------------------------------------


def _content_text(content: object, param: str, allowed: tuple[str, ...] = ("text",),
                  images: list[Attachment] | None = None) -> str:
    """A message's content (string or array of parts) as one string; non-text parts become
    placeholders (attachments.py), the images behind them collected into `images`."""
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
            texts.append(openai_part(part))  # image_url, input_audio, file, ...: a placeholder
            if images is not None and (image := openai_image(part, texts[-1])) is not None:
                images.append(image)
            continue
        value = part.get(kind)  # {"type": "text", "text": ...} / {"type": "refusal", "refusal": ...}
        if not isinstance(value, str):
            raise invalid(f"Invalid type for '{where}.{kind}': expected a string.", f"{where}.{kind}")
        texts.append(value)
    return PART_SEPARATOR.join(texts)


def _parse_message(raw: dict[str, Any], i: int, calls_seen: dict[str, str]) -> Message:
    param = f"messages[{i}]"
    msg = validate(ChatMessage, raw, ("messages", i))
    role = msg.role
    if role in ("system", "developer"):
        if msg.content is None:
            raise invalid(f"Missing required parameter: '{param}.content'.", f"{param}.content")
        return Message("system", _content_text(msg.content, f"{param}.content"))
    if role == "user":
        if msg.content is None:
            raise invalid(f"Missing required parameter: '{param}.content'.", f"{param}.content")
        images: list[Attachment] = []
        text = _content_text(msg.content, f"{param}.content", images=images)
        return Message("user", text, attachments=tuple(images))
    if role == "assistant":
        calls = tuple(ToolCall(c.id, c.function.name, c.function.arguments) for c in msg.tool_calls or ())
        if msg.content is None and not calls:
            raise invalid(
                f"Missing required parameter: '{param}.content' (required unless 'tool_calls' is given).",
                f"{param}.content",
            )
        text = "" if msg.content is None else _content_text(msg.content, f"{param}.content", ("text", "refusal"))
        for call in calls:
            calls_seen[call.id] = call.name
        return Message("assistant", text, tool_calls=calls)
    if role == "tool":
        if msg.tool_call_id is None:
            raise invalid(f"Missing required parameter: '{param}.tool_call_id'.", f"{param}.tool_call_id")
        if msg.tool_call_id not in calls_seen:
            raise invalid(
                f"Invalid parameter: '{param}.tool_call_id' {msg.tool_call_id!r} does not match any "
                "tool call of a preceding assistant message.",
                f"{param}.tool_call_id",
            )
        images = []
        text = "" if msg.content is None else _content_text(msg.content, f"{param}.content", images=images)
        return Message("tool", text, tool_call_id=msg.tool_call_id, name=calls_seen[msg.tool_call_id],
                       attachments=tuple(images))
    raise invalid(
        f"Invalid value for '{param}.role': unknown role {role!r} "
        "(expected system, developer, user, assistant or tool).",
        f"{param}.role",
    )


def _parse_tools(raw: list[dict[str, Any]] | None) -> tuple[ToolSpec, ...]:
    specs: list[ToolSpec] = []
    for i, item in enumerate(raw or ()):
        tool = validate(ChatTool, item, ("tools", i))
        if tool.type != "function":
            raise invalid(
                f"Invalid value for 'tools[{i}].type': unsupported tool type {tool.type!r} (only 'function').",
                f"tools[{i}].type",
            )
        fn = tool.function
        specs.append(ToolSpec(fn.name, fn.description or "", fn.parameters or {}))
    return tuple(specs)


def _parse_tool_choice(raw: object, tools: tuple[ToolSpec, ...]) -> str | dict[str, Any] | None:
    if raw is None:
        return None
    if isinstance(raw, str):
        return string_tool_choice(raw)
    fn = raw.get("function") if isinstance(raw, dict) else None
    name = fn.get("name") if isinstance(fn, dict) else None
    if not isinstance(raw, dict) or raw.get("type") != "function" or not isinstance(name, str):
        raise invalid(
            "Invalid value for 'tool_choice': expected a string or {\"type\": \"function\", "
            "\"function\": {\"name\": ...}}.",
            "tool_choice",
        )
    if name not in {t.name for t in tools}:
        raise invalid(f"Invalid value for 'tool_choice': no tool named {name!r} in 'tools'.", "tool_choice")
    return {"name": name}


def _parse_stop(raw: object) -> tuple[str, ...]:
    if raw is None:
        return ()
    if isinstance(raw, str):
        return (raw,)
    if isinstance(raw, list) and all(isinstance(s, str) for s in raw):
        if len(raw) > 4:
            raise invalid("Invalid value for 'stop': at most 4 stop sequences are allowed.", "stop")
        return tuple(raw)
    raise invalid("Invalid type for 'stop': expected a string or an array of strings.", "stop")


def parse_request(body: object, headers: Mapping[str, str]) -> Conversation:
    """A Chat Completions request body as a neutral Conversation; ApiError(400) if invalid."""
    req = validate(ChatRequest, body)
    assert isinstance(body, dict)
    if req.n is not None and req.n != 1:
        raise invalid("Invalid value for 'n': only n=1 is supported.", "n")

    calls_seen: dict[str, str] = {}  # tool call id -> function name, for answering tool messages
    messages = tuple(_parse_message(m, i, calls_seen) for i, m in enumerate(req.messages))
    tools = _parse_tools(req.tools)
    defaults = SamplingParams()
    params = SamplingParams(
        # max_completion_tokens replaced max_tokens; prefer it when a client sends both.
        max_tokens=req.max_completion_tokens or req.max_tokens,
        temperature=defaults.temperature if req.temperature is None else req.temperature,
        top_p=defaults.top_p if req.top_p is None else req.top_p,
        stop=_parse_stop(req.stop),
        seed=req.seed,
    )
    return Conversation(
        messages=messages,
        tools=tools,
        tool_choice=_parse_tool_choice(req.tool_choice, tools),
        params=params,
        hints=session_hints(body, headers),
        model=req.model,
        stream=bool(req.stream),
        stream_usage=stream_include_usage(body),
        parallel_tool_calls=req.parallel_tool_calls is not False,
        response_format=response_format(req.response_format, "response_format"),
    )


def stream_include_usage(body: object) -> bool:
    """Whether the client asked for the trailing usage chunk (`stream_options.include_usage`)."""
    opts = body.get("stream_options") if isinstance(body, dict) else None
    return isinstance(opts, dict) and opts.get("include_usage") is True
