"""`--log-format json`: every line a JSON object, one `turn` line per request with the agreed
fields, and never the prompt text (nor the client's raw session key) unless debug logging is on.
Model: Gemma 3 270M Q4_K_M, the fast base model (fixture `model_path`).
"""

from __future__ import annotations

import json
import re
import uuid
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.conftest import Gateway

pytestmark = pytest.mark.engine

SECRET = "ZEBRA-" + uuid.uuid4().hex[:12]
TURN_FIELDS = {"event", "api", "session", "session_source", "tokens_in", "tokens_reused", "tokens_evaluated",
               "tokens_out", "finish", "seconds"}
COMPRESSION_FIELDS = {"compressed", "compression_reason", "scorer", "original_tokens", "kept_tokens", "scorer_seconds"}


def json_lines(server: Gateway) -> list[dict[str, Any]]:
    lines = [line for line in server.log().splitlines() if line.strip()]
    assert lines
    parsed = []
    for line in lines:
        record = json.loads(line)  # every line, not only ours: a stray print would break log shippers
        assert isinstance(record, dict) and {"ts", "level", "logger", "msg"} <= set(record), line
        parsed.append(record)
    return parsed


def traffic(server: Gateway, session_key: str) -> None:
    """One request of each kind: chat, stream, Anthropic, Responses, a compressed tool output, a 400."""
    headers = {"X-Session-Id": session_key}
    chat = [{"role": "user", "content": f"Remember the code word {SECRET}."}]
    assert httpx.post(server.url + "/v1/chat/completions", headers=headers, timeout=120,
                      json={"model": "m", "messages": chat, "max_tokens": 2, "temperature": 0}).status_code == 200
    with httpx.stream("POST", server.url + "/v1/chat/completions", headers=headers, timeout=120,
                      json={"model": "m", "messages": chat, "max_tokens": 2, "stream": True}) as response:
        assert response.status_code == 200 and b"[DONE]" in response.read()
    assert httpx.post(server.url + "/v1/messages", timeout=120,
                      json={"model": "m", "max_tokens": 2, "system": f"Secret: {SECRET}",
                            "messages": [{"role": "user", "content": "hi"}]}).status_code == 200
    assert httpx.post(server.url + "/v1/responses", timeout=120,
                      json={"model": "m", "input": f"Say {SECRET}", "max_output_tokens": 2}).status_code == 200
    tool_output = "\n".join(f"def handler_{i}(event):  # {SECRET}\n    return event.get('k{i}')" for i in range(80))
    compressed = httpx.post(server.url + "/v1/chat/completions", timeout=120, json={
        "model": "m", "max_tokens": 2, "temperature": 0,
        "messages": [
            {"role": "user", "content": "What does handler_7 return?"},
            {"role": "assistant", "content": None, "tool_calls": [
                {"id": "call_1", "type": "function", "function": {"name": "read_file", "arguments": "{}"}}]},
            {"role": "tool", "tool_call_id": "call_1", "content": tool_output},
        ]})
    assert compressed.status_code == 200 and compressed.headers["X-PFlash-Compressed"] == "true"
    bad = httpx.post(server.url + "/v1/chat/completions", timeout=30,
                     json={"model": "m", "messages": [{"role": "wizard", "content": SECRET}]})
    assert bad.status_code == 400


def test_json_logs_have_one_turn_line_per_request_and_no_prompt_text(tmp_path: Path, model_path: Path) -> None:
    server = Gateway(tmp_path / "store", model_path, "--log-format", "json", "--n-threads", "1")
    session_key = f"client-key-{SECRET}"
    try:
        traffic(server, session_key)
    finally:
        assert server.stop() == 0
    records = json_lines(server)
    text = server.log()
    assert SECRET not in text  # not the prompt, not the system text, not the raw session key

    turns = [r for r in records if r.get("event") == "turn"]
    assert sorted(r["api"] for r in turns) == ["anthropic", "openai", "openai", "openai", "responses"]
    for record in turns:
        assert TURN_FIELDS <= set(record), record
        assert re.fullmatch(r"[0-9a-f]{16}", record["session"])
        assert record["tokens_in"] == record["tokens_reused"] + record["tokens_evaluated"]
        assert record["tokens_out"] >= 1 and record["seconds"] >= 0
    chat_turns = [r for r in turns if r["session_source"] == "x-session-id"]
    assert len(chat_turns) == 2 and chat_turns[0]["session"] == chat_turns[1]["session"]
    assert chat_turns[1]["tokens_reused"] > 0  # the stream reused the first turn's prefix
    compressed = [r for r in turns if r.get("compressed")]
    assert len(compressed) == 1 and COMPRESSION_FIELDS <= set(compressed[0])
    assert compressed[0]["kept_tokens"] < compressed[0]["original_tokens"]
    assert any(r["level"] == "info" and "400" in r["msg"] for r in records)  # the bad request, without its text


def test_debug_logging_adds_the_prompt(tmp_path: Path, model_path: Path) -> None:
    server = Gateway(tmp_path / "store", model_path, "--log-format", "json", "--log-level", "debug", "--n-threads", "1")
    try:
        reply = httpx.post(server.url + "/v1/chat/completions", timeout=120, json={
            "model": "m", "max_tokens": 1, "messages": [{"role": "user", "content": f"Code word {SECRET}"}]})
        assert reply.status_code == 200
    finally:
        server.stop()
    records = json_lines(server)
    with_secret = [r for r in records if SECRET in json.dumps(r)]
    assert with_secret and all(r["level"] == "debug" for r in with_secret)
