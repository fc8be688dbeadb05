"""Conformance: request bodies in the shapes Claude Code, Codex CLI, Aider and the SDKs send (read
from their public source), replayed through the official SDKs against a live gateway on the real
model, on both engines (in-process llama.cpp and llama_cpp.server upstream).

Judged as the agents would feel it: no answer is a 5xx, and every conversation gets a 200 on its
next turn too (the reply, tool results and all, appended as the client would append them).
"""

from __future__ import annotations

import base64
import copy
import inspect
import uuid
from collections.abc import Callable
from typing import Any

import anthropic
import openai
import pytest
from anthropic.resources.messages import Messages
from openai.resources.responses import Responses

from tests.conftest import Gateway

pytestmark = pytest.mark.engine

# A real 1x1 PNG, and a few KB of "PDF": small enough for the test gateway's 1 MB body limit.
PNG = base64.b64encode(bytes.fromhex(
    "89504e470d0a1a0a0000000d4948445200000001000000010806000000"
    "1f15c4890000000d49444154789c6360000002000105a1d1b3fb0000000049454e44ae426082")).decode()
PDF = base64.b64encode(b"%PDF-1.4\n" + b"0" * 3000).decode()
EPHEMERAL = {"type": "ephemeral"}
MAX_TOKENS = 12  # a few tokens prove the turn; the test is about the request shapes

READ_TOOL = {"name": "Read", "description": "Read a file.", "cache_control": EPHEMERAL,
             "input_schema": {"type": "object", "properties": {"file_path": {"type": "string"}},
                              "required": ["file_path"]}}
BASH_TOOL = {"name": "Bash", "description": "Run a command.",
             "input_schema": {"type": "object", "properties": {"command": {"type": "string"}},
                              "required": ["command"]}}
CC_SYSTEM = [
    {"type": "text", "text": "x-anthropic-billing-header: cc_version=2.1.0; cch=0a1b2;"},
    {"type": "text", "text": "You are Claude Code. Be brief.", "cache_control": EPHEMERAL},
]


def claude_code(messages: list[dict[str, Any]], **extra: Any) -> dict[str, Any]:
    body: dict[str, Any] = {
        "model": "claude-sonnet-4-5", "max_tokens": MAX_TOKENS, "system": CC_SYSTEM, "messages": messages,
        "tools": [READ_TOOL, BASH_TOOL, {"type": "web_search_20250305", "name": "web_search", "max_uses": 5}],
        "metadata": {"user_id": "user_abc_account_def_session_" + uuid.uuid4().hex},
        "temperature": 0,
    }
    body.update(extra)
    return body


