"""engine = "upstream": the gateway in front of llama-cpp-python's own OpenAI server.
Model: Gemma 3 270M Q4_K_M, the fast base model (fixture `model_path`).
"""

from __future__ import annotations

import uuid

import anthropic
import httpx
import msgpack
import openai
import pytest

from tests.conftest import Gateway, free_port

pytestmark = pytest.mark.engine


def test_chat_and_stream_through_upstream(upstream_gateway: Gateway) -> None:
    client = openai.OpenAI(base_url=upstream_gateway.url + "/v1", api_key="x", max_retries=0)
    reply = client.chat.completions.create(model="m", messages=[{"role": "user", "content": "Say hi"}],
                                           max_tokens=6, temperature=0)
    assert reply.choices[0].finish_reason in ("stop", "length")
    assert reply.usage is not None and reply.usage.completion_tokens >= 1
    stream = client.chat.completions.create(model="m", messages=[{"role": "user", "content": "Count to three"}],
                                            max_tokens=6, temperature=0, stream=True,
                                            stream_options={"include_usage": True})
    chunks = list(stream)
    assert chunks[0].choices[0].delta.role == "assistant"
    assert any(c.usage is not None for c in chunks)
    assert upstream_gateway.proxy is not None
    sent = upstream_gateway.proxy.chat_bodies()[-1]
    assert sent["stream"] is True and sent["messages"][-1]["content"] == "Count to three"


def test_anthropic_and_responses_clients_through_upstream(upstream_gateway: Gateway) -> None:
    claude = anthropic.Anthropic(base_url=upstream_gateway.url, api_key="x", max_retries=0)
    message = claude.messages.create(model="m", max_tokens=6,
                                     system="Be brief.", messages=[{"role": "user", "content": "Hello"}])
    assert message.stop_reason in ("end_turn", "max_tokens")
    assert message.usage.output_tokens >= 1
    sent = upstream_gateway.proxy.chat_bodies()[-1]  # type: ignore[union-attr]
    assert sent["messages"][0] == {"role": "system", "content": "Be brief."}

    codex = openai.OpenAI(base_url=upstream_gateway.url + "/v1", api_key="x", max_retries=0)
    response = codex.responses.create(model="m", instructions="Be brief.", input="Hello there",
                                      max_output_tokens=6, temperature=0)
    assert response.status in ("completed", "incomplete")
    assert response.usage is not None and response.usage.output_tokens >= 1


def test_upstream_down_is_a_clear_503_or_529(start_gateway) -> None:  # type: ignore[no-untyped-def]
    dead = f"http://127.0.0.1:{free_port()}/v1"  # nothing listens there
    server = start_gateway("--engine", "upstream", "--upstream-url", dead, "--upstream-retries", "1",
                           "--upstream-n-ctx", "4096")
    body = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}
    chat = httpx.post(server.url + "/v1/chat/completions", json=body, timeout=60)
    assert chat.status_code == 503 and chat.headers["Retry-After"]
    assert chat.json()["error"]["type"] == "server_error" and chat.json()["error"]["code"] == "server_is_overloaded"
    streamed = httpx.post(server.url + "/v1/chat/completions", json={**body, "stream": True}, timeout=60)
    assert streamed.status_code == 503
    claude = httpx.post(server.url + "/v1/messages", json={**body, "max_tokens": 4}, timeout=60)
    assert claude.status_code == 529 and claude.json()["type"] == "error"  # Anthropic's overloaded status
    assert claude.json()["error"]["type"] == "overloaded_error"


def test_upstream_sessions_persist_without_kv(start_gateway, llama_server: str, model_path) -> None:  # type: ignore[no-untyped-def]
    server = start_gateway("--engine", "upstream", "--upstream-url", llama_server + "/v1", "--tokenizer",
                           str(model_path), "--upstream-n-ctx", "4096")
    session = "up-" + uuid.uuid4().hex
    body = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2, "temperature": 0}
    response = httpx.post(server.url + "/v1/chat/completions", json=body, headers={"X-Session-Id": session}, timeout=60)
    assert response.status_code == 200
    info = httpx.get(f"{server.url}/v1/sessions/{session}").json()
    assert info["tier"] == "none" and info["messages"] == 2
    # Written ahead of the response, while the server runs (not only at SIGTERM).
    stored = [p for p in (server.store / "sessions").glob("*/*") if p.is_dir()]
    assert len(stored) == 1 and (stored[0] / "meta.msgpack").exists() and not (stored[0] / "kv.zst").exists()
    meta = msgpack.unpackb((stored[0] / "meta.msgpack").read_bytes(), raw=False)
    assert len(meta["session"]["served_hashes"]) == 2
    assert server.stop() == 0
    assert not (stored[0] / "kv.zst").exists()
