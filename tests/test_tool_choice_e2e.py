"""tool_choice, parallel tool calls and structured output enforced on the real engine.

The small Gemma 3 270M base model never calls a tool on its own: every call seen here is the
grammar's doing, and every argument object is checked against its tool's schema.
"""

from __future__ import annotations

import asyncio
import json
import uuid
from pathlib import Path
from typing import Any

import anthropic
import jsonschema
import openai
import pytest

from tests.conftest import Gateway

pytestmark = pytest.mark.engine

TRIES = 20
# One call is about 40 tokens. The base model tends to go on with a second call when parallel calls
# are allowed; that one is cut at max_tokens and stays behind as text (see only_cut_off_call).
MAX_TOKENS = 60
WEATHER = {
    "type": "object",
    "properties": {
        "city": {"type": "string", "enum": ["Paris", "Lima", "Oslo"]},
        "days": {"type": "integer"},
        "note": {"type": "string", "maxLength": 8},
    },
    "required": ["city", "days", "note"],
}
CLOCK = {"type": "object", "properties": {"zone": {"type": "string", "enum": ["UTC", "CET"]}}, "required": ["zone"]}
SCHEMAS = {"get_weather": WEATHER, "get_time": CLOCK}
OPENAI_TOOLS = [{"type": "function", "function": {"name": name, "description": f"{name.replace('_', ' ')}",
                                                  "parameters": schema}} for name, schema in SCHEMAS.items()]
ANTHROPIC_TOOLS = [{"name": name, "description": name.replace("_", " "), "input_schema": schema}
                   for name, schema in SCHEMAS.items()]
# A conversation that invites a call: the model has called get_weather before, in the format the
# tool prompt asks for.
INVITING = [
    {"role": "system", "content": "Always answer by calling a tool."},
    {"role": "user", "content": "Weather in Oslo for 2 days?"},
    {"role": "assistant", "content": None, "tool_calls": [{"id": "call_1", "type": "function", "function": {
        "name": "get_weather", "arguments": json.dumps({"city": "Oslo", "days": 2, "note": "trip"})}}]},
    {"role": "tool", "tool_call_id": "call_1", "content": "Cold, 2 C."},
    {"role": "user", "content": "And Lima for 3 days?"},
]


def chat(gateway: Gateway) -> openai.OpenAI:
    return openai.OpenAI(base_url=gateway.url + "/v1", api_key="x", max_retries=0)


def assert_valid_call(name: str, arguments: str | dict[str, Any]) -> None:
    assert name in SCHEMAS, name
    args = json.loads(arguments) if isinstance(arguments, str) else arguments
    jsonschema.validate(args, SCHEMAS[name])


def only_cut_off_call(text: str | None, completion_tokens: int) -> bool:
    """No prose: the only text allowed beside the calls is a further call cut off by max_tokens."""
    cut = (text or "").strip()
    return not cut or (completion_tokens == MAX_TOKENS and (cut.startswith("<tool_call>") or "<tool_call>".startswith(cut)))


def forced_calls(gateway: Gateway, tool_choice: Any) -> list[list[Any]]:
    """The tool calls of TRIES seeded answers (temperature 0.8) under `tool_choice`."""
    results = []
    for seed in range(TRIES):
        reply = chat(gateway).chat.completions.create(
            model="m", messages=[{"role": "user", "content": "What is the weather like in Lima this week?"}],
            tools=OPENAI_TOOLS, tool_choice=tool_choice, max_tokens=MAX_TOKENS, temperature=0.8, seed=seed)
        choice = reply.choices[0]
        assert choice.finish_reason == "tool_calls", (seed, choice)
        assert reply.usage is not None and only_cut_off_call(choice.message.content, reply.usage.completion_tokens)
        results.append(choice.message.tool_calls or [])
    return results


def test_named_function_is_called_with_valid_arguments_every_time(gateway: Gateway) -> None:
    named = {"type": "function", "function": {"name": "get_weather"}}
    for calls in forced_calls(gateway, named):
        assert calls and all(c.function.name == "get_weather" for c in calls)
        for call in calls:
            assert_valid_call(call.function.name, call.function.arguments)


def test_required_yields_valid_calls_every_time(gateway: Gateway) -> None:
    for calls in forced_calls(gateway, "required"):
        assert len(calls) >= 1
        for call in calls:
            assert_valid_call(call.function.name, call.function.arguments)


