"""OpenAI Chat Completions (POST /v1/chat/completions) <-> the neutral conversation.

Pure, h11-style: request bodies in, `Conversation` out; engine events in, SSE bytes out. No
sockets, no framework. The small wire helpers at the top (error mapping, session hints, SSE
framing, text joining) are shared by the Anthropic and Responses adapters so all three APIs
report errors and join text the same way.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from typing import Annotated, Any, Literal, TypeVar

from pydantic import BaseModel, ConfigDict, Field, StrictBool, StrictFloat, StrictInt, StrictStr, ValidationError

from gateway.errors import ApiError, error_body, invalid
from policies.conversation import (
    Conversation,
    Finished,
    Message,
    SamplingParams,
    SessionHints,
    TextDelta,
    ToolCall,
    ToolCallDelta,
    ToolSpec,
)

# --------------------------------------------------------------------------------------------
# Shared wire helpers
# --------------------------------------------------------------------------------------------

# Adjacent text parts/blocks become one message string; a blank line keeps them apart for the
# model without inventing structure. All three adapters use it so they agree on the result.
PART_SEPARATOR = "\n\n"

PositiveInt = Annotated[StrictInt, Field(gt=0)]
UnitFloat = Annotated[StrictFloat, Field(ge=0, le=1)]


class WireModel(BaseModel):
    """Base of every request model: clients send many fields we do not use, so accept them."""

    model_config = ConfigDict(extra="allow")


M = TypeVar("M", bound=BaseModel)


def param_path(loc: Iterable[str | int], dotted: bool = False) -> str:
    """('messages', 0, 'content') -> 'messages[0].content' as OpenAI writes `param`, or
    'messages.0.content' (dotted) as Anthropic does."""
    out = ""
    for part in loc:
        if isinstance(part, int) and not dotted:
            out += f"[{part}]"
        else:
            out += f".{part}" if out else str(part)
    return out


def validation_error(exc: ValidationError, prefix: Sequence[str | int] = (), dotted: bool = False) -> ApiError:
    # Only the first problem is reported: that is what the upstream APIs do and it keeps the
    # message readable.
    first = exc.errors(include_url=False)[0]
    param = param_path([*prefix, *first["loc"]], dotted)
    if first["type"] == "missing":
        return invalid(f"Missing required parameter: '{param}'.", param)
    return invalid(f"Invalid value for '{param}': {first['msg']}.", param)


def validate(model: type[M], data: object, prefix: Sequence[str | int] = (), dotted: bool = False) -> M:
    """Validate one wire object; report failures as a 400 whose `param` is the full path."""
    if not isinstance(data, dict):
        param = param_path(prefix, dotted) or None
        where = f"'{param}'" if param else "The request body"
        raise invalid(f"{where} must be a JSON object.", param)
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        raise validation_error(exc, prefix, dotted) from None


def session_hints(body: Mapping[str, Any], headers: Mapping[str, str]) -> SessionHints:
    """Every session-identity hint the client gave; values of the wrong type are just not hints."""

    def text(value: object) -> str | None:
        return value if isinstance(value, str) and value else None

    metadata = body.get("metadata")
    return SessionHints(
        x_session_id=text(headers.get("x-session-id")),
        claude_code_session_id=text(headers.get("x-claude-code-session-id")),
        session_id_header=text(headers.get("session_id")) or text(headers.get("session-id")),
        prompt_cache_key=text(body.get("prompt_cache_key")),
        metadata_user_id=text(metadata.get("user_id")) if isinstance(metadata, dict) else None,
        user=text(body.get("user")),
    )


def with_prefix(response_id: str, prefix: str) -> str:
    # The caller may hand us a bare id or one already in this API's shape.
    return response_id if response_id.startswith(prefix) else prefix + response_id


def sse_data(obj: object) -> bytes:
    # ensure_ascii keeps U+2028 and friends out of the stream; some SSE readers split lines on them.
    return b"data: " + json.dumps(obj, separators=(",", ":")).encode() + b"\n\n"


def sse_event(name: str, obj: object) -> bytes:
    return f"event: {name}\n".encode() + sse_data(obj)


SSE_COMMENT_KEEPALIVE = b": keep-alive\n\n"

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


# --------------------------------------------------------------------------------------------
# Parsing
# --------------------------------------------------------------------------------------------


def _content_text(content: object, param: str, allowed: tuple[str, ...] = ("text",)) -> str:
    """A message's content (string or array of text parts) as one string."""
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
            raise invalid(f"Invalid value for '{where}.type': unsupported content part type {kind!r}.", f"{where}.type")
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
        return Message("user", _content_text(msg.content, f"{param}.content"))
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
        text = "" if msg.content is None else _content_text(msg.content, f"{param}.content")
        return Message("tool", text, tool_call_id=msg.tool_call_id, name=calls_seen[msg.tool_call_id])
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


def string_tool_choice(raw: str) -> str:
    """The string forms both OpenAI APIs share."""
    if raw not in ("auto", "none", "required"):
        raise invalid(
            f"Invalid value for 'tool_choice': {raw!r} (expected 'auto', 'none', 'required' or a function).",
            "tool_choice",
        )
    return raw


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
    )


def stream_include_usage(body: object) -> bool:
    """Whether the client asked for the trailing usage chunk (`stream_options.include_usage`)."""
    opts = body.get("stream_options") if isinstance(body, dict) else None
    return isinstance(opts, dict) and opts.get("include_usage") is True


# --------------------------------------------------------------------------------------------
# Responses
# --------------------------------------------------------------------------------------------


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
) -> dict[str, Any]:
    """The non-streaming `chat.completion` body."""
    message: dict[str, Any] = {
        "role": "assistant",
        # null, not "", when the turn is only tool calls: that is what OpenAI sends.
        "content": None if tool_calls and not text else text,
        "refusal": None,
    }
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

    def feed(self, event: TextDelta | ToolCallDelta | Finished) -> bytes:
        if self._done:
            return b""
        out = self.begin()  # clients expect the role chunk first, even if begin() was skipped
        if isinstance(event, TextDelta):
            if event.text:
                out += self._delta({"content": event.text})
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
