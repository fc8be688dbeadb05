"""The official openai SDK's Responses API (what Codex CLI speaks) against a live gateway.
Model: Gemma 3 270M Q4_K_M, the fast base model (fixture `model_path`).
"""

from __future__ import annotations

import json
import re
import uuid
from typing import Any

import openai
import pytest

from gateway.response_history import ResponseHistory
from policies.conversation_types import Message
from sessions.identity import session_hash
from tests.conftest import Gateway

pytestmark = pytest.mark.engine

MODEL = "pflash-local"
INSTRUCTIONS = "You are a coding agent working in a Python repository. Answer briefly. " * 6
READ_TOOL = {
    "type": "function",
    "name": "read_file",
    "description": "Read a file from the repository",
    "parameters": {"type": "object", "properties": {"path": {"type": "string"}}, "required": ["path"]},
}


def client(gateway: Gateway) -> openai.OpenAI:
    return openai.OpenAI(base_url=gateway.url + "/v1", api_key="unused", max_retries=0)


def test_non_stream(gateway: Gateway) -> None:
    r = client(gateway).responses.create(model=MODEL, input="Name a color.", max_output_tokens=8, temperature=0)
    assert r.object == "response" and r.id.startswith("resp_")
    assert r.status in ("completed", "incomplete")
    assert isinstance(r.output_text, str)
    assert all(item.type == "message" for item in r.output)
    assert r.usage is not None
    assert r.usage.input_tokens > 5 and 0 < r.usage.output_tokens <= 8
    assert r.usage.total_tokens == r.usage.input_tokens + r.usage.output_tokens
    assert r.usage.input_tokens_details.cached_tokens >= 0


def test_stream_events(gateway: Gateway) -> None:
    events = list(client(gateway).responses.create(
        model=MODEL, input=[{"role": "user", "content": [{"type": "input_text", "text": "Count: one, two,"}]}],
        max_output_tokens=12, temperature=0, stream=True,
    ))
    names = [e.type for e in events]
    assert names[:2] == ["response.created", "response.in_progress"] and names[-1] == "response.completed"
    for needed in ("response.output_item.added", "response.content_part.added", "response.output_text.delta",
                   "response.output_text.done", "response.output_item.done"):
        assert needed in names
    assert [e.sequence_number for e in events] == list(range(len(events)))
    deltas = "".join(e.delta for e in events if e.type == "response.output_text.delta")  # type: ignore[union-attr]
    done = next(e for e in events if e.type == "response.output_text.done")
    assert done.text == deltas  # type: ignore[union-attr]
    final = events[-1].response  # type: ignore[union-attr]
    assert final.output_text == deltas
    assert final.usage.input_tokens > 5 and 0 < final.usage.output_tokens <= 12
    assert final.usage.input_tokens_details.cached_tokens >= 0


def call_items() -> list[dict[str, Any]]:
    return [
        {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "Show me setup.py"}]},
        {"type": "function_call", "call_id": "call_abc123", "name": "read_file", "arguments": '{"path": "setup.py"}'},
        {"type": "function_call_output", "call_id": "call_abc123",
         "output": "from setuptools import setup\nsetup(name='demo', version='1.0')"},
    ]


def test_function_call_round_trip(gateway: Gateway) -> None:
    c = client(gateway)
    r = c.responses.create(model=MODEL, input=call_items(), tools=[READ_TOOL], max_output_tokens=16, temperature=0)
    assert r.status in ("completed", "incomplete")
    for item in r.output:
        assert item.type in ("message", "function_call")
        if item.type == "function_call":
            assert re.fullmatch(r"[a-zA-Z0-9_-]+", item.call_id)
            json.loads(item.arguments)
    # The call and its output reached the model: the prompt is longer than without them.
    without = c.responses.create(model=MODEL, input=call_items()[:1], tools=[READ_TOOL], max_output_tokens=1, temperature=0)
    assert r.usage.input_tokens > without.usage.input_tokens + 15  # type: ignore[union-attr]


def test_instructions_reach_the_model(gateway: Gateway) -> None:
    c = client(gateway)
    plain = c.responses.create(model=MODEL, input="Hi", max_output_tokens=1, temperature=0)
    told = c.responses.create(model=MODEL, instructions=INSTRUCTIONS, input="Hi", max_output_tokens=1, temperature=0)
    assert told.usage.input_tokens > plain.usage.input_tokens + 50  # type: ignore[union-attr]


