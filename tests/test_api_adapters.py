"""The three wire adapters: request parsing, validation errors, and bodies/streams the official
SDKs accept (the produced bytes are fed to the SDKs' own parsers through a mock transport).
Model: none (no model is loaded).
"""

from __future__ import annotations

import copy
import json
from collections.abc import Callable, Sequence
from typing import Any

import anthropic
import openai
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

try:  # the SDKs in this venv are built on the httpx2 fork; elsewhere they use httpx
    import httpx2 as httpx
except ImportError:  # pragma: no cover
    import httpx  # type: ignore[no-redef]

from gateway.api import chat as chat_api
from gateway.api import chat_output, messages_output, responses_output
from gateway.api import messages as messages_api
from gateway.api import responses as responses_api
from gateway.errors import ApiError, context_overflow
from policies.conversation_types import (
    Conversation,
    Finished,
    Message,
    TextDelta,
    ToolCall,
    ToolCallDelta,
    ToolSpec,
    Usage,
)

MODEL = "local-model"
READ_SCHEMA = {"type": "object", "properties": {"path": {"type": "string"}}, "required": ["path"]}
ARGS = {"path": "src/main.py"}
ARGS_JSON = json.dumps(ARGS)

# --------------------------------------------------------------------------------------------
# SDK plumbing: serve fixed bytes to the official clients
# --------------------------------------------------------------------------------------------


def _transport(body: bytes | dict[str, Any]) -> httpx.MockTransport:
    def handler(request: httpx.Request) -> httpx.Response:
        if isinstance(body, dict):
            return httpx.Response(200, json=body)
        return httpx.Response(200, headers={"content-type": "text/event-stream"}, content=body)

    return httpx.MockTransport(handler)


def openai_client(body: bytes | dict[str, Any]) -> openai.OpenAI:
    http = httpx.Client(transport=_transport(body))
    return openai.OpenAI(api_key="test", base_url="http://gateway.test/v1", max_retries=0, http_client=http)


def anthropic_client(body: bytes | dict[str, Any]) -> anthropic.Anthropic:
    http = httpx.Client(transport=_transport(body))
    return anthropic.Anthropic(api_key="test", base_url="http://gateway.test", max_retries=0, http_client=http)


Event = TextDelta | ToolCallDelta | Finished


def encode(encoder: Any, events: Sequence[Event], prompt: int = 120, cached: int = 80) -> bytes:
    # Keep-alives before and after begin(), as the server sends them during a long prefill.
    out = encoder.keepalive() + encoder.begin(prompt, cached) + encoder.keepalive()
    for event in events:
        out += encoder.feed(event)
    return out


def finished(
    reason: str = "stop", prompt: int = 120, completion: int = 7, cached: int = 80, stop_seq: str | None = None
) -> Finished:
    return Finished(reason, Usage(prompt, completion, cached), stop_seq)  # type: ignore[arg-type]


def sse_events(raw: bytes) -> list[tuple[str | None, str]]:
    """(event name, data) per frame, comments skipped."""
    frames = []
    for block in raw.decode().split("\n\n"):
        name, data = None, None
        for line in block.split("\n"):
            if line.startswith("event: "):
                name = line[7:]
            elif line.startswith("data: "):
                data = line[6:]
        if data is not None:
            frames.append((name, data))
    return frames


CALL = ToolCall("call_1", "read_file", ARGS_JSON)
TEXT_AND_CALL = [
    TextDelta("Let me "),
    TextDelta("look."),
    ToolCallDelta(0, ToolCall("call_1", "read_file", '{"path": ')),
    ToolCallDelta(0, ToolCall("call_1", "read_file", '"src/main.py"}')),
    ToolCallDelta(1, ToolCall("call_2", "list_dir", "{}")),
    finished("tool_calls"),
]


def expect_400(fn: Callable[[], object], message: str, param: str | None = None) -> ApiError:
    with pytest.raises(ApiError) as info:
        fn()
    err = info.value
    assert err.status == 400 and err.kind == "invalid_request_error"
    assert message.lower() in err.message.lower(), err.message
    if param is not None:
        assert err.param == param
    return err


# --------------------------------------------------------------------------------------------
# OpenAI Chat Completions
# --------------------------------------------------------------------------------------------


def chat_body(**overrides: Any) -> dict[str, Any]:
    body: dict[str, Any] = {
        "model": MODEL,
        "messages": [
            {"role": "system", "content": "You are a coding agent."},
            {"role": "developer", "content": [{"type": "text", "text": "Be terse."}]},
            {"role": "user", "content": [{"type": "text", "text": "Open"}, {"type": "text", "text": "main.py"}]},
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {"id": "call_1", "type": "function", "function": {"name": "read_file", "arguments": ARGS_JSON}}
                ],
            },
            {"role": "tool", "tool_call_id": "call_1", "content": "print('hi')"},
            {"role": "user", "content": "Thanks"},
        ],
        "tools": [
            {"type": "function", "function": {"name": "read_file", "description": "Read a file.", "parameters": READ_SCHEMA}},
            {"type": "function", "function": {"name": "list_dir"}},
        ],
        "tool_choice": "auto",
        "max_completion_tokens": 256,
        "temperature": 0.2,
        "top_p": 0.9,
        "stop": ["\n\nUser:"],
        "seed": 7,
        "stream": True,
        "stream_options": {"include_usage": True},
        "n": 1,
        "parallel_tool_calls": True,
        "logit_bias": {},
        "prompt_cache_key": "pck-1",
        "user": "alice",
        "some_future_field": {"x": 1},
    }
    body.update(overrides)
    return body


def test_chat_parses_realistic_request() -> None:
    conv = chat_api.parse_request(chat_body(), {"x-session-id": "s-1", "session-id": "s-2"})
    assert conv.model == MODEL and conv.stream
    assert conv.messages == (
        Message("system", "You are a coding agent."),
        Message("system", "Be terse."),
        Message("user", "Open\n\nmain.py"),
        Message("assistant", "", tool_calls=(CALL,)),
        Message("tool", "print('hi')", tool_call_id="call_1", name="read_file"),
        Message("user", "Thanks"),
    )
    assert conv.tools == (ToolSpec("read_file", "Read a file.", READ_SCHEMA), ToolSpec("list_dir"))
    assert conv.tool_choice == "auto"
    p = conv.params
    assert (p.max_tokens, p.temperature, p.top_p, p.stop, p.seed) == (256, 0.2, 0.9, ("\n\nUser:",), 7)
    h = conv.hints
    assert (h.x_session_id, h.session_id_header, h.prompt_cache_key, h.user) == ("s-1", "s-2", "pck-1", "alice")
    assert chat_api.stream_include_usage(chat_body())
    assert not chat_api.stream_include_usage(chat_body(stream_options=None))


