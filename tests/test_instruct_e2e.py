"""Real answers and real tool calls, produced by the model itself, through each API and its
official SDK.

Model: Qwen2.5-Coder-0.5B-Instruct Q4_K_M (`instruct_model_path`, the served default), with Gemma
3 270M as the drafter of the fusion scorer: a drafter of another family than the served model.
The few tests here are the only ones that load the instruct model; prompts and max_tokens are small.

Each tool round trip sends the result back with one short user line after it (as Claude Code and
many agents do): given the bare result alone, this 0.5B model tends to repeat its call instead of
answering; with the line it answers from the result.
"""

from __future__ import annotations

import json
import re
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anthropic
import httpx
import jsonschema
import openai
import pytest

from tests.conftest import Gateway

pytestmark = [pytest.mark.engine, pytest.mark.instruct]

MODEL = "pflash-local"
WEATHER_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {"city": {"type": "string", "description": "The city name, e.g. Paris"}},
    "required": ["city"],
    "additionalProperties": False,
}
WEATHER_DESCRIPTION = "Get the current weather in a city."
QUESTION = "What is the weather in Paris right now?"
WEATHER_RESULT = json.dumps({"city": "Paris", "temperature_c": 21, "conditions": "sunny"})
FOLLOW_UP = "Thanks. So, what is the weather?"


@pytest.fixture(scope="module")
def instruct_gateway(tmp_path_factory: pytest.TempPathFactory, instruct_model_path: Path,
                     model_path: Path) -> Iterator[Gateway]:
    """Serves Qwen2.5-Coder-0.5B-Instruct; the fusion scorer's drafter is Gemma 3 270M."""
    server = Gateway(tmp_path_factory.mktemp("instruct") / "store", instruct_model_path, "--scorer", "fusion",
                     "--n-threads", "2", drafter=model_path)
    yield server
    server.stop()


def openai_client(gateway: Gateway) -> openai.OpenAI:
    return openai.OpenAI(base_url=gateway.url + "/v1", api_key="unused", max_retries=0,
                         default_headers={"X-Session-Id": "instruct-" + uuid.uuid4().hex})


def assert_weather_arguments(arguments: Any) -> None:
    """The model's own arguments validate against the tool's schema and name the city asked about."""
    jsonschema.validate(arguments, WEATHER_SCHEMA)
    assert "paris" in arguments["city"].lower()


def assert_final_answer(text: str | None) -> None:
    """Prose that uses the tool's result, without markup."""
    assert text and re.search(r"[A-Za-z]{3,}", text), text
    assert "<tool_call>" not in text and "<|im_" not in text, text
    assert "21" in text or "sunny" in text.lower(), text


def test_say_hi_gets_a_coherent_english_answer(instruct_gateway: Gateway) -> None:
    reply = openai_client(instruct_gateway).chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "Say hi"}], max_tokens=24, temperature=0)
    text = reply.choices[0].message.content or ""
    words = re.findall(r"[A-Za-z']+", text)
    assert len(words) >= 1 and any(w.lower() in {"hi", "hello", "hey"} for w in words), text
    assert sum(c.isascii() for c in text) >= 0.9 * len(text), text
    assert not re.search(r"<\|im_|\b(system|user|assistant)\b|Alibaba", text), text  # no template echo


def test_chat_completions_tool_call_and_result(instruct_gateway: Gateway) -> None:
    client = openai_client(instruct_gateway)
    tools = [{"type": "function", "function": {"name": "get_weather", "description": WEATHER_DESCRIPTION,
                                               "parameters": WEATHER_SCHEMA}}]
    messages: list[dict[str, Any]] = [{"role": "user", "content": QUESTION}]
    first = client.chat.completions.create(model=MODEL, messages=messages, tools=tools, max_tokens=48,
                                           temperature=0)
    choice = first.choices[0]
    assert choice.finish_reason == "tool_calls", choice
    assert choice.message.tool_calls and len(choice.message.tool_calls) == 1
    call = choice.message.tool_calls[0]
    assert call.function.name == "get_weather"
    assert_weather_arguments(json.loads(call.function.arguments))

    messages += [choice.message.model_dump(exclude_none=True),
                 {"role": "tool", "tool_call_id": call.id, "content": WEATHER_RESULT},
                 {"role": "user", "content": FOLLOW_UP}]
    final = client.chat.completions.create(model=MODEL, messages=messages, tools=tools, max_tokens=40,
                                           temperature=0)
    assert final.choices[0].finish_reason in ("stop", "length")
    assert not final.choices[0].message.tool_calls
    assert_final_answer(final.choices[0].message.content)


