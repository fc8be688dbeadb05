"""Codex's own Responses tools: `custom` (freeform text input, e.g. apply_patch) and `local_shell`.

The model sees each as an ordinary function: a custom tool takes one string argument `input`,
local_shell takes a `command` array. Their history items become ordinary tool calls and results,
and a call the model makes goes back to the client as the item type it declared
(`custom_tool_call` / `local_shell_call`, the shapes codex-rs `ResponseItem` parses).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from gateway.api.wire import arguments_object
from gateway.errors import invalid
from policies.conversation_types import ToolCall, ToolSpec

LOCAL_SHELL = "local_shell"


@dataclass(frozen=True)
class CodexToolSpec(ToolSpec):
    """A tool whose calls are not `function_call` items on the wire."""

    wire_type: str = "custom"  # "custom" | "local_shell"


def custom_tool(item: dict[str, Any], i: int) -> CodexToolSpec:
    name = item.get("name")
    if not isinstance(name, str) or not name:
        raise invalid(f"Missing required parameter: 'tools[{i}].name'.", f"tools[{i}].name")
    description = item.get("description") if isinstance(item.get("description"), str) else ""
    fmt = item.get("format") if isinstance(item.get("format"), dict) else {}
    hint = "The complete raw input text for this tool"
    if fmt.get("type") == "grammar" and isinstance(fmt.get("definition"), str):
        # The grammar is how the client documents the input; a short one helps the model.
        hint += f", following this {fmt.get('syntax', '')} grammar:\n{fmt['definition'][:4000]}"
    schema = {"type": "object", "properties": {"input": {"type": "string", "description": hint}}, "required": ["input"]}
    return CodexToolSpec(name, description, schema, wire_type="custom")


def local_shell_tool() -> CodexToolSpec:
    schema = {
        "type": "object",
        "properties": {
            "command": {"type": "array", "items": {"type": "string"}, "description": "argv, e.g. [\"bash\", \"-lc\", \"ls\"]"},
            "workdir": {"type": "string", "description": "working directory"},
            "timeout_ms": {"type": "integer"},
        },
        "required": ["command"],
    }
    return CodexToolSpec(LOCAL_SHELL, "Runs a shell command and returns its output.", schema, wire_type=LOCAL_SHELL)


def custom_call(item: dict[str, Any], param: str) -> ToolCall:
    """A `custom_tool_call` history item as the function call the model sees."""
    call_id, name, text = item.get("call_id"), item.get("name"), item.get("input")
    for key, value in (("call_id", call_id), ("name", name), ("input", text)):
        if not isinstance(value, str):
            raise invalid(f"Missing required parameter: '{param}.{key}'.", f"{param}.{key}")
    return ToolCall(call_id, name, json.dumps({"input": text}, ensure_ascii=False))  # type: ignore[arg-type]


def local_shell_call(item: dict[str, Any], param: str) -> ToolCall:
    """A `local_shell_call` history item (action {type: exec, command, ...}) as a function call."""
    call_id = item.get("call_id") or item.get("id")
    action = item.get("action") if isinstance(item.get("action"), dict) else {}
    if not isinstance(call_id, str):
        raise invalid(f"Missing required parameter: '{param}.call_id'.", f"{param}.call_id")
    args: dict[str, Any] = {"command": action.get("command") if isinstance(action.get("command"), list) else []}
    if isinstance(action.get("working_directory"), str):
        args["workdir"] = action["working_directory"]
    if isinstance(action.get("timeout_ms"), int):
        args["timeout_ms"] = action["timeout_ms"]
    return ToolCall(call_id, LOCAL_SHELL, json.dumps(args, ensure_ascii=False))


def wire_tool(spec: ToolSpec) -> dict[str, Any]:
    """A tool as the response object lists it, in the type the client declared."""
    if isinstance(spec, CodexToolSpec):
        return {"type": LOCAL_SHELL} if spec.wire_type == LOCAL_SHELL else {
            "type": "custom", "name": spec.name, "description": spec.description}
    return {"type": "function", "name": spec.name, "description": spec.description, "parameters": spec.parameters}


def wire_kinds(tools: tuple[ToolSpec, ...]) -> dict[str, str]:
    """Tool name -> its wire type, for the tools whose calls are not function_call items."""
    return {t.name: t.wire_type for t in tools if isinstance(t, CodexToolSpec)}


def call_item(kind: str | None, item_id: str, call: ToolCall, status: str) -> dict[str, Any]:
    """The output item for one model call: function_call, custom_tool_call or local_shell_call."""
    if kind == "custom":
        args = arguments_object(call.arguments)
        text = args.get("input")
        # A model that answered with other keys still gets its text through rather than lost.
        text = text if isinstance(text, str) else (call.arguments if not args else json.dumps(args))
        return {"type": "custom_tool_call", "id": item_id, "status": status, "call_id": call.id, "name": call.name,
                "input": text}
    if kind == LOCAL_SHELL:
        args = arguments_object(call.arguments)
        command = args.get("command")
        if isinstance(command, str):  # a model that wrote one string means a shell line
            command = ["bash", "-lc", command]
        action = {
            "type": "exec",
            "command": [str(c) for c in command] if isinstance(command, list) else [],
            "timeout_ms": args.get("timeout_ms") if isinstance(args.get("timeout_ms"), int) else None,
            "working_directory": args.get("workdir") if isinstance(args.get("workdir"), str) else None,
            "env": None,
            "user": None,
        }
        return {"type": "local_shell_call", "id": item_id, "call_id": call.id, "status": status, "action": action}
    return {"type": "function_call", "id": item_id, "call_id": call.id, "name": call.name,
            "arguments": call.arguments, "status": status}