def test_chat_defaults_and_variants() -> None:
    conv = chat_api.parse_request({"messages": [{"role": "user", "content": "hi"}], "max_tokens": 5, "stop": "END"}, {})
    assert conv.params.max_tokens == 5 and conv.params.stop == ("END",) and conv.params.temperature == 0.8
    assert conv.tool_choice is None and not conv.stream and conv.model == ""
    named = chat_body(tool_choice={"type": "function", "function": {"name": "list_dir"}})
    assert chat_api.parse_request(named, {}).tool_choice == {"name": "list_dir"}
    hints = chat_api.parse_request(chat_body(), {"session_id": "s-3"}).hints
    assert hints.session_id_header == "s-3"


def _chat_msgs(*extra: dict[str, Any]) -> dict[str, Any]:
    return chat_body(messages=[{"role": "user", "content": "hi"}, *extra])


CHAT_INVALID: list[tuple[object, str, str | None]] = [
    ([], "must be a JSON object", None),
    ({"model": MODEL}, "Missing required parameter: 'messages'", "messages"),
    (chat_body(messages=[]), "at least 1 item", "messages"),
    (chat_body(messages="hi"), "valid list", "messages"),
    (chat_body(messages=["hi"]), "valid dictionary", "messages[0]"),
    (chat_body(messages=[{"content": "hi"}]), "Missing required parameter: 'messages[0].role'", "messages[0].role"),
    (chat_body(messages=[{"role": "robot", "content": "hi"}]), "unknown role 'robot'", "messages[0].role"),
    (chat_body(messages=[{"role": "function", "content": "hi", "name": "f"}]), "unknown role", "messages[0].role"),
    (chat_body(messages=[{"role": "user"}]), "Missing required parameter", "messages[0].content"),
    (chat_body(messages=[{"role": "user", "content": 42}]), "expected a string or an array", "messages[0].content"),
    (chat_body(messages=[{"role": "user", "content": [{"type": "text", "text": 5}]}]), "expected a string", None),
    (chat_body(messages=[{"role": "user", "content": ["hi"]}]), "expected an object", "messages[0].content[0]"),
    (chat_body(messages=[{"role": "user", "content": [{"image_url": {"url": "x"}}]}]), "Missing required parameter",
     "messages[0].content[0].type"),
    (_chat_msgs({"role": "assistant"}), "required unless 'tool_calls'", "messages[1].content"),
    (_chat_msgs({"role": "assistant", "content": None, "tool_calls": [{"id": "c", "type": "function"}]}),
     "Missing required parameter: 'messages[1].tool_calls[0].function'", None),
    (_chat_msgs({"role": "assistant", "content": None, "tool_calls": [{"id": "c", "function": {"name": "f", "arguments": {}}}]}),
     "valid string", "messages[1].tool_calls[0].function.arguments"),
    (_chat_msgs({"role": "tool", "content": "x"}), "Missing required parameter: 'messages[1].tool_call_id'", "messages[1].tool_call_id"),
    (_chat_msgs({"role": "tool", "tool_call_id": "nope", "content": "x"}), "does not match any tool call", "messages[1].tool_call_id"),
    (chat_body(tools=[{"type": "function", "function": {"description": "no name"}}]), "Missing required parameter", "tools[0].function.name"),
    (chat_body(tools=[{"type": "function", "function": {"name": ""}}]), "at least 1 character", "tools[0].function.name"),
    (chat_body(tools=[{"type": "custom", "function": {"name": "x"}}]), "unsupported tool type", "tools[0].type"),
    (chat_body(tools={"name": "x"}), "valid list", "tools"),
    (chat_body(tool_choice="sometimes"), "tool_choice", "tool_choice"),
    (chat_body(tool_choice={"type": "function", "function": {"name": "rm_rf"}}), "no tool named 'rm_rf'", "tool_choice"),
    (chat_body(tool_choice=3), "tool_choice", "tool_choice"),
    (chat_body(max_tokens=0), "greater than 0", "max_tokens"),
    (chat_body(max_tokens=-5), "greater than 0", "max_tokens"),
    (chat_body(max_tokens="100"), "valid integer", "max_tokens"),
    (chat_body(max_tokens=True), "valid integer", "max_tokens"),
    (chat_body(max_completion_tokens=0), "greater than 0", "max_completion_tokens"),
    (chat_body(temperature=2.5), "less than or equal to 2", "temperature"),
    (chat_body(temperature=-0.1), "greater than or equal to 0", "temperature"),
    (chat_body(temperature="hot"), "valid number", "temperature"),
    (chat_body(top_p=1.5), "less than or equal to 1", "top_p"),
    (chat_body(stop=["a", "b", "c", "d", "e"]), "at most 4", "stop"),
    (chat_body(stop=5), "string or an array of strings", "stop"),
    (chat_body(stop=["a", 1]), "string or an array of strings", "stop"),
    (chat_body(seed="x"), "valid integer", "seed"),
    (chat_body(stream="yes"), "valid boolean", "stream"),
    (chat_body(stream_options={"include_usage": "yes"}), "valid boolean", "stream_options.include_usage"),
    (chat_body(n=2), "only n=1", "n"),
    (chat_body(model=5), "valid string", "model"),
]


@pytest.mark.parametrize(("body", "message", "param"), CHAT_INVALID)
def test_chat_rejects_invalid(body: object, message: str, param: str | None) -> None:
    expect_400(lambda: chat_api.parse_request(body, {}), message, param)


