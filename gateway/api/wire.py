"""Wire pieces the three API adapters share: request-model base, validation with API-shaped
errors, session hints, SSE framing and text joining, so all three APIs agree on them."""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from typing import Annotated, Any, TypeVar

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    StrictFloat,
    StrictInt,
    ValidationError,
)

from gateway.errors import ApiError, invalid
from policies.conversation_types import SessionHints

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
        agent_id=text(headers.get("x-claude-code-agent-id")),
        thread_id=text(headers.get("thread-id")),
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

# The first line of a tool result the tool reported as failed (Anthropic `is_error`): the model
# must see that the call failed, and the same history must render the same bytes every turn.
TOOL_ERROR_MARKER = "[tool error]"


def tool_result_text(text: str, is_error: bool) -> str:
    return f"{TOOL_ERROR_MARKER}\n{text}" if is_error else text


def string_tool_choice(raw: str) -> str:
    """The string forms both OpenAI APIs share."""
    if raw not in ("auto", "none", "required"):
        raise invalid(
            f"Invalid value for 'tool_choice': {raw!r} (expected 'auto', 'none', 'required' or a function).",
            "tool_choice",
        )
    return raw


def response_format(raw: object, param: str) -> dict[str, Any] | None:
    """Chat `response_format` or Responses `text.format` in the neutral shape (None for text).

    Chat nests the schema ({"type": "json_schema", "json_schema": {"name", "schema", ...}});
    Responses flattens it ({"type": "json_schema", "name", "schema", ...}).
    """
    if raw is None:
        return None
    kind = raw.get("type") if isinstance(raw, dict) else None
    if kind == "text":
        return None
    if kind == "json_object":
        return {"type": "json_object"}
    if kind != "json_schema":
        raise invalid(
            f"Invalid value for '{param}.type': expected 'text', 'json_object' or 'json_schema'.", f"{param}.type"
        )
    assert isinstance(raw, dict)
    spec = raw.get("json_schema") if isinstance(raw.get("json_schema"), dict) else raw
    where = f"{param}.json_schema" if spec is not raw else param
    schema = spec.get("schema", {})
    if not isinstance(schema, dict):
        raise invalid(f"Invalid type for '{where}.schema': expected an object.", f"{where}.schema")
    name = spec.get("name")
    return {
        "type": "json_schema",
        "name": name if isinstance(name, str) and name else "response",
        "schema": schema,
        "strict": spec.get("strict") is True,
    }


def arguments_object(arguments: str) -> dict[str, Any]:
    """A tool call's JSON arguments as an object; arguments that are not one become {} rather
    than crash a client that expects an object (Anthropic `input`, Codex's own tool items)."""
    try:
        value = json.loads(arguments) if arguments.strip() else {}
    except ValueError:
        return {}
    return value if isinstance(value, dict) else {}
