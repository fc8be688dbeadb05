"""Real client traffic, replayed: every request Claude Code 2.1.328 and Codex CLI 0.169.0 sent
(../shared/captures, see its README), in the order recorded, through a live gateway on the real
engine (Gemma 3 270M, compression threshold lowered).

One session id carries several conversations: the main agent, its sub-agents and side requests (a
title, Claude Code's safety classifier with a ~141K-character system prompt). Each must get a 2xx
in its API's own shape; each main-agent request after the first must find its whole previous
main-agent prompt cached however many sub-agent and side requests came between; and /metrics must
count no re-prefill of a conversation's last prompt. With one KV slot per session id (no
branches) a sub-agent's turn evicts the main agent's cache and the reuse assertion fails.

The captured bodies are sent as recorded, headers included (the masked key replaced), except
`max_tokens`, lowered so the model's answers stay short: the next captured request carries the
capture stub's answer, not the model's, so what the model said is rolled back either way.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.conftest import ROOT, Gateway

# Beside the checkout, as the evaluation data is; PFLASH_CAPTURES_DIR for a checkout elsewhere.
CAPTURES = Path(os.environ.get("PFLASH_CAPTURES_DIR") or ROOT.parent / "shared" / "captures")
ANSWER_TOKENS = 6
SKIPPED_HEADERS = {"host", "content-length", "accept-encoding", "authorization", "connection"}

pytestmark = [
    pytest.mark.engine,
    pytest.mark.timeout(1800),
    pytest.mark.skipif(not CAPTURES.is_dir(), reason=f"no captures at {CAPTURES} (../shared/captures beside the "
                                                      "checkout, or PFLASH_CAPTURES_DIR)"),
]


def captures() -> list[tuple[str, dict[str, Any]]]:
    """(name, capture) for every request, Claude Code's run first, each client in recorded order."""
    out = []
    for client in ("claude", "codex"):
        for path in sorted((CAPTURES / client).glob("*.json")):
            out.append((f"{client}/{path.stem}", json.loads(path.read_text())))
    return out


def conversation_key(capture: dict[str, Any]) -> tuple[str, str]:
    """(session, conversation) as the client named them: the main agent, a sub-agent by its id."""
    headers = {k.lower(): v for k, v in capture["headers"].items()}
    session = headers.get("x-claude-code-session-id") or headers.get("session-id") or ""
    agent = headers.get("x-claude-code-agent-id") or ("" if headers.get("thread-id") == session
                                                       else headers.get("thread-id", ""))
    return session, agent


def replay(client: httpx.Client, capture: dict[str, Any]) -> tuple[httpx.Response, dict[str, Any] | None]:
    """Send one capture; the response and its usage (the final SSE event's, when streamed)."""
    headers = {k: v for k, v in capture["headers"].items() if k.lower() not in SKIPPED_HEADERS}
    headers["Authorization"] = "Bearer unused"
    body = capture["body"]
    if body is not None:
        body = dict(body)
        body["max_output_tokens" if capture["path"] == "/v1/responses" else "max_tokens"] = ANSWER_TOKENS
    request = client.build_request(capture["method"], capture["raw_path"], headers=headers,
                                   content=None if body is None else json.dumps(body))
    response = client.send(request, stream=True)
    try:
        raw = response.read()
    finally:
        response.close()
    if body is None or response.status_code >= 300:
        return response, None
    if not body.get("stream"):
        return response, json.loads(raw)["usage"]
    events = [json.loads(line[6:]) for line in raw.decode().splitlines() if line.startswith("data: ")]
    final = events[-1]
    if capture["path"] == "/v1/responses":
        assert final["type"] == "response.completed", final
        return response, final["response"]["usage"]
    assert [e["type"] for e in events][-2:] == ["message_delta", "message_stop"], events[-2:]
    return response, events[-2]["usage"]


def follow_up(capture: dict[str, Any]) -> dict[str, Any]:
    """A sub-agent's next request, as its client would send it: its last request, the answer the
    capture stub gave, then the tool's result (or a nudge)."""
    body, stub = dict(capture["body"]), capture["_stub"]
    if capture["path"] == "/v1/responses":
        body["input"] = [*body["input"], *stub["reply_items"],
                         {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "Go on."}]}]
    else:
        calls = [b for b in stub["reply_blocks"] if b["type"] == "tool_use"]
        result: Any = ([{"type": "tool_result", "tool_use_id": c["id"], "content": "sent"} for c in calls]
                       or "Go on.")
        body["messages"] = [*body["messages"], {"role": "assistant", "content": stub["reply_blocks"]},
                            {"role": "user", "content": result}]
    return {**capture, "body": body}


def prompt_and_cached(path: str, usage: dict[str, Any]) -> tuple[int, int]:
    if path == "/v1/responses":
        return usage["input_tokens"], usage["input_tokens_details"]["cached_tokens"]
    return usage["input_tokens"] + usage["cache_read_input_tokens"], usage["cache_read_input_tokens"]


def metric(text: str, name: str) -> float:
    return sum(float(m.group(1)) for m in re.finditer(rf"^{name}(?:{{[^}}]*}})? (\S+)$", text, re.M))


@pytest.fixture(scope="module")
def capture_gateway(tmp_path_factory: pytest.TempPathFactory, model_path: Path) -> Any:
    # Context for the largest main-agent prompt (~16K tokens); the classifier's ~35K-token prompt
    # does not fit it and must be cut to fit.
    server = Gateway(tmp_path_factory.mktemp("captures-store"), model_path, "--n-ctx", "20480")
    yield server
    server.stop()


def test_real_client_traffic_replays_with_every_conversation_keeping_its_cache(capture_gateway: Gateway) -> None:
    last_prompt: dict[tuple[str, str], int] = {}  # (session, agent) -> its last prompt's tokens
    reused: list[str] = []
    failures: list[str] = []
    recorded = captures()
    # Then each sub-agent's next turn, after everything else ran (the captures hold one per sub-agent).
    later = [(f"{name} (next turn)", follow_up(c)) for name, c in recorded if c["_stub"]["kind"] == "subagent"]
    with httpx.Client(base_url=capture_gateway.url, timeout=600) as client:
        for name, capture in [*recorded, *later]:
            response, usage = replay(client, capture)
            if not 200 <= response.status_code < 300:
                failures.append(f"{name}: {response.status_code} {response.text[:300]}")
                continue
            if usage is None or capture["_stub"]["kind"] not in ("main", "subagent"):
                continue
            prompt, cached = prompt_and_cached(capture["path"], usage)
            key = conversation_key(capture)
            if key in last_prompt:
                assert cached >= last_prompt[key], f"{name}: re-prefilled: {cached} cached of its last {last_prompt[key]}"
                reused.append(name)
            last_prompt[key] = prompt
        metrics = client.get("/metrics").text
    assert not failures, failures
    mains = [conversation_key(c)[0] for _, c in recorded if c["_stub"]["kind"] == "main"]
    # Every main-agent request after the first of its session (captures README §1.5, §2.3), and
    # every sub-agent's next turn.
    assert len(reused) == len(mains) - len(set(mains)) + len(later) == 21 + 6, reused
    assert metric(metrics, "pflash_branch_prefix_lost_total") == 0
    assert metric(metrics, "pflash_side_requests_total") == 4  # 2 classifiers, 2 titles