def test_chat_nonstream_body_parses_in_sdk() -> None:
    conv = chat_api.parse_request(chat_body(stream=False), {})
    body = chat_output.complete_response(conv, "abc", 1700000000, "Hello", [], finished("stop"))
    got = openai_client(body).chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "x"}])
    assert isinstance(got, openai.types.chat.ChatCompletion)
    assert got.id == "chatcmpl-abc" and got.object == "chat.completion" and got.model == MODEL and got.created == 1700000000
    choice = got.choices[0]
    assert choice.message.role == "assistant" and choice.message.content == "Hello" and choice.message.tool_calls is None
    assert choice.finish_reason == "stop"
    assert got.usage is not None and (got.usage.prompt_tokens, got.usage.completion_tokens, got.usage.total_tokens) == (120, 7, 127)
    assert got.usage.prompt_tokens_details is not None and got.usage.prompt_tokens_details.cached_tokens == 80

    body = chat_output.complete_response(conv, "chatcmpl-x", 1, "", [CALL], finished("tool_calls"))
    assert body["id"] == "chatcmpl-x" and body["choices"][0]["message"]["content"] is None
    got = openai_client(body).chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "x"}])
    msg = got.choices[0].message
    assert got.choices[0].finish_reason == "tool_calls"
    assert msg.content is None and msg.tool_calls is not None
    assert (msg.tool_calls[0].id, msg.tool_calls[0].function.name, msg.tool_calls[0].function.arguments) == (
        "call_1", "read_file", ARGS_JSON)

    body = chat_output.complete_response(conv, "y", 1, "cut", [], finished("length"))
    assert body["choices"][0]["finish_reason"] == "length"


