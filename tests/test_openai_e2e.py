"""The official openai SDK against a live gateway on the real Gemma 3 270M engine.
Model: Gemma 3 270M Q4_K_M, the fast base model (fixture `model_path`).
"""

from __future__ import annotations

import json
import re
import uuid

import httpx
import openai
import pytest

from tests.conftest import Gateway

pytestmark = pytest.mark.engine


def client(gateway: Gateway, session: str | None = None) -> openai.OpenAI:
    headers = {"X-Session-Id": session} if session else None
    return openai.OpenAI(base_url=gateway.url + "/v1", api_key="unused", default_headers=headers, max_retries=0)


def test_models_and_health(gateway: Gateway) -> None:
    assert httpx.get(gateway.url + "/health").json()["status"] == "ok"
    models = client(gateway).models.list()
    assert [m.id for m in models.data] == ["pflash-local"]


def test_non_stream(gateway: Gateway) -> None:
    reply = client(gateway, str(uuid.uuid4())).chat.completions.create(
        model="pflash-local",
        messages=[{"role": "system", "content": "You are terse."}, {"role": "user", "content": "Name a color."}],
        max_tokens=8,
        temperature=0,
    )
    assert reply.choices[0].finish_reason in ("stop", "length")
    assert reply.choices[0].message.role == "assistant"
    assert isinstance(reply.choices[0].message.content, str)
    assert reply.usage is not None
    assert reply.usage.prompt_tokens > 5
    assert 0 < reply.usage.completion_tokens <= 8
    assert reply.usage.total_tokens == reply.usage.prompt_tokens + reply.usage.completion_tokens


def test_stream_with_usage(gateway: Gateway) -> None:
    stream = client(gateway, str(uuid.uuid4())).chat.completions.create(
        model="pflash-local",
        messages=[{"role": "user", "content": [{"type": "text", "text": "Count: one, two,"}]}],
        max_tokens=12,
        temperature=0,
        stream=True,
        stream_options={"include_usage": True},
    )
    chunks = list(stream)
    assert chunks[0].choices[0].delta.role == "assistant"
    finals = [c for c in chunks if c.choices and c.choices[0].finish_reason]
    assert len(finals) == 1 and finals[0].choices[0].finish_reason in ("stop", "length")
    usage_chunks = [c for c in chunks if c.usage is not None]
    assert len(usage_chunks) == 1 and usage_chunks[0].choices == []
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert usage_chunks[0].usage.completion_tokens >= 1
    assert text or usage_chunks[0].usage.completion_tokens == 1


def test_stream_headers_are_sse(gateway: Gateway) -> None:
    body = {"model": "m", "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2, "stream": True}
    with httpx.stream("POST", gateway.url + "/v1/chat/completions", json=body, timeout=60) as response:
        raw = b"".join(response.iter_bytes())
        assert response.headers["content-type"].startswith("text/event-stream")
        assert response.headers["cache-control"] == "no-cache"
        assert response.headers["x-accel-buffering"] == "no"
    assert raw.rstrip().endswith(b"data: [DONE]")


def test_second_turn_reuses_prefix(gateway: Gateway) -> None:
    c = client(gateway, "two-turn-" + uuid.uuid4().hex)
    history = [
        {"role": "system", "content": "You are a helpful assistant for a Python project. " * 8},
        {"role": "user", "content": "What does the function parse_args do in a typical CLI?"},
    ]
    first = c.chat.completions.create(model="m", messages=history, max_tokens=16, temperature=0)
    history += [
        {"role": "assistant", "content": first.choices[0].message.content or ""},
        {"role": "user", "content": "And what about main?"},
    ]
    second = c.chat.completions.create(model="m", messages=history, max_tokens=8, temperature=0)
    assert second.usage is not None and first.usage is not None
    cached = second.usage.prompt_tokens_details.cached_tokens  # type: ignore[union-attr]
    # Everything the first turn's prompt covered is reused, at least.
    assert cached >= first.usage.prompt_tokens - 1
    assert cached < second.usage.prompt_tokens


def test_tool_round_trip(gateway: Gateway) -> None:
    tools = [{
        "type": "function",
        "function": {
            "name": "read_file",
            "description": "Read a file from the repository",
            "parameters": {"type": "object", "properties": {"path": {"type": "string"}}, "required": ["path"]},
        },
    }]
    messages = [
        {"role": "user", "content": "Show me setup.py"},
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "call_abc123", "type": "function", "function": {"name": "read_file", "arguments": '{"path": "setup.py"}'}}
        ]},
        {"role": "tool", "tool_call_id": "call_abc123", "content": "from setuptools import setup\nsetup(name='demo')"},
    ]
    reply = client(gateway, str(uuid.uuid4())).chat.completions.create(
        model="m", messages=messages, tools=tools, max_tokens=24, temperature=0
    )
    choice = reply.choices[0]
    assert choice.finish_reason in ("stop", "length", "tool_calls")
    if choice.finish_reason == "tool_calls":
        for call in choice.message.tool_calls or []:
            assert re.fullmatch(r"[a-zA-Z0-9_-]+", call.id)
            json.loads(call.function.arguments)
    # The tool result reached the model: the prompt is longer than without it.
    without = client(gateway, str(uuid.uuid4())).chat.completions.create(
        model="m", messages=messages[:1], tools=tools, max_tokens=1, temperature=0
    )
    assert reply.usage.prompt_tokens > without.usage.prompt_tokens + 15  # type: ignore[union-attr]