def test_chat_completions_streamed_tool_call(instruct_gateway: Gateway) -> None:
    tools = [{"type": "function", "function": {"name": "get_weather", "description": WEATHER_DESCRIPTION,
                                               "parameters": WEATHER_SCHEMA}}]
    stream = openai_client(instruct_gateway).chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": QUESTION}], tools=tools, max_tokens=48, temperature=0,
        stream=True)
    names, arguments, finish = [], "", None
    for chunk in stream:
        if not chunk.choices:
            continue
        for delta_call in chunk.choices[0].delta.tool_calls or []:
            if delta_call.function and delta_call.function.name:
                names.append(delta_call.function.name)
            if delta_call.function and delta_call.function.arguments:
                arguments += delta_call.function.arguments
        finish = chunk.choices[0].finish_reason or finish
    assert names == ["get_weather"] and finish == "tool_calls"
    assert_weather_arguments(json.loads(arguments))


def test_anthropic_messages_tool_use_and_result(instruct_gateway: Gateway) -> None:
    client = anthropic.Anthropic(base_url=instruct_gateway.url, api_key="unused", max_retries=0,
                                 default_headers={"X-Session-Id": "instruct-" + uuid.uuid4().hex})
    tools = [{"name": "get_weather", "description": WEATHER_DESCRIPTION, "input_schema": WEATHER_SCHEMA}]
    messages: list[dict[str, Any]] = [{"role": "user", "content": QUESTION}]
    greedy = {"temperature": 0}  # this SDK release has no `temperature` argument; the wire field is honoured
    first = client.messages.create(model=MODEL, max_tokens=48, extra_body=greedy, tools=tools, messages=messages)
    assert first.stop_reason == "tool_use", first
    uses = [block for block in first.content if block.type == "tool_use"]
    assert len(uses) == 1 and uses[0].name == "get_weather"
    assert_weather_arguments(uses[0].input)

    messages += [{"role": "assistant", "content": [block.model_dump(exclude_none=True) for block in first.content]},
                 {"role": "user", "content": [{"type": "tool_result", "tool_use_id": uses[0].id,
                                               "content": WEATHER_RESULT},
                                              {"type": "text", "text": FOLLOW_UP}]}]
    final = client.messages.create(model=MODEL, max_tokens=40, extra_body=greedy, tools=tools, messages=messages)
    assert final.stop_reason in ("end_turn", "max_tokens")
    assert_final_answer("".join(block.text for block in final.content if block.type == "text"))


def test_responses_function_call_and_output(instruct_gateway: Gateway) -> None:
    client = openai_client(instruct_gateway)
    tools = [{"type": "function", "name": "get_weather", "description": WEATHER_DESCRIPTION,
              "parameters": WEATHER_SCHEMA}]
    first = client.responses.create(model=MODEL, input=QUESTION, tools=tools, max_output_tokens=48, temperature=0)
    calls = [item for item in first.output if item.type == "function_call"]
    assert len(calls) == 1 and calls[0].name == "get_weather", first.output
    assert_weather_arguments(json.loads(calls[0].arguments))

    final = client.responses.create(
        model=MODEL, tools=tools, max_output_tokens=40, temperature=0,
        input=[{"role": "user", "content": QUESTION},
               {"type": "function_call", "call_id": calls[0].call_id, "name": "get_weather",
                "arguments": calls[0].arguments},
               {"type": "function_call_output", "call_id": calls[0].call_id, "output": WEATHER_RESULT},
               {"role": "user", "content": FOLLOW_UP}])
    assert not [item for item in final.output if item.type == "function_call"]
    assert_final_answer(final.output_text)


def test_a_drafter_of_another_family_scores_a_long_tool_output(instruct_gateway: Gateway) -> None:
    """Qwen serves, Gemma drafts: units are scored as text, so no token id crosses between them."""
    from tests.test_compression_e2e import python_module, tool_conversation, transcript

    session = "instruct-" + uuid.uuid4().hex
    response = httpx.post(instruct_gateway.url + "/v1/chat/completions", timeout=300,
                          headers={"X-Session-Id": session},
                          json={"model": MODEL, "messages": tool_conversation(python_module()), "max_tokens": 4,
                                "temperature": 0})
    assert response.status_code == 200, response.text
    assert response.headers["X-PFlash-Scorer"] == "fusion"  # the drafter loaded: no fallback to bm25
    assert response.headers["X-PFlash-Compressed"] == "true"
    assert int(response.headers["X-PFlash-Kept-Tokens"]) < int(response.headers["X-PFlash-Original-Tokens"])
    served = transcript(instruct_gateway, session)[3]["content"]
    assert "def compute_invoice_total(items, tax_rate):" in served  # the relevant unit, as the drafter ranked it
