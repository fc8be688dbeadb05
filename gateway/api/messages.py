"""Anthropic Messages (POST /v1/messages, /v1/messages/count_tokens) <-> the neutral conversation.

Pure, h11-style: request bodies in, `Conversation` out (the way back is messages_output).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from functools import partial
from typing import Annotated, Any

from pydantic import Field, StrictBool, StrictStr

from gateway.api.attachments import anthropic_block, anthropic_image
from gateway.api.wire import (
    PART_SEPARATOR,
    PositiveInt,
    UnitFloat,
    WireModel,
    session_hints,
    tool_result_text,
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
from policies.volatile import strip_volatile_system

# Anthropic writes parameter paths with dots: "messages.0.content".
_validate = partial(validate, dotted=True)

# --------------------------------------------------------------------------------------------
# Request wire models
# --------------------------------------------------------------------------------------------


class TextBlock(WireModel):
    type: StrictStr
    text: StrictStr


class ToolUseBlock(WireModel):
    type: StrictStr
    id: StrictStr
    name: StrictStr
    input: dict[str, Any]


class ToolResultBlock(WireModel):
    type: StrictStr
    tool_use_id: StrictStr
    content: object = None  # string or list of text blocks; checked by hand
    is_error: StrictBool | None = None


class AnthropicMessage(WireModel):
    role: StrictStr
    content: object


class AnthropicTool(WireModel):
    name: Annotated[StrictStr, Field(min_length=1)]
    description: StrictStr | None = None
    input_schema: dict[str, Any]


class AnthropicToolChoice(WireModel):
    type: StrictStr
    name: StrictStr | None = None
    disable_parallel_tool_use: StrictBool | None = None


class MessagesRequest(WireModel):
    # A local gateway serves one model, so a missing name is not worth a 400.
    model: StrictStr = ""
    max_tokens: PositiveInt
    messages: Annotated[list[dict[str, Any]], Field(min_length=1)]
    system: object = None
    tools: list[dict[str, Any]] | None = None
    tool_choice: AnthropicToolChoice | None = None
    stop_sequences: list[StrictStr] | None = None
    temperature: UnitFloat | None = None
    top_p: UnitFloat | None = None
    metadata: dict[str, Any] | None = None
    thinking: dict[str, Any] | None = None  # accepted; reasoning is parsed from the model's markup
    stream: StrictBool | None = None
    # Structured outputs: output_config.format (GA) or output_format (the earlier beta), both
    # {"type": "json_schema", "schema": {...}}.
    output_config: dict[str, Any] | None = None
    output_format: dict[str, Any] | None = None


class CountTokensRequest(MessagesRequest):
    max_tokens: PositiveInt | None = None  # type: ignore[assignment]


# --------------------------------------------------------------------------------------------
# Parsing
# --------------------------------------------------------------------------------------------

# Blocks of earlier assistant turns that carry no content for a model without extended thinking.
_IGNORED_BLOCKS = ("thinking", "redacted_thinking")


def _text_blocks(raw: object, param: str, images: list[Attachment] | None = None) -> str:
    """A string or a list of text blocks (system prompt, tool_result content) as one string;
    given an `images` list, images, documents and other non-text blocks become placeholders and
    the images behind them are collected there."""
    if isinstance(raw, str):
        return raw
    if not isinstance(raw, list):
        raise invalid(f"{param}: expected a string or an array of text blocks.", param)
    texts: list[str] = []
    for i, block in enumerate(raw):
        where = f"{param}.{i}"
        kind = block.get("type") if isinstance(block, dict) else None
        if kind == "text":
            texts.append(_validate(TextBlock, block, _loc(where)).text)
        elif images is not None and isinstance(kind, str):
            texts.append(anthropic_block(block))  # type: ignore[arg-type]
            if (image := anthropic_image(block, texts[-1])) is not None:  # type: ignore[arg-type]
                images.append(image)
        else:
            raise invalid(f"{where}.type: unsupported content block type {kind!r} (only 'text' here).", f"{where}.type")
    return PART_SEPARATOR.join(texts)


def _loc(param: str) -> tuple[str | int, ...]:
    # Anthropic names params with dots ("messages.0.content"); split back into a pydantic loc.
    return tuple(int(p) if p.isdigit() else p for p in param.split("."))


def _parse_user(content: object, param: str, tool_names: dict[str, str]) -> list[Message]:
    if isinstance(content, str):
        return [Message("user", content)]
    if not isinstance(content, list):
        raise invalid(f"{param}: expected a string or an array of content blocks.", param)
    out: list[Message] = []
    pending: list[str] = []  # user text not yet emitted; tool results split it into messages
    pending_images: list[Attachment] = []

    def flush() -> None:
        if pending:
            out.append(Message("user", PART_SEPARATOR.join(pending), attachments=tuple(pending_images)))
            pending.clear()
            pending_images.clear()

    for i, block in enumerate(content):
        where = f"{param}.{i}"
        kind = block.get("type") if isinstance(block, dict) else None
        if kind == "text":
            pending.append(_validate(TextBlock, block, _loc(where)).text)
        elif kind == "tool_result":
            result = _validate(ToolResultBlock, block, _loc(where))
            if result.tool_use_id not in tool_names:
                raise invalid(
                    f"{where}.tool_use_id: {result.tool_use_id!r} does not match any tool_use block "
                    "of a preceding assistant message.",
                    f"{where}.tool_use_id",
                )
            images: list[Attachment] = []
            text = "" if result.content is None else _text_blocks(result.content, f"{where}.content", images)
            flush()
            out.append(
                Message(
                    "tool",
                    tool_result_text(text, bool(result.is_error)),
                    tool_call_id=result.tool_use_id,
                    name=tool_names[result.tool_use_id],
                    is_error=bool(result.is_error),
                    attachments=tuple(images),
                )
            )
        elif kind in _IGNORED_BLOCKS:
            continue
        elif isinstance(kind, str) and kind != "tool_use":
            pending.append(anthropic_block(block))  # type: ignore[arg-type]  # image, document, ...
            if (image := anthropic_image(block, pending[-1])) is not None:  # type: ignore[arg-type]
                pending_images.append(image)
        else:
            raise invalid(f"{where}.type: unsupported content block type {kind!r} in a user message.", f"{where}.type")
    flush()
    return out


def _parse_assistant(content: object, param: str, tool_names: dict[str, str]) -> list[Message]:
    if isinstance(content, str):
        return [Message("assistant", content)] if content else []
    if not isinstance(content, list):
        raise invalid(f"{param}: expected a string or an array of content blocks.", param)
    texts: list[str] = []
    calls: list[ToolCall] = []
    for i, block in enumerate(content):
        where = f"{param}.{i}"
        kind = block.get("type") if isinstance(block, dict) else None
        if kind == "text":
            texts.append(_validate(TextBlock, block, _loc(where)).text)
        elif kind == "tool_use":
            use = _validate(ToolUseBlock, block, _loc(where))
            calls.append(ToolCall(use.id, use.name, json.dumps(use.input, ensure_ascii=False)))
            tool_names[use.id] = use.name
        elif kind in _IGNORED_BLOCKS:
            continue
        elif isinstance(kind, str) and kind != "tool_result":
            texts.append(anthropic_block(block))  # type: ignore[arg-type]  # server tool blocks, ...
        else:
            raise invalid(
                f"{where}.type: unsupported content block type {kind!r} in an assistant message.", f"{where}.type"
            )
    if not texts and not calls:
        return []  # e.g. only thinking blocks: nothing the model should see
    return [Message("assistant", PART_SEPARATOR.join(texts), tool_calls=tuple(calls))]


def _parse_tools(raw: list[dict[str, Any]] | None) -> tuple[ToolSpec, ...]:
    specs: list[ToolSpec] = []
    for i, item in enumerate(raw or ()):
        # Server tools (web_search_..., bash_..., text_editor_...) are typed and have no schema;
        # the local model cannot run them, so they are dropped rather than refused.
        if "input_schema" not in item and item.get("type") not in (None, "custom"):
            continue
        tool = _validate(AnthropicTool, item, ("tools", i))
        specs.append(ToolSpec(tool.name, tool.description or "", tool.input_schema))
    return tuple(specs)


def _parse_tool_choice(choice: AnthropicToolChoice | None, tools: tuple[ToolSpec, ...]) -> str | dict[str, Any] | None:
    if choice is None:
        return None
    if choice.type in ("auto", "none"):
        return choice.type
    if choice.type == "any":
        return "required"
    if choice.type == "tool":
        if not choice.name:
            raise invalid("tool_choice.name: Field required when tool_choice.type is 'tool'.", "tool_choice.name")
        if choice.name not in {t.name for t in tools}:
            raise invalid(f"tool_choice.name: no tool named {choice.name!r} in 'tools'.", "tool_choice.name")
        return {"name": choice.name}
    raise invalid(
        f"tool_choice.type: {choice.type!r} is not one of 'auto', 'any', 'tool', 'none'.", "tool_choice.type"
    )


def _output_format(req: MessagesRequest) -> dict[str, Any] | None:
    nested = (req.output_config or {}).get("format")
    raw, param = (nested, "output_config.format") if nested is not None else (req.output_format, "output_format")
    if raw is None:
        return None
    if not isinstance(raw, dict) or raw.get("type") != "json_schema" or not isinstance(raw.get("schema"), dict):
        raise invalid(f"{param}: expected {{\"type\": \"json_schema\", \"schema\": {{...}}}}.", param)
    # Anthropic's structured outputs are always strict.
    return {"type": "json_schema", "name": "response", "schema": raw["schema"], "strict": True}


def _parse(req: MessagesRequest, body: dict[str, Any], headers: Mapping[str, str]) -> Conversation:
    messages: list[Message] = []
    if req.system is not None:
        # Per-request and per-session billing values would break the shared prefix at its first tokens.
        system = strip_volatile_system(_text_blocks(req.system, "system"))
        if system:
            messages.append(Message("system", system))

    tool_names: dict[str, str] = {}  # tool_use id -> tool name, for the results that answer them
    for i, raw in enumerate(req.messages):
        msg = _validate(AnthropicMessage, raw, ("messages", i))
        param = f"messages.{i}.content"
        if msg.role == "user":
            messages.extend(_parse_user(msg.content, param, tool_names))
        elif msg.role == "assistant":
            messages.extend(_parse_assistant(msg.content, param, tool_names))
        elif msg.role == "system":
            # Claude Code (2.1.3xx) sends its system reminders as role "system" turns inside
            # `messages`; they stay where they are, so the history renders the same every turn.
            text = strip_volatile_system(_text_blocks(msg.content, param))
            if text:
                messages.append(Message("system", text))
        else:
            raise invalid(
                f"messages.{i}.role: unknown role {msg.role!r} (expected 'user', 'assistant' or 'system').",
                f"messages.{i}.role",
            )

    tools = _parse_tools(req.tools)
    defaults = SamplingParams()
    params = SamplingParams(
        max_tokens=req.max_tokens,
        temperature=defaults.temperature if req.temperature is None else req.temperature,
        top_p=defaults.top_p if req.top_p is None else req.top_p,
        stop=tuple(req.stop_sequences or ()),
    )
    return Conversation(
        messages=tuple(messages),
        tools=tools,
        tool_choice=_parse_tool_choice(req.tool_choice, tools),
        params=params,
        hints=session_hints(body, headers),
        model=req.model,
        stream=bool(req.stream),
        parallel_tool_calls=not (req.tool_choice and req.tool_choice.disable_parallel_tool_use),
        response_format=_output_format(req),
    )


def parse_request(body: object, headers: Mapping[str, str]) -> Conversation:
    """A Messages request body as a neutral Conversation; ApiError(400) if invalid."""
    req = _validate(MessagesRequest, body)
    assert isinstance(body, dict)
    return _parse(req, body, headers)


def parse_count_tokens_request(body: object, headers: Mapping[str, str]) -> Conversation:
    """Same as parse_request, but `max_tokens` is optional (count_tokens does not generate)."""
    req = _validate(CountTokensRequest, body)
    assert isinstance(body, dict)
    return _parse(req, body, headers)