def test_chat_stream_accepted_by_sdk() -> None:
    conv = chat_api.parse_request(chat_body(), {})
    raw = encode(chat_output.StreamEncoder(conv, "abc", 1700000000, include_usage=True), TEXT_AND_CALL)
    assert raw.startswith(b": keep-alive\n\n") and raw.endswith(b"data: [DONE]\n\n")
    frames = [json.loads(d) for _, d in sse_events(raw) if d != "[DONE]"]
    assert frames[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    assert frames[-2]["choices"][0]["delta"] == {} and frames[-2]["choices"][0]["finish_reason"] == "tool_calls"
    assert frames[-1]["choices"] == [] and frames[-1]["usage"]["total_tokens"] == 127
    assert all(f["object"] == "chat.completion.chunk" and f["id"] == "chatcmpl-abc" for f in frames)

    chunks = list(openai_client(raw).chat.completions.create(model=MODEL, messages=[], stream=True))
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == "Let me look."
    assert chunks[-1].usage is not None and chunks[-1].usage.prompt_tokens_details.cached_tokens == 80  # type: ignore[union-attr]

    with openai_client(raw).chat.completions.stream(model=MODEL, messages=[]) as stream:
        final = stream.get_final_completion()
    msg = final.choices[0].message
    assert msg.content == "Let me look." and final.choices[0].finish_reason == "tool_calls"
    assert msg.tool_calls is not None
    assert [(c.id, c.function.name, c.function.arguments) for c in msg.tool_calls] == [
        ("call_1", "read_file", '{"path": "src/main.py"}'),
        ("call_2", "list_dir", "{}"),
    ]
    assert final.usage is not None and final.usage.completion_tokens == 7


def test_chat_stream_without_usage_and_mid_stream_error() -> None:
    conv = chat_api.parse_request(chat_body(), {})
    raw = encode(chat_output.StreamEncoder(conv, "abc", 1, include_usage=False), [TextDelta("hi"), finished()])
    frames = [json.loads(d) for _, d in sse_events(raw) if d != "[DONE]"]
    assert all(f["choices"] and "usage" not in f for f in frames)

    enc = chat_output.StreamEncoder(conv, "abc", 1)
    raw = encode(enc, [TextDelta("partial")]) + enc.error(ApiError(500, "engine crashed", "api_error"))
    assert raw.endswith(b"data: [DONE]\n\n")
    assert enc.feed(TextDelta("late")) == b""  # nothing after the closing frames
    with pytest.raises(openai.APIError, match="engine crashed"):
        list(openai_client(raw).chat.completions.create(model=MODEL, messages=[], stream=True))


# --------------------------------------------------------------------------------------------
# Anthropic Messages
# --------------------------------------------------------------------------------------------


def claude_code_body(**overrides: Any) -> dict[str, Any]:
    """Shaped like what Claude Code sends: cached system blocks, many tools, tool round trips."""
    tools = [
        {"name": f"Tool{i}", "description": f"Tool number {i}.", "input_schema": {"type": "object", "properties": {}}}
        for i in range(30)
    ]
    tools.append({"name": "Read", "description": "Read a file.", "input_schema": READ_SCHEMA, "cache_control": {"type": "ephemeral"}})
    tools.append({"type": "web_search_20250305", "name": "web_search", "max_uses": 5})
    body: dict[str, Any] = {
        "model": MODEL,
        "max_tokens": 32000,
        "system": [
            {"type": "text", "text": "You are Claude Code.", "cache_control": {"type": "ephemeral"}},
            {"type": "text", "text": "Working directory: /repo", "cache_control": {"type": "ephemeral"}},
        ],
        "messages": [
            {
                "role": "user",
                "content": [
                    {"type": "text", "text": "<system-reminder>ctx</system-reminder>"},
                    {"type": "text", "text": "Fix main.py", "cache_control": {"type": "ephemeral"}},
                ],
            },
            {
                "role": "assistant",
                "content": [
                    {"type": "thinking", "thinking": "hmm", "signature": "sig"},
                    {"type": "text", "text": "Reading it."},
                    {"type": "tool_use", "id": "toolu_1", "name": "Read", "input": ARGS},
                    {"type": "tool_use", "id": "toolu_2", "name": "Tool3", "input": {}},
                ],
            },
            {
                "role": "user",
                "content": [
                    {"type": "tool_result", "tool_use_id": "toolu_1", "content": "print('hi')"},
                    {
                        "type": "tool_result",
                        "tool_use_id": "toolu_2",
                        "content": [{"type": "text", "text": "boom"}, {"type": "text", "text": "trace"}],
                        "is_error": True,
                        "cache_control": {"type": "ephemeral"},
                    },
                    {"type": "text", "text": "Go on."},
                ],
            },
        ],
        "tools": tools,
        "tool_choice": {"type": "auto", "disable_parallel_tool_use": False},
        "metadata": {"user_id": "user_abc_account__session_123"},
        "temperature": 1,
        "thinking": {"type": "enabled", "budget_tokens": 1024},
        "stream": True,
        "context_management": {"edits": []},
    }
    body.update(overrides)
    return body


def test_anthropic_parses_claude_code_request() -> None:
    conv = messages_api.parse_request(claude_code_body(), {"x-claude-code-session-id": "cc-1"})
    assert conv.model == MODEL and conv.stream and conv.params.max_tokens == 32000 and conv.params.temperature == 1
    assert conv.messages == (
        Message("system", "You are Claude Code.\n\nWorking directory: /repo"),
        Message("user", "<system-reminder>ctx</system-reminder>\n\nFix main.py"),
        Message("assistant", "Reading it.", tool_calls=(ToolCall("toolu_1", "Read", ARGS_JSON), ToolCall("toolu_2", "Tool3", "{}"))),
        Message("tool", "print('hi')", tool_call_id="toolu_1", name="Read"),
        Message("tool", "[tool error]\nboom\n\ntrace", tool_call_id="toolu_2", name="Tool3", is_error=True),
        Message("user", "Go on."),
    )
    assert len(conv.tools) == 31 and conv.tools[-1] == ToolSpec("Read", "Read a file.", READ_SCHEMA)  # web_search dropped
    assert conv.tool_choice == "auto"
    assert conv.hints.claude_code_session_id == "cc-1" and conv.hints.metadata_user_id == "user_abc_account__session_123"


def test_anthropic_system_turns_inside_messages_as_claude_code_2_1_328_sends_them() -> None:
    """captures/claude/001 → 002: a role "system" reminder at messages[1], first as one text block
    with a cache marker, then as a plain string. Both parse to the same message, in place."""
    reminder = "<system-reminder>\nToday's date is 2026-12-05.\n</system-reminder>"
    first = _cc_messages({"role": "user", "content": "Use a sub-agent."},
                         {"role": "system", "content": [{"type": "text", "text": reminder,
                                                         "cache_control": {"type": "ephemeral"}}]})
    second = _cc_messages({"role": "user", "content": [{"type": "text", "text": "Use a sub-agent."}]},
                          {"role": "system", "content": reminder},
                          {"role": "assistant", "content": "Done."}, {"role": "user", "content": "Thanks"})
    before = messages_api.parse_request(first, {}).messages
    after = messages_api.parse_request(second, {}).messages
    assert before[1:] == (Message("user", "Use a sub-agent."), Message("system", reminder))
    assert after[: len(before)] == before
    for api, body in ((chat_api, chat_body(messages=[{"role": "user", "content": "a"}, {"role": "system", "content": "s"}])),
                      (responses_api, {"model": "m", "input": [{"role": "user", "content": "a"},
                                                               {"role": "system", "content": "s"}]})):
        assert api.parse_request(body, {}).messages[-2:] == (Message("user", "a"), Message("system", "s"))


def test_anthropic_variants() -> None:
    conv = messages_api.parse_request(
        {
            "max_tokens": 10,
            "system": "sys",
            "messages": [
                {"role": "user", "content": "hi"},
                {"role": "assistant", "content": [{"type": "tool_use", "id": "t1", "name": "Read", "input": {"a": "é"}}]},
                # Text before a result stays before it: blocks are placed in order.
                {"role": "user", "content": [{"type": "text", "text": "note"}, {"type": "tool_result", "tool_use_id": "t1"}]},
            ],
            "stop_sequences": ["STOP"],
            "tools": [{"name": "Read", "input_schema": READ_SCHEMA}],
            "tool_choice": {"type": "tool", "name": "Read"},
        },
        {},
    )
    assert conv.messages[0] == Message("system", "sys")
    assert conv.messages[2].tool_calls[0].arguments == '{"a": "é"}'
    assert conv.messages[3:] == (Message("user", "note"), Message("tool", "", tool_call_id="t1", name="Read"))
    assert conv.params.stop == ("STOP",) and conv.tool_choice == {"name": "Read"}
    assert messages_api.parse_request(claude_code_body(tool_choice={"type": "any"}), {}).tool_choice == "required"
    assert messages_api.parse_request(claude_code_body(tool_choice={"type": "none"}), {}).tool_choice == "none"
    # count_tokens: same body, max_tokens optional
    body = claude_code_body()
    del body["max_tokens"]
    counted = messages_api.parse_count_tokens_request(body, {})
    assert counted.messages == messages_api.parse_request(claude_code_body(), {}).messages
    expect_400(lambda: messages_api.parse_request(body, {}), "Missing required parameter: 'max_tokens'", "max_tokens")


def _cc_messages(*msgs: dict[str, Any]) -> dict[str, Any]:
    return claude_code_body(messages=list(msgs))


_USE = {"role": "assistant", "content": [{"type": "tool_use", "id": "t1", "name": "Read", "input": {}}]}

ANTHROPIC_INVALID: list[tuple[object, str, str | None]] = [
    ("{}", "must be a JSON object", None),
    (claude_code_body(max_tokens=0), "greater than 0", "max_tokens"),
    (claude_code_body(max_tokens=1.5), "valid integer", "max_tokens"),
    (claude_code_body(messages=[]), "at least 1 item", "messages"),
    (_cc_messages({"role": "robot", "content": "hi"}), "unknown role 'robot'", "messages.0.role"),
    (_cc_messages({"role": "system", "content": [{"type": "image"}]}), "unsupported content block type",
     "messages.0.content.0.type"),
    (_cc_messages({"role": "user", "content": 7}), "expected a string or an array", "messages.0.content"),
    (_cc_messages({"role": "user"}), "Missing required parameter: 'messages.0.content'", "messages.0.content"),
    (_cc_messages({"role": "user", "content": [{"type": "text"}]}), "Missing required parameter: 'messages.0.content.0.text'", None),
    (_cc_messages({"role": "user", "content": [{"type": "tool_use", "id": "t", "name": "n", "input": {}}]}),
     "in a user message", "messages.0.content.0.type"),
    (_cc_messages({"role": "user", "content": "x"}, {"role": "assistant", "content": [{"type": "tool_result", "tool_use_id": "t"}]}),
     "in an assistant message", "messages.1.content.0.type"),
    (_cc_messages({"role": "user", "content": [{"type": "tool_result", "tool_use_id": "ghost", "content": "x"}]}),
     "does not match any tool_use", "messages.0.content.0.tool_use_id"),
    (_cc_messages(_USE, {"role": "user", "content": [{"type": "tool_result", "content": "x"}]}),
     "Missing required parameter: 'messages.1.content.0.tool_use_id'", None),
    (_cc_messages(_USE, {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t1", "is_error": "yes"}]}),
     "valid boolean", "messages.1.content.0.is_error"),
    (_cc_messages({"role": "assistant", "content": [{"type": "tool_use", "id": "t", "name": "n", "input": "{}"}]}),
     "valid dictionary", "messages.0.content.0.input"),
    (claude_code_body(system=[{"type": "image"}]), "unsupported content block type 'image'", "system.0.type"),
    (claude_code_body(system=5), "expected a string or an array of text blocks", "system"),
    (claude_code_body(tools=[{"name": "x"}]), "Missing required parameter: 'tools.0.input_schema'", "tools.0.input_schema"),
    (claude_code_body(tools=[{"input_schema": {}}]), "Missing required parameter: 'tools.0.name'", "tools.0.name"),
    (claude_code_body(tool_choice={"type": "tool"}), "tool_choice.name", "tool_choice.name"),
    (claude_code_body(tool_choice={"type": "tool", "name": "Nope"}), "no tool named 'Nope'", "tool_choice.name"),
    (claude_code_body(tool_choice={"type": "maybe"}), "is not one of", "tool_choice.type"),
    (claude_code_body(temperature=1.5), "less than or equal to 1", "temperature"),
    (claude_code_body(top_p=-1), "greater than or equal to 0", "top_p"),
    (claude_code_body(stop_sequences="STOP"), "valid list", "stop_sequences"),
    (claude_code_body(stream=1), "valid boolean", "stream"),
]


@pytest.mark.parametrize(("body", "message", "param"), ANTHROPIC_INVALID)
def test_anthropic_rejects_invalid(body: object, message: str, param: str | None) -> None:
    expect_400(lambda: messages_api.parse_request(body, {}), message, param)


def _anthropic_create(body: dict[str, Any]) -> anthropic.types.Message:
    return anthropic_client(body).messages.create(model=MODEL, max_tokens=10, messages=[{"role": "user", "content": "x"}])


def test_anthropic_nonstream_body_parses_in_sdk() -> None:
    conv = messages_api.parse_request(claude_code_body(stream=False), {})
    body = messages_output.complete_response(conv, "abc", 1, "Reading.", [CALL], finished("tool_calls"))
    got = _anthropic_create(body)
    assert isinstance(got, anthropic.types.Message)
    assert got.id == "msg_abc" and got.type == "message" and got.role == "assistant" and got.model == MODEL
    assert [b.type for b in got.content] == ["text", "tool_use"]
    assert got.content[0].text == "Reading."  # type: ignore[union-attr]
    tool = got.content[1]
    assert tool.type == "tool_use" and (tool.id, tool.name, tool.input) == ("call_1", "read_file", ARGS)
    assert got.stop_reason == "tool_use" and got.stop_sequence is None
    u = got.usage
    assert (u.input_tokens, u.cache_read_input_tokens, u.cache_creation_input_tokens, u.output_tokens) == (40, 80, 0, 7)

    got = _anthropic_create(messages_output.complete_response(conv, "m", 1, "a", [], finished("stop", stop_seq="STOP")))
    assert got.stop_reason == "stop_sequence" and got.stop_sequence == "STOP"
    got = _anthropic_create(messages_output.complete_response(conv, "m", 1, "a", [], finished("length")))
    assert got.stop_reason == "max_tokens" and got.stop_sequence is None
    got = _anthropic_create(messages_output.complete_response(conv, "m", 1, "a", [], finished("stop")))
    assert got.stop_reason == "end_turn"
    bad = messages_output.complete_response(conv, "m", 1, "", [ToolCall("c", "f", "not json")], finished("tool_calls"))
    assert bad["content"] == [{"type": "tool_use", "id": "c", "name": "f", "input": {}}]


def test_anthropic_stream_accepted_by_sdk() -> None:
    conv = messages_api.parse_request(claude_code_body(), {})
    events = [*TEXT_AND_CALL[:-1], TextDelta("Done."), finished("tool_calls")]
    raw = encode(messages_output.StreamEncoder(conv, "abc", 1), events)
    frames = sse_events(raw)
    names = [n for n, _ in frames]
    assert names[:2] == ["ping", "message_start"] and names[2] == "ping" and names[-2:] == ["message_delta", "message_stop"]
    assert all(json.loads(d)["type"] == n for n, d in frames)
    start = json.loads(frames[1][1])["message"]
    assert start["content"] == [] and start["usage"]["input_tokens"] == 40 and start["usage"]["cache_read_input_tokens"] == 80
    opened = [json.loads(d)["index"] for n, d in frames if n == "content_block_start"]
    closed = [json.loads(d)["index"] for n, d in frames if n == "content_block_stop"]
    assert opened == closed == [0, 1, 2, 3]

    with anthropic_client(raw).messages.stream(model=MODEL, max_tokens=10, messages=[{"role": "user", "content": "x"}]) as stream:
        final = stream.get_final_message()
    assert [b.type for b in final.content] == ["text", "tool_use", "tool_use", "text"]
    assert final.content[0].text == "Let me look." and final.content[3].text == "Done."  # type: ignore[union-attr]
    assert final.content[1].input == ARGS and final.content[1].id == "call_1"  # type: ignore[union-attr]
    assert final.content[2].input == {} and final.content[2].name == "list_dir"  # type: ignore[union-attr]
    assert final.stop_reason == "tool_use" and final.id == "msg_abc"
    assert (final.usage.input_tokens, final.usage.cache_read_input_tokens, final.usage.output_tokens) == (40, 80, 7)

    raw = encode(messages_output.StreamEncoder(conv, "m", 1), [TextDelta("x STOP"), finished("stop", stop_seq="STOP")])
    with anthropic_client(raw).messages.stream(model=MODEL, max_tokens=10, messages=[]) as stream:
        final = stream.get_final_message()
    assert final.stop_reason == "stop_sequence" and final.stop_sequence == "STOP"


def test_anthropic_mid_stream_error() -> None:
    conv = messages_api.parse_request(claude_code_body(), {})
    enc = messages_output.StreamEncoder(conv, "abc", 1)
    raw = encode(enc, [TextDelta("partial")]) + enc.error(ApiError(529, "Overloaded", "overloaded_error"))
    name, data = sse_events(raw)[-1]
    assert name == "error" and json.loads(data) == {"type": "error", "error": {"type": "overloaded_error", "message": "Overloaded"}}
    with pytest.raises(anthropic.APIStatusError, match="Overloaded"):
        with anthropic_client(raw).messages.stream(model=MODEL, max_tokens=10, messages=[]) as stream:
            stream.get_final_message()


# --------------------------------------------------------------------------------------------
# OpenAI Responses
# --------------------------------------------------------------------------------------------


def codex_body(**overrides: Any) -> dict[str, Any]:
    """Shaped like what Codex CLI sends."""
    body: dict[str, Any] = {
        "model": MODEL,
        "instructions": "You are Codex.",
        "input": [
            {"type": "message", "role": "developer", "content": [{"type": "input_text", "text": "<permissions/>"}]},
            {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "<environment_context/>"}]},
            {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "Fix main.py"}]},
            {"type": "reasoning", "id": "rs_1", "summary": [], "encrypted_content": "xyz"},
            {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "Reading it."}]},
            {"type": "function_call", "id": "fc_1", "call_id": "call_1", "name": "shell", "arguments": '{"command":["ls"]}'},
            {"type": "function_call", "call_id": "call_2", "name": "read_file", "arguments": ARGS_JSON},
            {"type": "function_call_output", "call_id": "call_1", "output": "main.py"},
            {"type": "function_call_output", "call_id": "call_2", "output": [{"type": "input_text", "text": "print('hi')"}]},
            {"type": "custom_tool_call", "call_id": "call_3", "name": "apply_patch", "input": "*** Begin Patch"},
            {"role": "user", "content": "Go on."},
        ],
        "tools": [
            {"type": "function", "name": "shell", "description": "Run a command.", "strict": False,
             "parameters": {"type": "object", "properties": {"command": {"type": "array", "items": {"type": "string"}}}}},
            {"type": "function", "name": "read_file", "parameters": READ_SCHEMA},
            {"type": "web_search"},
            {"type": "custom", "name": "apply_patch", "format": {"type": "grammar"}},
        ],
        "tool_choice": "auto",
        "parallel_tool_calls": False,
        "reasoning": {"effort": "medium", "summary": "auto"},
        "store": False,
        "stream": True,
        "include": ["reasoning.encrypted_content"],
        "prompt_cache_key": "conv-42",
        "text": {"verbosity": "medium"},
    }
    body.update(overrides)
    return body


