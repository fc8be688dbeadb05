"""An upstream that leaves a tool call in the text (llama-server did not read Qwen's bare JSON call)
still answers the client with a call: the text is read as the in-process engine reads its own
output, only when every call names an offered tool, and otherwise passed on as the text it was.
Model: none for the unit tests; Gemma 3 270M's vocabulary for the gateway's token counts.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anthropic
import openai
import pytest
from aiohttp import web
from hypothesis import given
from hypothesis import strategies as st

from engine.text_calls import TextCalls
from tests.conftest import Gateway, free_port, serve_in_thread

NAMES = ("read_file", "list_dir")
CALL = '{"name": "read_file", "arguments": {"path": "calc.py"}}'


def through(chunks: list[str], names: tuple[str, ...] = NAMES) -> tuple[str, str, list[tuple[str, str]]]:
    """(text passed on while streaming, text left at the end, calls)"""
    reader = TextCalls(names)
    streamed = "".join(reader.feed(c) for c in chunks)
    rest, calls = reader.finish()
    return streamed, rest, calls


def test_a_bare_json_call_and_a_tagged_one_become_calls() -> None:
    assert through(["  ", "{\"name\": \"read_", "file\", \"arguments\": {\"path\": \"calc.py\"}}"]) == (
        "", "", [("read_file", '{"path": "calc.py"}')])
    streamed, rest, calls = through(["Let me read it. <tool", "_call>" + CALL + "</tool_call>"])
    assert streamed == "Let me read it. " and calls == [("read_file", '{"path": "calc.py"}')]


def test_text_that_only_looks_like_a_call_stays_text() -> None:
    unknown = '{"name": "gitStatus", "arguments": {}}'
    assert through([unknown]) == ("", unknown, [])  # a tool that was not offered is no call
    assert through(['{"answer": 42}']) == ("", '{"answer": 42}', [])
    assert through(["a < b and [x] ", "are fine"]) == ("a < b and [x] are fine", "", [])


@given(st.lists(st.text(alphabet="ab<{[ _tool\"ly:", max_size=8), max_size=12))
def test_every_character_arrives_exactly_once(chunks: list[str]) -> None:
    streamed, rest, calls = through(chunks)
    if not calls:
        assert streamed + rest == "".join(chunks)


class TextCallUpstream:
    """An OpenAI-compatible upstream whose model writes its call as text, as llama-server relayed it."""

    def __init__(self) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}/v1"
        self.session_headers: list[str | None] = []  # what a session-affinity router would read

        async def models(request: web.Request) -> web.Response:
            return web.json_response({"data": [{"id": "m", "max_model_len": 4096}]})

        async def chat(request: web.Request) -> web.StreamResponse:
            self.session_headers.append(request.headers.get("X-Session-Id"))
            response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
            await response.prepare(request)
            for piece in (CALL[:20], CALL[20:]):
                chunk = {"choices": [{"index": 0, "delta": {"content": piece}, "finish_reason": None}]}
                await response.write(f"data: {json.dumps(chunk)}\n\n".encode())
            done = {"choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]}
            await response.write(f"data: {json.dumps(done)}\n\ndata: [DONE]\n\n".encode())
            return response

        app = web.Application()
        app.router.add_get("/v1/models", models)
        app.router.add_post("/v1/chat/completions", chat)
        serve_in_thread(app, self.port)


@pytest.fixture
def text_call_gateway(start_gateway: Any, model_path: Path) -> Iterator[tuple[Gateway, TextCallUpstream]]:
    upstream = TextCallUpstream()
    yield start_gateway("--engine", "upstream", "--upstream-url", upstream.url, "--tokenizer", str(model_path)), upstream


def test_the_client_gets_a_call_where_the_upstream_returned_its_text(
        text_call_gateway: tuple[Gateway, TextCallUpstream]) -> None:
    gateway, upstream = text_call_gateway
    tools = [{"type": "function", "function": {"name": "read_file", "parameters": {
        "type": "object", "properties": {"path": {"type": "string"}}}}}]
    client = openai.OpenAI(base_url=gateway.url + "/v1", api_key="unused", default_headers={"X-Session-Id": "s1"})
    reply = client.chat.completions.create(model="m", messages=[{"role": "user", "content": "Read calc.py"}],
                                           tools=tools)  # type: ignore[arg-type]
    choice = reply.choices[0]
    assert choice.finish_reason == "tool_calls" and not choice.message.content
    call = choice.message.tool_calls[0]  # type: ignore[index]
    assert call.function.name == "read_file" and json.loads(call.function.arguments) == {"path": "calc.py"}

    claude = anthropic.Anthropic(base_url=gateway.url, api_key="unused")
    with claude.messages.stream(model="m", max_tokens=64, messages=[{"role": "user", "content": "Read calc.py"}],
                                tools=[{"name": "read_file", "input_schema": {"type": "object"}}]) as stream:
        message = stream.get_final_message()
    assert message.stop_reason == "tool_use"
    (block,) = [b for b in message.content if b.type == "tool_use"]
    assert block.name == "read_file" and block.input == {"path": "calc.py"}

    plain = client.chat.completions.create(model="m", messages=[{"role": "user", "content": "Read calc.py"}])
    assert plain.choices[0].message.content == CALL  # no tools offered: the text is text
    # Each request carried its session's stable key, the same for one session's turns.
    assert all(h and len(h) == 32 for h in upstream.session_headers)
    assert upstream.session_headers[0] == upstream.session_headers[2] != upstream.session_headers[1]
