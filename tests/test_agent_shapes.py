"""Reasoning, Codex's own tools, structured-output and parallel-call flags on the wire: pure adapter
tests, checked by the official SDKs' own parsers and stream accumulators (no model)."""

from __future__ import annotations

import json

from gateway.api import chat as chat_api
from gateway.api import chat_output, messages_output, responses_output
from gateway.api import messages as messages_api
from gateway.api import responses as responses_api
from gateway.api.messages_output import thinking_signature
from policies.conversation_types import ReasoningDelta, TextDelta, ToolCall, ToolCallDelta
from tests.test_api_adapters import (
    MODEL,
    anthropic_client,
    chat_body,
    claude_code_body,
    codex_body,
    encode,
    finished,
    openai_client,
    sse_events,
)

THOUGHT = ["Let me ", "think."]
EVENTS = [ReasoningDelta(THOUGHT[0]), ReasoningDelta(THOUGHT[1]), TextDelta("4"), finished("stop")]


def test_chat_reasoning_content_streams_and_completes() -> None:
    conv = chat_api.parse_request(chat_body(stream=False), {})
    body = chat_output.complete_response(conv, "a", 1, "4", [], finished(), reasoning="Let me think.")
    assert body["choices"][0]["message"]["reasoning_content"] == "Let me think."
    raw = encode(chat_output.StreamEncoder(conv, "a", 1), EVENTS)
    deltas = [json.loads(d)["choices"][0]["delta"] for _, d in sse_events(raw) if d != "[DONE]" and json.loads(d)["choices"]]
    assert "".join(d.get("reasoning_content", "") for d in deltas) == "Let me think."
    with openai_client(raw).chat.completions.stream(model=MODEL, messages=[]) as stream:
        assert stream.get_final_completion().choices[0].message.content == "4"


def test_anthropic_thinking_block_with_gateway_signature() -> None:
    conv = messages_api.parse_request(claude_code_body(stream=False), {})
    raw = encode(messages_output.StreamEncoder(conv, "m", 1), EVENTS)
    with anthropic_client(raw).messages.stream(model=MODEL, max_tokens=1, messages=[]) as stream:
        streamed = stream.get_final_message()
    nonstream = messages_output.complete_response(conv, "m", 1, "4", [], finished(), reasoning="Let me think.")
    got = anthropic_client(nonstream).messages.create(model=MODEL, max_tokens=1, messages=[])
    for message in (streamed, got):
        thinking, text = message.content
        assert thinking.type == "thinking" and thinking.thinking == "Let me think."
        assert thinking.signature == thinking_signature("Let me think.") and thinking.signature.startswith("pflash-gateway:")
        assert text.type == "text" and text.text == "4"
    names = [json.loads(d)["delta"]["type"] for n, d in sse_events(raw) if n == "content_block_delta"]
    assert names == ["thinking_delta", "thinking_delta", "signature_delta", "text_delta"]


def test_anthropic_thinking_history_is_dropped_even_when_it_is_the_whole_turn() -> None:
    body = claude_code_body(messages=[
        {"role": "user", "content": "hi"},
        {"role": "assistant", "content": [{"type": "thinking", "thinking": "hmm", "signature": "x"},
                                          {"type": "redacted_thinking", "data": "abc"}]},
        {"role": "user", "content": "again"},
    ])
    conv = messages_api.parse_request(body, {})
    assert [(m.role, m.content) for m in conv.messages[1:]] == [("user", "hi"), ("user", "again")]


def test_responses_reasoning_item_streams_and_completes() -> None:
    conv = responses_api.parse_request(codex_body(), {})
    raw = encode(responses_output.StreamEncoder(conv, "r", 1), EVENTS)
    with openai_client(raw).responses.stream(model=MODEL, input="x") as stream:
        streamed = stream.get_final_response()
    body = responses_output.complete_response(conv, "r", 1, "4", [], finished(), reasoning="Let me think.")
    got = openai_client(body).responses.create(model=MODEL, input="x")
    for response in (streamed, got):
        reasoning, message = response.output
        assert reasoning.type == "reasoning" and [c.text for c in reasoning.content or []] == ["Let me think."]
        assert response.output_text == "4"