def test_responses_parses_codex_request() -> None:
    conv = responses_api.parse_request(codex_body(), {"session_id": "conv-42", "x-session-id": "s-9"})
    assert conv.model == MODEL and conv.stream
    assert conv.messages == (
        Message("system", "You are Codex."),
        Message("system", "<permissions/>"),
        Message("user", "<environment_context/>"),
        Message("user", "Fix main.py"),
        Message(
            "assistant",
            "Reading it.",
            tool_calls=(ToolCall("call_1", "shell", '{"command":["ls"]}'), ToolCall("call_2", "read_file", ARGS_JSON)),
        ),
        Message("tool", "main.py", tool_call_id="call_1", name="shell"),
        Message("tool", "print('hi')", tool_call_id="call_2", name="read_file"),
        Message("assistant", "", tool_calls=(ToolCall("call_3", "apply_patch", '{"input": "*** Begin Patch"}'),)),
        Message("user", "Go on."),
    )
    assert [t.name for t in conv.tools] == ["shell", "read_file", "apply_patch"] and conv.tool_choice == "auto"
    assert conv.parallel_tool_calls is False and conv.response_format is None
    h = conv.hints
    assert (h.session_id_header, h.prompt_cache_key, h.x_session_id) == ("conv-42", "conv-42", "s-9")
    assert responses_api.previous_response_id(codex_body()) is None
    assert responses_api.previous_response_id(codex_body(previous_response_id="resp_1")) == "resp_1"