def test_prompt_cache_key_names_the_session(gateway: Gateway) -> None:
    c = client(gateway)
    key = "codex-" + uuid.uuid4().hex
    items: list[dict[str, Any]] = [{"role": "user", "content": "What does `def add(a, b): return a + b` do?"}]
    first = c.responses.with_raw_response.create(model=MODEL, instructions=INSTRUCTIONS, input=items,
                                                 prompt_cache_key=key, store=False, max_output_tokens=12, temperature=0)
    one = first.parse()
    # Codex with store=false resends everything: the earlier output items come back as input.
    items += [item.model_dump(exclude_none=True) for item in one.output]
    items.append({"role": "user", "content": "Is it pure?"})
    second = c.responses.with_raw_response.create(model=MODEL, instructions=INSTRUCTIONS, input=items,
                                                  prompt_cache_key=key, store=False, max_output_tokens=4, temperature=0)
    two = second.parse()
    # X-PFlash-Session is sha256(tenant, key)[:16]; no API keys here, so the tenant is "".
    assert first.headers["X-PFlash-Session"] == second.headers["X-PFlash-Session"] == session_hash("", key)[:16]
    assert one.usage is not None and two.usage is not None
    assert two.usage.input_tokens_details.cached_tokens >= one.usage.input_tokens - 1
    assert two.usage.input_tokens_details.cached_tokens < two.usage.input_tokens


def test_previous_response_id_continues(gateway: Gateway) -> None:
    c = client(gateway)
    question = f"Session {uuid.uuid4().hex[:8]}: what does `def add(a, b): return a + b` do?"
    one = c.responses.create(model=MODEL, instructions=INSTRUCTIONS, input=question, max_output_tokens=12, temperature=0)
    two = c.responses.create(model=MODEL, instructions=INSTRUCTIONS, input="Is it pure?",
                             previous_response_id=one.id, max_output_tokens=4, temperature=0)
    assert one.usage is not None and two.usage is not None
    # The stored history (question + reply) came first: the model read more than the new input...
    assert two.usage.input_tokens > one.usage.input_tokens + one.usage.output_tokens
    # ... and the engine already held it.
    assert two.usage.input_tokens_details.cached_tokens >= one.usage.input_tokens - 1
    # A chain: the third turn continues the second, in a stream.
    events = list(c.responses.create(model=MODEL, instructions=INSTRUCTIONS, input="Thanks.", previous_response_id=two.id,
                                     max_output_tokens=2, temperature=0, stream=True))
    final = events[-1]
    assert final.type == "response.completed"
    assert final.response.usage.input_tokens > two.usage.input_tokens  # type: ignore[union-attr]


def test_unknown_previous_response_id_is_a_clear_400(gateway: Gateway) -> None:
    with pytest.raises(openai.BadRequestError) as info:
        client(gateway).responses.create(model=MODEL, input="Hi", previous_response_id="resp_doesnotexist",
                                         max_output_tokens=2, stream=True)
    assert info.value.status_code == 400
    assert info.value.code == "previous_response_not_found"
    assert info.value.param == "previous_response_id"
    assert "resp_doesnotexist" in info.value.message


def test_store_false_works_and_is_not_kept(gateway: Gateway) -> None:
    c = client(gateway)
    r = c.responses.create(model=MODEL, input="Hi", store=False, max_output_tokens=2, temperature=0)
    assert r.status in ("completed", "incomplete")
    with pytest.raises(openai.BadRequestError) as info:
        c.responses.create(model=MODEL, input="Again", previous_response_id=r.id, max_output_tokens=2)
    assert info.value.code == "previous_response_not_found"


def test_overflow_is_context_length_exceeded(gateway: Gateway) -> None:
    words = " ".join(f"word{i}" for i in range(3000))  # far past the 4096-token test context
    with pytest.raises(openai.BadRequestError) as info:
        client(gateway).responses.create(model=MODEL, instructions=words, input="hi", max_output_tokens=2)
    assert info.value.code == "context_length_exceeded"


def test_history_is_bounded_and_scoped_by_tenant() -> None:
    history = ResponseHistory(capacity=2)
    convo = (Message("user", "hi"), Message("assistant", "hello"))
    for i in range(3):
        history.put("tenant-a", f"resp_{i}", convo)
    assert history.get("tenant-a", "resp_0") is None  # the oldest went first
    assert history.get("tenant-a", "resp_2") == convo
    assert history.get("tenant-b", "resp_2") is None  # never visible to another API key
    history.get("tenant-a", "resp_1")  # continuing a response keeps it ...
    history.put("tenant-a", "resp_3", convo)
    assert history.get("tenant-a", "resp_1") == convo  # ... while the least recently used goes
    assert history.get("tenant-a", "resp_2") is None
    assert len(history) == 2


def test_streamed_overflow_is_response_failed(gateway: Gateway) -> None:
    words = " ".join(f"word{i}" for i in range(3000))
    stream = client(gateway).responses.create(model=MODEL, instructions=words, input="hi", max_output_tokens=2,
                                              stream=True)
    events = list(stream)
    assert events[0].type == "response.created"
    failed = [e for e in events if e.type == "response.failed"]
    assert len(failed) == 1 and failed[0].response.error is not None
    assert failed[0].response.error.code == "context_length_exceeded"