def test_codex_custom_and_local_shell_calls_come_back_in_their_own_item_types() -> None:
    body = codex_body(tools=[
        {"type": "custom", "name": "apply_patch", "description": "Edit files.",
         "format": {"type": "grammar", "syntax": "lark", "definition": "start: /.+/"}},
        {"type": "local_shell"},
    ])
    conv = responses_api.parse_request(body, {})
    spec = {t.name: t for t in conv.tools}
    assert spec["apply_patch"].parameters["required"] == ["input"]
    assert spec["local_shell"].parameters["properties"]["command"]["type"] == "array"
    patch = ToolCall("call_p", "apply_patch", json.dumps({"input": "*** Begin Patch\n*** End Patch"}))
    shell = ToolCall("call_s", "local_shell", json.dumps({"command": ["ls", "-la"], "workdir": "/repo"}))
    events = [ToolCallDelta(0, ToolCall("call_p", "apply_patch", patch.arguments[:10])),
              ToolCallDelta(0, ToolCall("call_p", "apply_patch", patch.arguments[10:])),
              ToolCallDelta(1, shell), finished("tool_calls")]
    raw = encode(responses_output.StreamEncoder(conv, "r", 1), events)
    with openai_client(raw).responses.stream(model=MODEL, input="x") as stream:
        streamed = stream.get_final_response()
    nonstream = responses_output.complete_response(conv, "r", 1, "", [patch, shell], finished("tool_calls"))
    for output in (streamed.model_dump()["output"], nonstream["output"]):
        custom, local = output
        assert (custom["type"], custom["call_id"], custom["name"], custom["input"]) == (
            "custom_tool_call", "call_p", "apply_patch", "*** Begin Patch\n*** End Patch")
        assert (local["type"], local["call_id"], local["status"]) == ("local_shell_call", "call_s", "completed")
        assert local["action"]["type"] == "exec" and local["action"]["command"] == ["ls", "-la"]
        assert local["action"]["working_directory"] == "/repo"


def test_codex_history_items_render_as_tool_calls_and_results() -> None:
    body = codex_body(input=[
        {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "patch it"}]},
        {"type": "custom_tool_call", "id": "ctc_1", "status": "completed", "call_id": "c1", "name": "apply_patch",
         "input": "*** Begin Patch"},
        {"type": "custom_tool_call_output", "call_id": "c1", "output": "Success. Updated: a.py"},
        {"type": "local_shell_call", "id": "ls_1", "call_id": "c2", "status": "completed",
         "action": {"type": "exec", "command": ["pytest", "-q"], "timeout_ms": 1000, "working_directory": None,
                    "env": None, "user": None}},
        {"type": "local_shell_call_output", "id": "c2", "output": "1 passed"},
    ])
    conv = responses_api.parse_request(body, {})
    assistant, patch_out, shell_out = conv.messages[2], conv.messages[3], conv.messages[5]
    assert assistant.tool_calls == (ToolCall("c1", "apply_patch", '{"input": "*** Begin Patch"}'),)
    assert (patch_out.role, patch_out.content, patch_out.name) == ("tool", "Success. Updated: a.py", "apply_patch")
    assert conv.messages[4].tool_calls == (ToolCall("c2", "local_shell", '{"command": ["pytest", "-q"], "timeout_ms": 1000}'),)
    assert (shell_out.role, shell_out.content, shell_out.name) == ("tool", "1 passed", "local_shell")


def test_structured_output_and_parallel_flags_are_parsed_in_every_api() -> None:
    schema = {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}
    chat = chat_api.parse_request(chat_body(parallel_tool_calls=False, response_format={
        "type": "json_schema", "json_schema": {"name": "answer", "schema": schema, "strict": True}}), {})
    assert chat.parallel_tool_calls is False
    assert chat.response_format == {"type": "json_schema", "name": "answer", "schema": schema, "strict": True}
    assert chat_api.parse_request(chat_body(response_format={"type": "json_object"}), {}).response_format == {
        "type": "json_object"}
    assert chat_api.parse_request(chat_body(response_format={"type": "text"}), {}).response_format is None
    resp = responses_api.parse_request(codex_body(text={"format": {"type": "json_schema", "name": "answer", "schema": schema}}), {})
    assert resp.response_format == {"type": "json_schema", "name": "answer", "schema": schema, "strict": False}
    ant = messages_api.parse_request(claude_code_body(tool_choice={"type": "any", "disable_parallel_tool_use": True}), {})
    assert ant.tool_choice == "required" and ant.parallel_tool_calls is False
    assert messages_api.parse_request(claude_code_body(), {}).parallel_tool_calls is True
    structured = claude_code_body(output_config={"effort": "low", "format": {"type": "json_schema", "schema": schema}})
    assert messages_api.parse_request(structured, {}).response_format == {
        "type": "json_schema", "name": "response", "schema": schema, "strict": True}
    resp = responses_api.parse_request(codex_body(tool_choice={"type": "custom", "name": "apply_patch"}), {})
    assert resp.tool_choice == {"name": "apply_patch"}
