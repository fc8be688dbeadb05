"""The tool calls in an answer a client received, judged against the tools its request offered:
Anthropic Messages and OpenAI Responses, streamed or not. A call is valid when it names an offered
tool and, where that tool has a JSON schema, its arguments validate against it."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

import jsonschema


@dataclass(frozen=True)
class RecordedCall:
    name: str
    arguments: str
    valid: bool


def _events(body: bytes) -> list[dict[str, Any]]:
    text = body.decode("utf-8", "replace")
    if text.lstrip().startswith("{"):
        return [json.loads(text)]
    out = []
    for line in text.splitlines():
        if line.startswith("data: {"):
            try:
                out.append(json.loads(line[6:]))
            except ValueError:
                continue
    return out


def offered_tools(request_body: bytes) -> dict[str, dict[str, Any] | None]:
    """Name -> JSON schema of its input (None: a tool without one, e.g. a custom or server tool)."""
    try:
        tools = json.loads(request_body).get("tools") or []
    except (ValueError, AttributeError):
        return {}
    out: dict[str, dict[str, Any] | None] = {}
    for tool in tools:
        fn = tool.get("function") if isinstance(tool.get("function"), dict) else tool
        name = fn.get("name") or tool.get("type")
        if isinstance(name, str):
            schema = fn.get("input_schema") or fn.get("parameters")
            out[name] = schema if isinstance(schema, dict) else None
    return out


def _anthropic_calls(events: list[dict[str, Any]]) -> list[tuple[str, str]]:
    blocks: dict[int, list[str]] = {}
    for event in events:
        if event.get("type") == "message" or "content" in event and event.get("role") == "assistant":
            return [(b["name"], json.dumps(b.get("input", {}))) for b in event.get("content", [])
                    if b.get("type") == "tool_use"]
        if event.get("type") == "content_block_start" and event["content_block"].get("type") == "tool_use":
            blocks[event["index"]] = [event["content_block"]["name"], ""]
        elif event.get("type") == "content_block_delta" and event["index"] in blocks:
            blocks[event["index"]][1] += event["delta"].get("partial_json", "")
    return [(name, args or "{}") for name, args in blocks.values()]


def _responses_calls(events: list[dict[str, Any]]) -> list[tuple[str, str]]:
    for event in reversed(events):
        response = event.get("response") if event.get("type") == "response.completed" else event
        if isinstance(response, dict) and isinstance(response.get("output"), list):
            return [(item.get("name", ""), item.get("arguments", item.get("input", "")))
                    for item in response["output"] if item.get("type") in ("function_call", "custom_tool_call")]
    return []


def recorded_calls(path: str, request_body: bytes, response_body: bytes) -> list[RecordedCall]:
    events = _events(response_body)
    found = _responses_calls(events) if path.startswith("/v1/responses") else _anthropic_calls(events)
    offered = offered_tools(request_body)
    calls = []
    for name, arguments in found:
        valid = name in offered
        schema = offered.get(name)
        if valid and schema is not None:
            try:
                jsonschema.validate(json.loads(arguments or "{}"), schema)
            except (ValueError, jsonschema.ValidationError, jsonschema.SchemaError):
                valid = False
        calls.append(RecordedCall(name, arguments, valid))
    return calls
