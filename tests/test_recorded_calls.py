"""The benchmark's judge of a real client's tool calls: read from Anthropic and Responses answers,
streamed or whole, valid only when the tool was offered and its arguments fit its schema.
Model: none."""

from __future__ import annotations

import json

from benchmarks.recorded_calls import recorded_calls

READ_SCHEMA = {"type": "object", "properties": {"file_path": {"type": "string"}}, "required": ["file_path"]}
ANTHROPIC_REQUEST = json.dumps({"tools": [{"name": "Read", "input_schema": READ_SCHEMA},
                                          {"type": "web_search_20250305", "name": "web_search"}]}).encode()
RESPONSES_REQUEST = json.dumps({"tools": [{"type": "function", "name": "shell", "parameters": {
    "type": "object", "properties": {"command": {"type": "array", "items": {"type": "string"}}},
    "required": ["command"]}}]}).encode()


def sse(*events: dict) -> bytes:
    return "".join(f"event: {e.get('type', 'x')}\ndata: {json.dumps(e)}\n\n" for e in events).encode()


def test_streamed_anthropic_calls_are_assembled_and_judged() -> None:
    body = sse({"type": "message_start", "message": {}},
               {"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}},
               {"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": "Reading."}},
               {"type": "content_block_start", "index": 1, "content_block": {"type": "tool_use", "name": "Read"}},
               {"type": "content_block_delta", "index": 1, "delta": {"type": "input_json_delta",
                                                                     "partial_json": '{"file_path": '}},
               {"type": "content_block_delta", "index": 1, "delta": {"type": "input_json_delta",
                                                                     "partial_json": '"calc.py"}'}},
               {"type": "content_block_start", "index": 2, "content_block": {"type": "tool_use", "name": "gitStatus"}},
               {"type": "content_block_start", "index": 3, "content_block": {"type": "tool_use", "name": "Read"}},
               {"type": "content_block_delta", "index": 3, "delta": {"type": "input_json_delta",
                                                                     "partial_json": '{"path": "x"}'}})
    calls = recorded_calls("/v1/messages", ANTHROPIC_REQUEST, body)
    assert [(c.name, c.valid) for c in calls] == [("Read", True), ("gitStatus", False), ("Read", False)]
    assert json.loads(calls[0].arguments) == {"file_path": "calc.py"}


def test_a_whole_anthropic_message_and_a_schemaless_tool() -> None:
    body = json.dumps({"type": "message", "role": "assistant", "content": [
        {"type": "tool_use", "name": "web_search", "input": {"query": "x"}}]}).encode()
    assert [(c.name, c.valid) for c in recorded_calls("/v1/messages", ANTHROPIC_REQUEST, body)] == [("web_search", True)]


def test_responses_calls_come_from_the_completed_response() -> None:
    completed = {"type": "response.completed", "response": {"output": [
        {"type": "message", "content": []},
        {"type": "function_call", "name": "shell", "arguments": '{"command": ["cat", "calc.py"]}'},
        {"type": "function_call", "name": "shell", "arguments": '{"command": "cat calc.py"}'},
        {"type": "function_call", "name": "read_file", "arguments": "{}"}]}}
    calls = recorded_calls("/v1/responses", RESPONSES_REQUEST, sse({"type": "response.created"}, completed))
    assert [(c.name, c.valid) for c in calls] == [("shell", True), ("shell", False), ("read_file", False)]
    assert recorded_calls("/v1/responses", RESPONSES_REQUEST, b"") == []


def test_a_task_run_is_right_when_it_says_minus_one_then_names_the_bug(tmp_path) -> None:  # type: ignore[no-untyped-def]
    from benchmarks.bench_tasks import TaskRun, final_answer

    claude = tmp_path / "claude.out"
    claude.write_text('{"type":"assistant","message":{}}\nnot json\n{"type":"result","result":"It prints -1."}\n')
    codex = tmp_path / "codex.out"
    codex.write_text('{"type":"item.completed","item":{"type":"agent_message","text":"Change `a - b` to `a + b`."}}\n')
    assert final_answer(claude) == "It prints -1." and final_answer(tmp_path / "missing.out") == ""
    assert TaskRun("claude", 1, [], [], [final_answer(claude), final_answer(codex)]).right
    assert not TaskRun("claude", 1, [], [], ["It prints -10.", final_answer(codex)]).right
    assert not TaskRun("claude", 1, [], [], ["It prints 5.", "Use a + b."]).right
    assert not TaskRun("codex", 1, [], [], ["It prints -1."]).right  # no second answer
    assert TaskRun("codex", 1, [], [], ["`print(add(2, 3))` gives `-1`", "a-b"]).right
    # The folder of the 1.5B's run named in an answer is not a -1 (a published false "right").
    for not_minus_one in ("I need permission to write tasks-run-qwen2.5-coder-1.5b-instruct/calc.py.",
                          "It prints -1.5.", "It prints x-1", "It prints --1"):
        assert not TaskRun("claude", 1, [], [], [not_minus_one, "Use a + b."]).right, not_minus_one