def test_responses_variants() -> None:
    conv = responses_api.parse_request({"input": "hello", "max_output_tokens": 50, "temperature": 1.5}, {})
    assert conv.messages == (Message("user", "hello"),) and conv.params.max_tokens == 50 and conv.params.temperature == 1.5
    # An output for a call made in stored history (previous_response_id) is accepted, unnamed.
    conv = responses_api.parse_request(
        {"previous_response_id": "resp_1", "input": [{"type": "function_call_output", "call_id": "old", "output": "ok"}]}, {}
    )
    assert conv.messages == (Message("tool", "ok", tool_call_id="old"),)
    conv = responses_api.parse_request(codex_body(tool_choice={"type": "function", "name": "shell"}), {})
    assert conv.tool_choice == {"name": "shell"}
    assert responses_api.parse_request(codex_body(tool_choice={"type": "web_search"}), {}).tool_choice is None


def _codex_input(*items: Any) -> dict[str, Any]:
    return codex_body(input=list(items))


RESPONSES_INVALID: list[tuple[object, str, str | None]] = [
    (None, "must be a JSON object", None),
    ({"model": MODEL}, "Missing required parameter: 'input'", "input"),
    (codex_body(input=[]), "non-empty array", "input"),
    (codex_body(input=5), "non-empty array", "input"),
    (_codex_input("hi"), "expected an object", "input[0]"),
    (_codex_input({"type": "message", "role": "robot", "content": "x"}), "unknown role 'robot'", "input[0].role"),
    (_codex_input({"type": "message", "content": "x"}), "Missing required parameter: 'input[0].role'", "input[0].role"),
    (_codex_input({"role": "user"}), "Missing required parameter: 'input[0].content'", "input[0].content"),
    (_codex_input({"role": "user", "content": [{"type": "input_text"}]}), "expected a string", "input[0].content[0].text"),
    (_codex_input({"role": "user", "content": 3}), "expected a string or an array", "input[0].content"),
    (_codex_input({"type": "function_call", "name": "f", "arguments": "{}"}), "Missing required parameter: 'input[0].call_id'", None),
    (_codex_input({"type": "function_call", "call_id": "c", "name": "f", "arguments": {}}), "valid string", "input[0].arguments"),
    (_codex_input({"type": "function_call_output", "call_id": "c", "output": 5}), "expected a string or an array", "input[0].output"),
    (_codex_input({"type": "function_call_output", "output": "x"}), "Missing required parameter: 'input[0].call_id'", None),
    (codex_body(tools=[{"type": "function", "parameters": {}}]), "Missing required parameter: 'tools[0].name'", "tools[0].name"),
    (codex_body(tools=["shell"]), "valid dictionary", "tools[0]"),
    (codex_body(tool_choice="whatever"), "tool_choice", "tool_choice"),
    (codex_body(tool_choice={"type": "function", "name": "nope"}), "no function named 'nope'", "tool_choice"),
    (codex_body(max_output_tokens=0), "greater than 0", "max_output_tokens"),
    (codex_body(temperature=3), "less than or equal to 2", "temperature"),
    (codex_body(top_p="1"), "valid number", "top_p"),
    (codex_body(instructions=["x"]), "valid string", "instructions"),
    (codex_body(previous_response_id=5), "valid string", "previous_response_id"),
    (codex_body(store="no"), "valid boolean", "store"),
]