def _calls_under(gateway: Gateway, tool_choice: str) -> int:
    """How many of TRIES answers call a tool or start to (16 tokens: a call opens, it need not end)."""
    answers_with_calls = 0
    for seed in range(TRIES):
        reply = chat(gateway).chat.completions.create(
            model="m", messages=INVITING, tools=OPENAI_TOOLS, tool_choice=tool_choice,  # type: ignore[arg-type]
            max_tokens=16, temperature=0.8, seed=seed)
        choice = reply.choices[0]
        if tool_choice == "none":
            assert choice.finish_reason in ("stop", "length") and isinstance(choice.message.content, str)
        answers_with_calls += bool(choice.message.tool_calls) or "<tool_call>" in (choice.message.content or "")
    return answers_with_calls


def test_none_yields_no_call_where_auto_would_call(gateway: Gateway) -> None:
    # The control: left to itself, the model copies the call in its history at least sometimes.
    assert _calls_under(gateway, "auto") >= 1
    assert _calls_under(gateway, "none") == 0


def test_anthropic_forced_tool_and_any(gateway: Gateway) -> None:
    claude = anthropic.Anthropic(base_url=gateway.url, api_key="x", max_retries=0)
    cities = ["Lima", "Paris", "Oslo", "Rome", "Quito"]
    for choice in ({"type": "tool", "name": "get_time"}, {"type": "any"}):
        for city in cities:
            message = claude.messages.create(
                model="m", max_tokens=MAX_TOKENS, tools=ANTHROPIC_TOOLS, tool_choice=choice,  # type: ignore[arg-type]
                messages=[{"role": "user", "content": f"What time is it in {city}?"}])
            assert message.stop_reason == "tool_use", message
            uses = [b for b in message.content if b.type == "tool_use"]
            text = "".join(b.text for b in message.content if b.type == "text")
            assert uses and only_cut_off_call(text, message.usage.output_tokens)
            for use in uses:
                assert_valid_call(use.name, use.input)  # type: ignore[arg-type]
                if choice["type"] == "tool":
                    assert use.name == "get_time"


def test_engine_enforces_single_call_and_json_schema(tmp_path: Path, model_path: Path) -> None:
    """Engine level (the adapters pass these fields after issue 13's API work): one call only
    with parallel_tool_calls=false, and a JSON answer valid against a response_format schema."""
    from engine.constraints import output_constraint
    from engine.llama_engine import LlamaEngine, LlamaOptions
    from policies.conversation_types import Finished, Message, SamplingParams, TextDelta, ToolCallDelta, ToolSpec

    engine = LlamaEngine(LlamaOptions(model_path=model_path, model_sha256="x", n_ctx=2048))
    tools = [ToolSpec(name, "", schema) for name, schema in SCHEMAS.items()]
    verdict = {"type": "object", "properties": {"answer": {"type": "string", "enum": ["yes", "no"]},
                                                "confidence": {"type": "integer"}},
               "required": ["answer", "confidence"]}

    async def answer(question: str, with_tools: list[ToolSpec], constraint: Any, seed: int) -> tuple[str, list[Any], Finished]:
        prompt = await engine.prepare([Message("user", question)], with_tools, constraint)
        text, calls, finished = "", [], None
        async for event in engine.stream("s", prompt, SamplingParams(max_tokens=MAX_TOKENS, temperature=0.8, seed=seed)):
            if isinstance(event, TextDelta):
                text += event.text
            elif isinstance(event, ToolCallDelta):
                calls.append(event.call)
            elif isinstance(event, Finished):
                finished = event
        assert finished is not None
        return text, calls, finished

    single = output_constraint("required", False, None, tools)
    structured = output_constraint(None, True, {"type": "json_schema", "name": "verdict", "schema": verdict}, ())

    async def run() -> None:
        for seed in range(TRIES):
            text, calls, finished = await answer("Weather and time in Paris?", tools, single, seed)
            assert finished.finish_reason == "tool_calls" and len(calls) == 1 and not text.strip(), (seed, text)
            assert_valid_call(calls[0].name, calls[0].arguments)
            text, calls, finished = await answer("Is Paris in France?", [], structured, seed)
            assert finished.finish_reason == "stop" and not calls, (seed, text)
            jsonschema.validate(json.loads(text), verdict)
        await engine.close()

    asyncio.run(run())