def test_disconnect_mid_stream_then_normal_request(gateway: Gateway) -> None:
    session = "disconnect-" + uuid.uuid4().hex
    body = {"model": "m", "messages": [{"role": "user", "content": "Write a long story about a robot."}],
            "max_tokens": 400, "temperature": 0.7, "stream": True}
    with httpx.stream("POST", gateway.url + "/v1/chat/completions", json=body,
                      headers={"X-Session-Id": session}, timeout=60) as response:
        for i, _line in enumerate(response.iter_lines()):
            if i >= 4:
                break  # leave mid-stream
    reply = client(gateway, session).chat.completions.create(
        model="m", messages=[{"role": "user", "content": "Hello"}], max_tokens=4, temperature=0
    )
    assert reply.choices[0].finish_reason in ("stop", "length")
    assert httpx.get(gateway.url + "/health").status_code == 200


BAD_BODIES: list[tuple[str, bytes, int]] = [
    ("malformed json", b'{"model": "m", "messages": [', 400),
    ("not an object", b"[1, 2, 3]", 400),
    ("wrong type for messages", b'{"model": "m", "messages": "hello"}', 400),
    ("empty messages", b'{"model": "m", "messages": []}', 400),
    ("unknown role", b'{"model": "m", "messages": [{"role": "wizard", "content": "hi"}]}', 400),
    ("tool without its call", b'{"model": "m", "messages": [{"role": "user", "content": "x"}, '
                              b'{"role": "tool", "tool_call_id": "call_nope", "content": "r"}]}', 400),
    ("wrong type for max_tokens", b'{"model": "m", "messages": [{"role": "user", "content": "x"}], "max_tokens": "many"}', 400),
    ("non-utf8", b'{"model": "m", "messages": [{"role": "user", "content": "\xff\xfe"}]}', 400),
]


@pytest.mark.parametrize(("name", "raw", "status"), BAD_BODIES, ids=[b[0] for b in BAD_BODIES])
def test_bad_input_gets_openai_error(gateway: Gateway, name: str, raw: bytes, status: int) -> None:
    response = httpx.post(gateway.url + "/v1/chat/completions", content=raw,
                          headers={"Content-Type": "application/json"}, timeout=30)
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert error["type"] == "invalid_request_error" and error["message"]


def test_oversized_body_is_413(gateway: Gateway) -> None:
    huge = {"model": "m", "messages": [{"role": "user", "content": "x" * (2 * 1024 * 1024)}]}
    response = httpx.post(gateway.url + "/v1/chat/completions", json=huge, timeout=30)
    assert response.status_code == 413
    assert response.json()["error"]["type"] == "request_too_large"
    assert httpx.get(gateway.url + "/health").status_code == 200


def test_context_overflow_is_400_before_any_work(gateway: Gateway) -> None:
    words = " ".join(f"word{i}" for i in range(3000))  # well past the 4096-token test context
    with pytest.raises(openai.BadRequestError) as info:
        client(gateway).chat.completions.create(model="m", messages=[{"role": "system", "content": words}, {"role": "user", "content": "hi"}], max_tokens=4)
    assert info.value.code == "context_length_exceeded"
    assert info.value.body["type"] == "invalid_request_error"  # type: ignore[index]


def test_an_answer_looping_on_one_line_ends_as_a_stop(start_gateway) -> None:  # type: ignore[no-untyped-def]
    """Through the real engine: the base model shown a line forty times repeats one line; with
    repeated_line_stop 6 the answer ends after six of them, well inside max_tokens, as a stop."""
    server = start_gateway("--repeated-line-stop", "6")
    client = openai.OpenAI(base_url=server.url + "/v1", api_key="unused")
    reply = client.chat.completions.create(model="m", max_tokens=300, temperature=0,
                                           messages=[{"role": "user", "content": "ok\n" * 40}])
    assert reply.choices[0].finish_reason == "stop" and reply.usage is not None
    assert reply.usage.completion_tokens < 300
    lines = [line.strip() for line in (reply.choices[0].message.content or "").splitlines() if line.strip()]
    assert len(lines) >= 6 and len(set(lines[-6:])) == 1  # it stopped on the sixth of one line
    metrics = httpx.get(server.url + "/metrics", timeout=30).text
    assert "pflash_repetition_stops_total 1.0" in metrics