@pytest.mark.parametrize(("body", "message", "param"), RESPONSES_INVALID)
def test_responses_rejects_invalid(body: object, message: str, param: str | None) -> None:
    expect_400(lambda: responses_api.parse_request(body, {}), message, param)


def test_responses_nonstream_body_parses_in_sdk() -> None:
    conv = responses_api.parse_request(codex_body(stream=False), {})
    body = responses_output.complete_response(conv, "abc", 1700000000, "Reading.", [CALL], finished("tool_calls"))
    got = openai_client(body).responses.create(model=MODEL, input="x")
    assert isinstance(got, openai.types.responses.Response)
    assert got.id == "resp_abc" and got.object == "response" and got.status == "completed" and got.created_at == 1700000000
    assert got.model == MODEL and got.output_text == "Reading." and got.error is None and got.incomplete_details is None
    msg, call = got.output
    assert msg.type == "message" and msg.status == "completed" and msg.id.startswith("msg_")
    assert call.type == "function_call" and call.id is not None and call.id.startswith("fc_")
    assert (call.call_id, call.name, call.arguments, call.status) == ("call_1", "read_file", ARGS_JSON, "completed")
    u = got.usage
    assert u is not None and (u.input_tokens, u.output_tokens, u.total_tokens) == (120, 7, 127)
    assert u.input_tokens_details.cached_tokens == 80 and u.output_tokens_details.reasoning_tokens == 0
    assert [t.name for t in got.tools] == ["shell", "read_file", "apply_patch"] and got.tool_choice == "auto"  # type: ignore[union-attr]
    assert got.parallel_tool_calls is False  # codex_body sends parallel_tool_calls: false

    got = openai_client(responses_output.complete_response(conv, "x", 1, "cut", [], finished("length"))).responses.create(
        model=MODEL, input="x"
    )
    assert got.status == "incomplete" and got.incomplete_details is not None
    assert got.incomplete_details.reason == "max_output_tokens"


def test_responses_stream_accepted_by_sdk() -> None:
    conv = responses_api.parse_request(codex_body(), {})
    events = [*TEXT_AND_CALL[:-1], TextDelta("Done."), finished("tool_calls")]
    raw = encode(responses_output.StreamEncoder(conv, "abc", 1700000000), events)
    frames = sse_events(raw)
    datas = [json.loads(d) for _, d in frames]
    assert all(d["type"] == n for (n, _), d in zip(frames, datas))
    assert [d["sequence_number"] for d in datas] == list(range(len(datas)))
    assert [n for n, _ in frames] == [
        "response.created", "response.in_progress",
        "response.output_item.added", "response.content_part.added",
        "response.output_text.delta", "response.output_text.delta",
        "response.output_text.done", "response.content_part.done", "response.output_item.done",
        "response.output_item.added", "response.function_call_arguments.delta", "response.function_call_arguments.delta",
        "response.function_call_arguments.done", "response.output_item.done",
        "response.output_item.added", "response.function_call_arguments.delta",
        "response.function_call_arguments.done", "response.output_item.done",
        "response.output_item.added", "response.content_part.added", "response.output_text.delta",
        "response.output_text.done", "response.content_part.done", "response.output_item.done",
        "response.completed",
    ]

    types = [e.type for e in openai_client(raw).responses.create(model=MODEL, input="x", stream=True)]
    assert types == [n for n, _ in frames]

    with openai_client(raw).responses.stream(model=MODEL, input="x") as stream:
        final = stream.get_final_response()
    assert final.status == "completed" and final.id == "resp_abc"
    assert [o.type for o in final.output] == ["message", "function_call", "function_call", "message"]
    assert final.output_text == "Let me look.Done."
    calls = [o for o in final.output if o.type == "function_call"]
    assert [(c.call_id, c.name, c.arguments) for c in calls] == [
        ("call_1", "read_file", '{"path": "src/main.py"}'), ("call_2", "list_dir", "{}")]
    assert final.usage is not None and final.usage.input_tokens_details.cached_tokens == 80