def test_unenforceable_choices_are_client_errors(gateway: Gateway) -> None:
    with pytest.raises(openai.BadRequestError) as caught:
        chat(gateway).chat.completions.create(model="m", messages=[{"role": "user", "content": "hi"}],
                                              tool_choice="required", max_tokens=4)
    assert caught.value.status_code == 400 and "tool" in str(caught.value)
    odd = [{"type": "function", "function": {"name": "odd", "parameters": {
        "type": "object", "properties": {"x": {"type": "frobnicate"}}}}}]
    with pytest.raises(openai.BadRequestError):
        chat(gateway).chat.completions.create(model="m", messages=[{"role": "user", "content": "hi"}],
                                              tools=odd, tool_choice="required", max_tokens=4)  # type: ignore[arg-type]
    session = str(uuid.uuid4())  # the session is fine afterwards
    reply = openai.OpenAI(base_url=gateway.url + "/v1", api_key="x", max_retries=0,
                          default_headers={"X-Session-Id": session}).chat.completions.create(
        model="m", messages=[{"role": "user", "content": "hi"}], max_tokens=2)
    assert reply.choices[0].finish_reason in ("stop", "length")


# --- upstream mode: the same fields reach an OpenAI-compatible server (llama_cpp.server) -------


def test_upstream_receives_tool_choice(upstream_gateway: Gateway) -> None:
    proxy = upstream_gateway.proxy
    assert proxy is not None
    question = [{"role": "user", "content": "What is the weather like in Lima this week?"}]
    named = {"type": "function", "function": {"name": "get_weather"}}
    reply = chat(upstream_gateway).chat.completions.create(
        model="m", messages=question, tools=OPENAI_TOOLS, tool_choice=named,  # type: ignore[arg-type]
        max_tokens=MAX_TOKENS, temperature=0)
    assert proxy.chat_bodies()[-1]["tool_choice"] == named
    # llama_cpp.server enforces a named function itself (a grammar from the tool's schema).
    calls = reply.choices[0].message.tool_calls or []
    assert [c.function.name for c in calls] == ["get_weather"]
    assert_valid_call(calls[0].function.name, calls[0].function.arguments)
    for choice in ("none", "required", "auto"):
        chat(upstream_gateway).chat.completions.create(
            model="m", messages=question, tools=OPENAI_TOOLS, tool_choice=choice,  # type: ignore[arg-type]
            max_tokens=4, temperature=0)
        sent = proxy.chat_bodies()[-1]
        assert sent.get("tool_choice") == (None if choice == "auto" else choice)  # "auto" is every server's default


def test_upstream_receives_parallel_flag_and_response_format(recording_proxy: Any) -> None:
    """Engine level, as for the in-process engine: the adapters pass these fields after the API work."""
    from engine.constraints import output_constraint
    from engine.upstream import UpstreamEngine, UpstreamOptions
    from policies.conversation_types import Message, SamplingParams, TextDelta, ToolSpec

    engine = UpstreamEngine(UpstreamOptions(base_url=recording_proxy.url + "/v1", n_ctx=4096),
                            count_tokens=lambda text: len(text) // 3, tokenizer_name="characters")
    tools = [ToolSpec(name, "", schema) for name, schema in SCHEMAS.items()]
    schema = {"type": "object", "properties": {"answer": {"type": "string"}}, "required": ["answer"]}

    async def answer(question: str, with_tools: list[ToolSpec], constraint: Any) -> str:
        prompt = await engine.prepare([Message("user", question)], with_tools, constraint)
        params = SamplingParams(max_tokens=24, temperature=0)
        return "".join([e.text async for e in engine.stream("s", prompt, params) if isinstance(e, TextDelta)])

    async def run() -> None:
        await engine.start()
        await answer("Weather in Lima?", tools, output_constraint("required", False, None, tools))
        sent = recording_proxy.chat_bodies()[-1]
        assert sent["tool_choice"] == "required" and sent["parallel_tool_calls"] is False
        text = await answer("Reply in JSON.", [], output_constraint(None, True, {"type": "json_object"}, ()))
        assert recording_proxy.chat_bodies()[-1]["response_format"] == {"type": "json_object"}
        assert text.lstrip().startswith("{")  # llama_cpp.server enforces json_object with its own grammar
        structured = output_constraint(None, True, {"type": "json_schema", "name": "a", "schema": schema}, ())
        # llama_cpp.server knows only "text" and "json_object": it refuses the standard json_schema
        # shape (vLLM, SGLang and llama.cpp's own server take it), so the same schema goes again in
        # its words, and its grammar then holds the answer to the schema.
        text = await answer("Reply in JSON.", [], structured)
        first, again = recording_proxy.chat_bodies()[-2:]
        assert first["response_format"] == {
            "type": "json_schema", "json_schema": {"name": "a", "schema": schema, "strict": False}}
        assert again["response_format"] == {"type": "json_object", "schema": schema}
        assert text.lstrip().startswith("{")
        assert engine.stats()["upstream_format_fallbacks"] == 1
        await engine.close()

    asyncio.run(run())