CLAUDE_CODE_CASES: dict[str, dict[str, Any]] = {
    "pasted_screenshot": claude_code([{"role": "user", "content": [
        {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": PNG}},
        {"type": "text", "text": "What is in this screenshot?", "cache_control": EPHEMERAL}]}]),
    "read_png_in_tool_result_and_tool_error": claude_code([
        {"role": "user", "content": "Look at logo.png and run the tests."},
        {"role": "assistant", "content": [
            {"type": "text", "text": "Reading."},
            {"type": "tool_use", "id": "toolu_01", "name": "Read", "input": {"file_path": "/repo/logo.png"}},
            {"type": "tool_use", "id": "toolu_02", "name": "Bash", "input": {"command": "pytest -q"}}]},
        {"role": "user", "content": [
            {"type": "tool_result", "tool_use_id": "toolu_01", "content": [
                {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": PNG}}]},
            {"type": "tool_result", "tool_use_id": "toolu_02", "is_error": True, "cache_control": EPHEMERAL,
             "content": [{"type": "text", "text": "Exit code 1"}, {"type": "text", "text": "1 failed"}]},
            {"type": "text", "text": "What went wrong?"}]},
    ]),
    "thinking_history_and_thinking_only_turn": claude_code([
        {"role": "user", "content": "Hi"},
        {"role": "assistant", "content": [
            {"type": "thinking", "thinking": "The user greets me.", "signature": "EqQBCkgIAhABGAIiQ"},
            {"type": "text", "text": "Hello!"}]},
        {"role": "user", "content": "Think about 2+2."},
        {"role": "assistant", "content": [
            {"type": "thinking", "thinking": "Four.", "signature": "EqQBCkgIAhABGAIiQ"},
            {"type": "redacted_thinking", "data": "EmwKAhgBEgy3va3pzix"}]},
        {"role": "user", "content": "Now answer."},
    ], thinking={"type": "enabled", "budget_tokens": 1024}, temperature=1),
    "pdf_document_forced_tool_no_parallel": claude_code([{"role": "user", "content": [
        {"type": "document", "source": {"type": "base64", "media_type": "application/pdf", "data": PDF},
         "title": "spec.pdf", "cache_control": EPHEMERAL},
        {"type": "text", "text": "Read the spec file."}]}],
        tool_choice={"type": "any", "disable_parallel_tool_use": True}),
}


def chat(messages: list[dict[str, Any]], **extra: Any) -> dict[str, Any]:
    return {"model": "gpt-4o", "messages": messages, "max_tokens": MAX_TOKENS, "temperature": 0, **extra}


SHELL_FN = {"type": "function", "function": {
    "name": "shell", "description": "Run a shell command.",
    "parameters": {"type": "object", "properties": {"command": {"type": "string"}}, "required": ["command"]}}}

CHAT_CASES: dict[str, dict[str, Any]] = {
    "image_url_and_audio_and_file_parts": chat([
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": [
            {"type": "text", "text": "Describe these."},
            {"type": "image_url", "image_url": {"url": f"data:image/png;base64,{PNG}", "detail": "low"}},
            {"type": "image_url", "image_url": {"url": "https://example.com/cat.jpg"}},
            {"type": "input_audio", "input_audio": {"data": PNG, "format": "wav"}},
            {"type": "file", "file": {"file_data": f"data:application/pdf;base64,{PDF}", "filename": "a.pdf"}}]}]),
    "aider_json_schema_and_forced_tool": chat(
        [{"role": "system", "content": "Act as an expert software developer."},
         {"role": "user", "content": "List the files."}],
        tools=[SHELL_FN], tool_choice={"type": "function", "function": {"name": "shell"}},
        parallel_tool_calls=False),
    "response_format_json_schema": chat(
        [{"role": "user", "content": "Give a number as JSON."}],
        response_format={"type": "json_schema", "json_schema": {"name": "n", "strict": True, "schema": {
            "type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"],
            "additionalProperties": False}}}),
    "tool_message_with_parts_and_mid_history_system": chat([
        {"role": "user", "content": "Run ls."},
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "call_1", "type": "function", "function": {"name": "shell", "arguments": '{"command": "ls"}'}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": [{"type": "text", "text": "README.md"}]},
        {"role": "developer", "content": "Answer in one word."},
        {"role": "user", "content": "Which file?"}], tools=[SHELL_FN]),
}

CODEX_TOOLS = [
    {"type": "function", "name": "shell", "description": "Runs a shell command.", "strict": False,
     "parameters": {"type": "object", "properties": {"command": {"type": "array", "items": {"type": "string"}}},
                    "required": ["command"], "additionalProperties": False}},
    {"type": "custom", "name": "apply_patch", "description": "Edit files with a patch.",
     "format": {"type": "grammar", "syntax": "lark", "definition": "start: begin_patch hunk+ end_patch"}},
    {"type": "local_shell"},
    {"type": "web_search"},
]


def codex(items: list[dict[str, Any]], **extra: Any) -> dict[str, Any]:
    body: dict[str, Any] = {
        "model": "gpt-5-codex", "instructions": "You are Codex. Be brief.", "input": items, "tools": CODEX_TOOLS,
        "tool_choice": "auto", "parallel_tool_calls": False, "reasoning": {"effort": "medium", "summary": "auto"},
        "store": False, "include": ["reasoning.encrypted_content"], "prompt_cache_key": uuid.uuid4().hex,
        "max_output_tokens": MAX_TOKENS, "temperature": 0,
    }
    body.update(extra)
    return body


def _user(text: str) -> dict[str, Any]:
    return {"type": "message", "role": "user", "content": [{"type": "input_text", "text": text}]}


CODEX_CASES: dict[str, dict[str, Any]] = {
    "developer_mid_history_custom_and_local_shell_history": codex([
        {"type": "message", "role": "developer", "content": [{"type": "input_text", "text": "<permissions/>"}]},
        _user("Fix the bug."),
        {"type": "reasoning", "id": "rs_1", "summary": [], "encrypted_content": "gAAAAABo"},
        {"type": "custom_tool_call", "id": "ctc_1", "status": "completed", "call_id": "call_p",
         "name": "apply_patch", "input": "*** Begin Patch\n*** Update File: a.py\n-x\n+y\n*** End Patch"},
        {"type": "custom_tool_call_output", "call_id": "call_p", "output": "Success. Updated the following files:\nM a.py"},
        {"type": "local_shell_call", "id": "lsh_1", "call_id": "call_s", "status": "completed",
         "action": {"type": "exec", "command": ["pytest", "-q"], "timeout_ms": 10000, "working_directory": "/repo",
                    "env": None, "user": None}},
        {"type": "function_call_output", "call_id": "call_s", "output": "1 passed"},
        {"type": "message", "role": "developer", "content": [{"type": "input_text", "text": "<environment_context/>"}]},
        _user("Done?"),
    ]),
    "input_image_in_message_and_tool_output": codex([
        {"type": "message", "role": "user", "content": [
            {"type": "input_text", "text": "What does this show?"},
            {"type": "input_image", "image_url": f"data:image/png;base64,{PNG}"}]},
        {"type": "function_call", "call_id": "call_v", "name": "shell", "arguments": '{"command": ["cat", "x.png"]}'},
        {"type": "function_call_output", "call_id": "call_v", "output": [
            {"type": "input_image", "image_url": f"data:image/png;base64,{PNG}"},
            {"type": "input_text", "text": "(image)"}]},
        _user("Summarise."),
    ]),
    "forced_function_and_json_schema_text_format": codex(
        [_user("List the files.")], tool_choice={"type": "function", "name": "shell"},
        text={"format": {"type": "json_schema", "name": "out", "strict": True, "schema": {
            "type": "object", "properties": {"files": {"type": "array", "items": {"type": "string"}}},
            "required": ["files"], "additionalProperties": False}}}),
}


# --------------------------------------------------------------------------------------------
# Replaying through the SDKs, then the client's own next turn
# --------------------------------------------------------------------------------------------

def _params(method: Callable[..., Any]) -> set[str]:
    return set(inspect.signature(method).parameters)


# What this SDK version takes as arguments; the rest of a body travels as extra_body, as is.
_ANTHROPIC_ARGS = _params(Messages.create)
_COUNT_ARGS = _params(Messages.count_tokens)
_RESPONSES_ARGS = _params(Responses.create)


def _split(body: dict[str, Any], known: set[str]) -> dict[str, Any]:
    args = {k: v for k, v in body.items() if k in known}
    extra = {k: v for k, v in body.items() if k not in known}
    return {**args, "extra_body": extra} if extra else args


def send_anthropic(server: Gateway, body: dict[str, Any], session: str) -> anthropic.types.Message:
    client = anthropic.Anthropic(base_url=server.url, api_key="x", max_retries=0, timeout=300)
    return client.messages.create(**_split(body, _ANTHROPIC_ARGS), extra_headers={"x-session-id": session})


def next_anthropic(body: dict[str, Any], reply: anthropic.types.Message) -> dict[str, Any]:
    later = copy.deepcopy(body)
    content = [block.model_dump(exclude_none=True) for block in reply.content]
    later["messages"].append({"role": "assistant", "content": content or [{"type": "text", "text": "."}]})
    results = [{"type": "tool_result", "tool_use_id": b.id, "content": "ok"} for b in reply.content if b.type == "tool_use"]
    later["messages"].append({"role": "user", "content": [*results, {"type": "text", "text": "Thanks. Go on."}]})
    later.pop("tool_choice", None)
    return later


def send_chat(server: Gateway, body: dict[str, Any], session: str) -> Any:
    client = openai.OpenAI(base_url=server.url + "/v1", api_key="x", max_retries=0, timeout=300)
    return client.chat.completions.create(**body, extra_headers={"x-session-id": session})


def next_chat(body: dict[str, Any], reply: Any) -> dict[str, Any]:
    later = copy.deepcopy(body)
    message = reply.choices[0].message
    later["messages"].append(message.model_dump(exclude_none=True))
    later["messages"] += [{"role": "tool", "tool_call_id": c.id, "content": "ok"} for c in message.tool_calls or ()]
    later["messages"].append({"role": "user", "content": "Thanks. Go on."})
    later.pop("tool_choice", None)
    return later


def send_responses(server: Gateway, body: dict[str, Any], session: str) -> Any:
    client = openai.OpenAI(base_url=server.url + "/v1", api_key="x", max_retries=0, timeout=300)
    return client.responses.create(**_split(body, _RESPONSES_ARGS), extra_headers={"session_id": session})


def next_responses(body: dict[str, Any], reply: Any) -> dict[str, Any]:
    later = copy.deepcopy(body)
    for item in reply.output:
        later["input"].append(item.model_dump(exclude_none=True))
        if item.type == "function_call":
            later["input"].append({"type": "function_call_output", "call_id": item.call_id, "output": "ok"})
        elif item.type == "custom_tool_call":
            later["input"].append({"type": "custom_tool_call_output", "call_id": item.call_id, "output": "ok"})
        elif item.type == "local_shell_call":
            later["input"].append({"type": "function_call_output", "call_id": item.call_id, "output": "ok"})
    later["input"].append(_user("Thanks. Go on."))
    later["tool_choice"] = "auto"
    return later


API: dict[str, tuple[dict[str, dict[str, Any]], Callable[..., Any], Callable[..., dict[str, Any]]]] = {
    "claude_code": (CLAUDE_CODE_CASES, send_anthropic, next_anthropic),
    "chat": (CHAT_CASES, send_chat, next_chat),
    "codex": (CODEX_CASES, send_responses, next_responses),
}
CASES = [(api, name) for api, (cases, _, _) in API.items() for name in cases]


# llama_cpp.server, the upstream these tests front, answers the OpenAI json_schema response_format
# with its own error; the gateway then sends the same schema in its own words (json_object + schema),
# so these cases run on both engines.
UPSTREAM_FALLBACK = {"response_format_json_schema", "forced_function_and_json_schema_text_format"}


@pytest.mark.parametrize(("api", "case"), CASES, ids=[f"{a}-{c}" for a, c in CASES])
def test_agent_request_gets_a_200_and_so_does_its_next_turn(any_gateway: Gateway, api: str, case: str) -> None:
    cases, send, follow = API[api]
    body = copy.deepcopy(cases[case])
    session = f"conf-{api}-{case}-{uuid.uuid4().hex[:8]}"
    # The SDK raises on any non-2xx (max_retries=0): a 5xx or a 400 fails the test with its body.
    reply = send(any_gateway, body, session)
    again = send(any_gateway, follow(body, reply), session)
    assert again is not None
    if any_gateway.engine == "upstream" and case in UPSTREAM_FALLBACK and any_gateway.proxy is not None:
        sent = [b.get("response_format") for b in any_gateway.proxy.chat_bodies()[-4:]]
        assert any(f and f["type"] == "json_object" and f.get("schema") for f in sent), sent  # the fallback


def test_count_tokens_accepts_every_claude_code_shape(any_gateway: Gateway) -> None:
    client = anthropic.Anthropic(base_url=any_gateway.url, api_key="x", max_retries=0, timeout=120)
    for body in CLAUDE_CODE_CASES.values():
        counted = {k: v for k, v in body.items() if k not in ("max_tokens", "temperature", "metadata")}
        assert client.messages.count_tokens(**_split(counted, _COUNT_ARGS)).input_tokens > 0


@pytest.mark.parametrize("api", ["claude_code", "chat", "codex"])
def test_stream_accumulates_to_the_non_streaming_answer(gateway: Gateway, api: str) -> None:
    """Event by event through each SDK's own accumulator: the same greedy answer as without streaming
    (each call in a fresh session, so both prefill from scratch)."""
    if api == "claude_code":
        body = claude_code([{"role": "user", "content": "Say hello."}], tools=[READ_TOOL])
        client = anthropic.Anthropic(base_url=gateway.url, api_key="x", max_retries=0, timeout=300)
        plain = send_anthropic(gateway, body, uuid.uuid4().hex)
        with client.messages.stream(**_split(body, _ANTHROPIC_ARGS),
                                    extra_headers={"x-session-id": uuid.uuid4().hex}) as stream:
            streamed = stream.get_final_message()
        assert [b.model_dump() for b in streamed.content] == [b.model_dump() for b in plain.content]
        assert streamed.stop_reason == plain.stop_reason
    elif api == "chat":
        body = chat([{"role": "user", "content": "Say hello."}], seed=7)
        client = openai.OpenAI(base_url=gateway.url + "/v1", api_key="x", max_retries=0, timeout=300)
        plain = send_chat(gateway, body, uuid.uuid4().hex)
        with client.chat.completions.stream(**body, extra_headers={"x-session-id": uuid.uuid4().hex}) as stream:
            for _event in stream:
                pass
            streamed = stream.current_completion_snapshot  # get_final_completion() refuses finish "length"
        assert streamed.choices[0].message.content == plain.choices[0].message.content
        assert streamed.choices[0].finish_reason == plain.choices[0].finish_reason
    else:
        body = codex([_user("Say hello.")], tools=CODEX_TOOLS[:1])
        client = openai.OpenAI(base_url=gateway.url + "/v1", api_key="x", max_retries=0, timeout=300)
        plain = send_responses(gateway, body, uuid.uuid4().hex)
        with client.responses.stream(**_split(body, _RESPONSES_ARGS),
                                     extra_headers={"session_id": uuid.uuid4().hex}) as stream:
            streamed = stream.get_final_response()
        assert streamed.output_text == plain.output_text and streamed.status == plain.status
        assert [o.type for o in streamed.output] == [o.type for o in plain.output]