def test_responses_incomplete_and_failed_streams() -> None:
    conv = responses_api.parse_request(codex_body(), {})
    raw = encode(responses_output.StreamEncoder(conv, "abc", 1), [TextDelta("cut"), finished("length")])
    with openai_client(raw).responses.stream(model=MODEL, input="x") as stream:
        final = stream.get_final_response()
    assert final.status == "incomplete" and final.incomplete_details is not None
    assert final.incomplete_details.reason == "max_output_tokens" and final.output[0].status == "incomplete"  # type: ignore[union-attr]

    enc = responses_output.StreamEncoder(conv, "abc", 1)
    raw = encode(enc, [TextDelta("partial")]) + enc.error(context_overflow(40000, 32768))
    events = list(openai_client(raw).responses.create(model=MODEL, input="x", stream=True))
    failed = events[-1]
    assert failed.type == "response.failed"
    assert failed.response.status == "failed" and failed.response.error is not None
    assert failed.response.error.code == "context_length_exceeded" and "prompt is too long" in failed.response.error.message
    assert [d["sequence_number"] for _, d in ((n, json.loads(d)) for n, d in sse_events(raw))] == list(range(len(events)))

    rate = responses_output.StreamEncoder(conv, "r", 1).error(ApiError(429, "slow down", "rate_limit_error"))
    assert json.loads(sse_events(rate)[-1][1])["response"]["error"] == {"code": "rate_limit_exceeded", "message": "slow down"}
    assert rate.startswith(b"event: response.created\n")  # the failure still follows a created event


# --------------------------------------------------------------------------------------------
# Property: whatever the engine emits, each SDK reassembles the same text and calls
# --------------------------------------------------------------------------------------------

_text = st.text(st.characters(codec="utf-8", exclude_categories=("Cs",)), min_size=1, max_size=12)
_call = st.builds(
    lambda name, value, ident: ToolCall(f"call_{ident}", name, json.dumps({"v": value})),
    st.sampled_from(["read_file", "shell", "list_dir"]),
    _text,
    st.integers(0, 10_000),
)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(texts=st.lists(_text, max_size=6), calls=st.lists(_call, max_size=3, unique_by=lambda c: c.id))
def test_streams_roundtrip_through_sdks(texts: list[str], calls: list[ToolCall]) -> None:
    events: list[Event] = [TextDelta(t) for t in texts]
    events += [ToolCallDelta(i, c) for i, c in enumerate(calls)]
    events.append(finished("tool_calls" if calls else "stop"))
    text = "".join(texts)
    expected_calls = [(c.id, c.name, c.arguments) for c in calls]

    conv = chat_api.parse_request(chat_body(), {})
    raw = encode(chat_output.StreamEncoder(conv, "a", 1), events)
    with openai_client(raw).chat.completions.stream(model=MODEL, messages=[]) as chat:
        msg = chat.get_final_completion().choices[0].message
    assert (msg.content or "") == text
    assert [(c.id, c.function.name, c.function.arguments) for c in msg.tool_calls or []] == expected_calls

    conv = messages_api.parse_request(claude_code_body(), {})
    raw = encode(messages_output.StreamEncoder(conv, "a", 1), events)
    with anthropic_client(raw).messages.stream(model=MODEL, max_tokens=1, messages=[]) as ant:
        final = ant.get_final_message()
    assert "".join(b.text for b in final.content if b.type == "text") == text
    assert [(b.id, b.name, json.dumps(b.input)) for b in final.content if b.type == "tool_use"] == expected_calls

    conv = responses_api.parse_request(codex_body(), {})
    raw = encode(responses_output.StreamEncoder(conv, "a", 1), events)
    with openai_client(raw).responses.stream(model=MODEL, input="x") as resp:
        out = resp.get_final_response()
    assert out.output_text == text
    assert [(o.call_id, o.name, o.arguments) for o in out.output if o.type == "function_call"] == expected_calls


# --------------------------------------------------------------------------------------------
# One conversation, three wire formats, one neutral form
# --------------------------------------------------------------------------------------------


def test_same_conversation_through_all_three_apis() -> None:
    system, question, preface, result, follow_up = "Be helpful.", "Open main.py", "Let me look.", "print('hi')", "Thanks"
    description = "Read a file."

    chat = {
        "model": MODEL,
        "messages": [
            {"role": "system", "content": system},
            {"role": "user", "content": question},
            {"role": "assistant", "content": preface, "tool_calls": [
                {"id": "call_1", "type": "function", "function": {"name": "read_file", "arguments": ARGS_JSON}}]},
            {"role": "tool", "tool_call_id": "call_1", "content": result},
            {"role": "user", "content": follow_up},
        ],
        "tools": [{"type": "function", "function": {"name": "read_file", "description": description, "parameters": READ_SCHEMA}}],
    }
    messages = {
        "model": MODEL,
        "max_tokens": 100,
        "system": [{"type": "text", "text": system, "cache_control": {"type": "ephemeral"}}],
        "messages": [
            {"role": "user", "content": question},
            {"role": "assistant", "content": [
                {"type": "text", "text": preface},
                {"type": "tool_use", "id": "call_1", "name": "read_file", "input": ARGS}]},
            {"role": "user", "content": [
                {"type": "tool_result", "tool_use_id": "call_1", "content": result},
                {"type": "text", "text": follow_up}]},
        ],
        "tools": [{"name": "read_file", "description": description, "input_schema": READ_SCHEMA}],
    }
    responses = {
        "model": MODEL,
        "instructions": system,
        "input": [
            {"type": "message", "role": "user", "content": [{"type": "input_text", "text": question}]},
            {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": preface}]},
            {"type": "function_call", "call_id": "call_1", "name": "read_file", "arguments": ARGS_JSON},
            {"type": "function_call_output", "call_id": "call_1", "output": result},
            {"role": "user", "content": follow_up},
        ],
        "tools": [{"type": "function", "name": "read_file", "description": description, "parameters": READ_SCHEMA}],
    }
    convs: list[Conversation] = [
        chat_api.parse_request(copy.deepcopy(chat), {}),
        messages_api.parse_request(copy.deepcopy(messages), {}),
        responses_api.parse_request(copy.deepcopy(responses), {}),
    ]
    expected = (
        Message("system", system),
        Message("user", question),
        Message("assistant", preface, tool_calls=(ToolCall("call_1", "read_file", ARGS_JSON),)),
        Message("tool", result, tool_call_id="call_1", name="read_file"),
        Message("user", follow_up),
    )
    for conv in convs:
        assert conv.messages == expected
        assert conv.tools == (ToolSpec("read_file", description, READ_SCHEMA),)
        assert conv.model == MODEL
