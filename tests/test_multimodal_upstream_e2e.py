"""Images in front of a multimodal upstream: with `--upstream-multimodal` the images clients send
(Chat `image_url`, Anthropic `image` blocks, also inside `tool_result`, Responses `input_image`)
reach the upstream as `image_url` parts where their placeholders stood; without it the upstream
sees the placeholders. The upstream here is a stand-in for a vision model (no such model is
installed): it records each request and answers with the number of images it was given, so the
answer the client reads depends on what was forwarded. The gateway, its tokenizer and the
official SDKs are real."""

from __future__ import annotations

import json
import uuid
from pathlib import Path
from typing import Any

import anthropic
import openai
import pytest
from aiohttp import web

from gateway.process import free_port
from tests.conftest import serve_in_thread

PNG = "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mP8/5+hHgAHggJ/PchI7wAAAABJRU5ErkJggg=="
DATA_URL = f"data:image/png;base64,{PNG}"


class VisionStandIn:
    """Answers "images: N" with N the image_url parts of the request; records every request."""

    def __init__(self) -> None:
        self.bodies: list[dict[str, Any]] = []
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        app = web.Application()
        app.router.add_get("/v1/models", self.models)
        app.router.add_post("/v1/chat/completions", self.chat)
        serve_in_thread(app, self.port)

    async def models(self, _request: web.Request) -> web.Response:
        return web.json_response({"data": [{"id": "vision-stand-in", "max_model_len": 4096}]})

    async def chat(self, request: web.Request) -> web.StreamResponse:
        body = await request.json()
        self.bodies.append(body)
        images = sum(1 for m in body["messages"] if isinstance(m["content"], list)
                     for p in m["content"] if p.get("type") == "image_url")
        text = f"images: {images}"
        usage = {"prompt_tokens": 10, "completion_tokens": 2, "total_tokens": 12}
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        for chunk in ({"choices": [{"index": 0, "delta": {"role": "assistant", "content": text}}]},
                      {"choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]},
                      {"choices": [], "usage": usage}):
            await response.write(f"data: {json.dumps(chunk)}\n\n".encode())
        await response.write(b"data: [DONE]\n\n")
        await response.write_eof()
        return response

    def image_urls(self, body: dict[str, Any]) -> list[str]:
        return [p["image_url"]["url"] for m in body["messages"] if isinstance(m["content"], list)
                for p in m["content"] if p.get("type") == "image_url"]


@pytest.fixture(scope="module")
def vision() -> VisionStandIn:
    return VisionStandIn()


def upstream_flags(vision: VisionStandIn, model_path: Path, *extra: str) -> tuple[str, ...]:
    return ("--engine", "upstream", "--upstream-url", vision.url + "/v1", "--tokenizer", str(model_path),
            "--upstream-n-ctx", "4096", *extra)


def test_chat_images_reach_a_multimodal_upstream_in_place(start_gateway, vision: VisionStandIn,  # type: ignore[no-untyped-def]
                                                          model_path: Path) -> None:
    server = start_gateway(*upstream_flags(vision, model_path, "--upstream-multimodal"))
    client = openai.OpenAI(base_url=server.url + "/v1", api_key="x", max_retries=0)
    session = {"X-Session-Id": "mm-" + uuid.uuid4().hex}
    messages: list[Any] = [{"role": "user", "content": [
        {"type": "text", "text": "What is in this screenshot?"},
        {"type": "image_url", "image_url": {"url": DATA_URL}},
        {"type": "text", "text": "Answer briefly."}]}]
    first = client.chat.completions.create(model="m", messages=messages, extra_headers=session)
    assert first.choices[0].message.content == "images: 1"
    sent = vision.bodies[-1]["messages"][-1]["content"]
    assert [p["type"] for p in sent] == ["text", "image_url", "text"]
    assert sent[1]["image_url"]["url"] == DATA_URL
    assert "What is in this screenshot?" in sent[0]["text"] and "Answer briefly." in sent[2]["text"]
    # The next turn of the session carries the image in its history: still forwarded, still a 200.
    messages += [{"role": "assistant", "content": "images: 1"}, {"role": "user", "content": "And now?"}]
    second = client.chat.completions.create(model="m", messages=messages, extra_headers=session)
    assert second.choices[0].message.content == "images: 1"
    assert vision.image_urls(vision.bodies[-1]) == [DATA_URL]


def test_anthropic_images_in_user_turns_and_tool_results(start_gateway, vision: VisionStandIn,  # type: ignore[no-untyped-def]
                                                         model_path: Path) -> None:
    server = start_gateway(*upstream_flags(vision, model_path, "--upstream-multimodal"))
    client = anthropic.Anthropic(base_url=server.url, api_key="x", max_retries=0)
    image = {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": PNG}}
    reply = client.messages.create(
        model="m", max_tokens=16,
        tools=[{"name": "Read", "description": "Read a file", "input_schema": {"type": "object", "properties": {}}}],
        messages=[
            {"role": "user", "content": [{"type": "text", "text": "Open the plot."}, image]},
            {"role": "assistant", "content": [{"type": "tool_use", "id": "toolu_1", "name": "Read", "input": {}}]},
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_1",
                                          "content": [{"type": "text", "text": "plot.png:"}, image]}]},
        ],
    )
    assert reply.content[0].text == "images: 2"  # type: ignore[union-attr]
    sent = vision.bodies[-1]["messages"]
    tool = next(m for m in sent if m["role"] == "tool")
    assert isinstance(tool["content"], str) and "[image: 1 attachment omitted, png" in tool["content"]
    after = sent[sent.index(tool) + 1]  # tool messages are text: its image follows as a user turn
    assert after["role"] == "user" and [p["type"] for p in after["content"]] == ["text", "image_url"]
    assert vision.image_urls(vision.bodies[-1]) == [DATA_URL, DATA_URL]


def test_responses_input_image_and_the_placeholder_without_the_flag(start_gateway, vision: VisionStandIn,  # type: ignore[no-untyped-def]
                                                                    model_path: Path, tmp_path: Path) -> None:
    request = [{"role": "user", "content": [{"type": "input_text", "text": "Describe it."},
                                            {"type": "input_image", "image_url": DATA_URL}]}]
    on = start_gateway(*upstream_flags(vision, model_path, "--upstream-multimodal"), store=tmp_path / "on")
    got = openai.OpenAI(base_url=on.url + "/v1", api_key="x", max_retries=0).responses.create(model="m", input=request)
    assert got.output_text == "images: 1"
    assert vision.image_urls(vision.bodies[-1]) == [DATA_URL]

    off = start_gateway(*upstream_flags(vision, model_path), store=tmp_path / "off")
    got = openai.OpenAI(base_url=off.url + "/v1", api_key="x", max_retries=0).responses.create(model="m", input=request)
    assert got.output_text == "images: 0"  # a text-only upstream reads the placeholder
    sent = vision.bodies[-1]["messages"][-1]["content"]
    assert isinstance(sent, str) and "[image: 1 attachment omitted, png, 70 B]" in sent
