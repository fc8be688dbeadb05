"""Request limits against a live gateway, each answered in the client's own API shape:
per-key concurrency (429 + Retry-After), a full engine queue (503 + Retry-After), too many
messages (400), a body over the size limit (413).
Model: Gemma 3 270M Q4_K_M, the fast base model (fixture `model_path`).
"""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.conftest import Gateway
from tests.metrics_util import scrape, value

pytestmark = pytest.mark.engine

MAX_BODY_BYTES = int(0.05 * 1024 * 1024)


@pytest.fixture(scope="module")
def limited(tmp_path_factory: pytest.TempPathFactory, model_path: Path) -> Iterator[Gateway]:
    server = Gateway(tmp_path_factory.mktemp("limits") / "store", model_path,
                     "--api-keys", "k1,k2", "--per-key-concurrency", "1", "--queue-size", "1",
                     "--max-messages", "4", "--max-body-mb", "0.05", "--threshold", "100000", "--n-threads", "1")
    yield server
    server.stop()


def key(k: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {k}"}


def openai_error(response: httpx.Response, status: int, kind: str) -> dict[str, Any]:
    assert response.status_code == status, response.text
    body = response.json()
    assert set(body) == {"error"} and body["error"]["type"] == kind and body["error"]["message"]
    return body["error"]  # type: ignore[no-any-return]


def anthropic_error(response: httpx.Response, status: int, kind: str) -> dict[str, Any]:
    assert response.status_code == status, response.text
    body = response.json()
    assert body["type"] == "error" and body["error"]["type"] == kind and body["error"]["message"]
    return body["error"]  # type: ignore[no-any-return]


def user_turns(n: int) -> list[dict[str, str]]:
    return [{"role": "user" if i % 2 == 0 else "assistant", "content": f"message {i}"} for i in range(n)]


def test_too_many_messages_is_400_per_api(limited: Gateway) -> None:
    chat = httpx.post(limited.url + "/v1/chat/completions", headers=key("k1"), timeout=30,
                      json={"model": "m", "messages": user_turns(5), "max_tokens": 1})
    assert openai_error(chat, 400, "invalid_request_error")["param"] == "messages"
    messages = httpx.post(limited.url + "/v1/messages", headers=key("k1"), timeout=30,
                          json={"model": "m", "max_tokens": 1, "messages": user_turns(5)})
    assert "too many messages" in anthropic_error(messages, 400, "invalid_request_error")["message"]
    responses = httpx.post(limited.url + "/v1/responses", headers=key("k1"), timeout=30,
                           json={"model": "m", "max_output_tokens": 1, "input": user_turns(5)})
    openai_error(responses, 400, "invalid_request_error")
    at_limit = httpx.post(limited.url + "/v1/chat/completions", headers=key("k1"), timeout=60,
                          json={"model": "m", "messages": user_turns(3), "max_tokens": 1, "temperature": 0})
    assert at_limit.status_code == 200, at_limit.text


def test_body_over_the_limit_is_413_per_api(limited: Gateway) -> None:
    big = "x" * (MAX_BODY_BYTES + 1024)
    chat = httpx.post(limited.url + "/v1/chat/completions", headers=key("k1"), timeout=30,
                      json={"model": "m", "messages": [{"role": "user", "content": big}]})
    openai_error(chat, 413, "request_too_large")
    messages = httpx.post(limited.url + "/v1/messages", headers={"x-api-key": "k2"}, timeout=30,
                          json={"model": "m", "max_tokens": 1, "messages": [{"role": "user", "content": big}]})
    anthropic_error(messages, 413, "request_too_large")
    assert httpx.get(limited.url + "/health", timeout=30).status_code == 200


def test_unauthenticated_big_body_is_401_not_read(limited: Gateway) -> None:
    big = "x" * (MAX_BODY_BYTES + 1024)
    response = httpx.post(limited.url + "/v1/messages", timeout=30,
                          json={"model": "m", "max_tokens": 1, "messages": [{"role": "user", "content": big}]})
    anthropic_error(response, 401, "authentication_error")


def long_prompt(words: int) -> list[dict[str, str]]:
    text = " ".join(f"item{i}" for i in range(words))  # about 3 tokens a word, never cached (fresh session)
    return [{"role": "system", "content": text}, {"role": "user", "content": "Which item comes first?"}]


def wait_for_queue_depth(server: Gateway, depth: float, worker: threading.Thread, timeout: float = 60) -> bool:
    deadline = time.time() + timeout
    while time.time() < deadline and worker.is_alive():
        if value(scrape(server.url), "pflash_queue_depth") >= depth:
            return True
        time.sleep(0.01)
    return False


def test_per_key_concurrency_429_and_full_queue_503_529(limited: Gateway) -> None:
    """While k1's long turn runs: k1 again → 429 (its one slot is taken); k2 → 503/529 (queue of one)."""
    outcome: dict[str, httpx.Response] = {}

    def slow_turn() -> None:
        outcome["slow"] = httpx.post(
            limited.url + "/v1/chat/completions", headers={**key("k1"), "X-Session-Id": uuid.uuid4().hex},
            json={"model": "m", "messages": long_prompt(400), "max_tokens": 1, "temperature": 0}, timeout=300)

    worker = threading.Thread(target=slow_turn)
    worker.start()
    try:
        assert wait_for_queue_depth(limited, 1, worker), "the long turn never reached the engine"
        busy_key = httpx.post(limited.url + "/v1/messages", headers={"x-api-key": "k1"}, timeout=30,
                              json={"model": "m", "max_tokens": 1, "messages": [{"role": "user", "content": "hi"}]})
        busy_stream = httpx.post(limited.url + "/v1/chat/completions", headers=key("k1"), timeout=30,
                                 json={"model": "m", "messages": [{"role": "user", "content": "hi"}],
                                       "max_tokens": 1, "stream": True})
        busy_count = httpx.post(limited.url + "/v1/messages/count_tokens", headers={"x-api-key": "k1"}, timeout=30,
                                json={"model": "m", "messages": [{"role": "user", "content": "hi"}]})
        full_queue = httpx.post(limited.url + "/v1/responses", headers=key("k2"), timeout=30,
                                json={"model": "m", "input": "hi", "max_output_tokens": 1})
        full_queue_anthropic = httpx.post(
            limited.url + "/v1/messages", headers={"x-api-key": "k2"}, timeout=30,
            json={"model": "m", "max_tokens": 1, "messages": [{"role": "user", "content": "hi"}]})
        still_running = worker.is_alive()
    finally:
        worker.join(300)
    assert still_running, "the long turn ended before the limits were probed: make it longer"
    anthropic_error(busy_key, 429, "rate_limit_error")
    anthropic_error(busy_count, 429, "rate_limit_error")  # counting takes a slot of the key too
    openai_error(busy_stream, 429, "rate_limit_error")
    # Busy in each API's own words: OpenAI 503 server_error/server_is_overloaded, Anthropic 529.
    assert openai_error(full_queue, 503, "server_error")["code"] == "server_is_overloaded"
    anthropic_error(full_queue_anthropic, 529, "overloaded_error")
    for response in (busy_key, busy_count, busy_stream, full_queue, full_queue_anthropic):
        assert int(response.headers["Retry-After"]) >= 1
    assert outcome["slow"].status_code == 200, outcome["slow"].text

    # The slot and the queue are free again, and the refusals were counted.
    again = httpx.post(limited.url + "/v1/messages", headers={"x-api-key": "k1"}, timeout=60,
                       json={"model": "m", "max_tokens": 1, "messages": [{"role": "user", "content": "hi"}]})
    assert again.status_code == 200, again.text
    samples = scrape(limited.url)
    assert value(samples, "pflash_requests_total", api="anthropic", status="429") >= 1
    assert value(samples, "pflash_requests_total", api="responses", status="503") >= 1
    assert value(samples, "pflash_queue_depth") == 0
