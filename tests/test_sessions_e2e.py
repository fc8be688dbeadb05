"""Sessions through the real engine: RAM and disk tiers, restart, corrupt store entries.
Model: Gemma 3 270M Q4_K_M, the fast base model (fixture `model_path`).
"""

from __future__ import annotations

import signal
import uuid
from pathlib import Path

import httpx
import msgpack
import pytest

from sessions.layout import FORMAT_VERSION, KV, META, read_kv_header
from tests.conftest import Gateway

pytestmark = pytest.mark.engine

SYSTEM = "You are a careful assistant that reviews Python code and explains what it does. " * 12


def chat(server: Gateway, session: str, messages: list[dict[str, str]], max_tokens: int = 12) -> httpx.Response:
    body = {"model": "m", "messages": messages, "max_tokens": max_tokens, "temperature": 0}
    response = httpx.post(server.url + "/v1/chat/completions", json=body, headers={"X-Session-Id": session}, timeout=120)
    assert response.status_code == 200, response.text
    return response


def first_turn() -> list[dict[str, str]]:
    return [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "What does `def add(a, b): return a + b` do?"}]


def follow_up(history: list[dict[str, str]], reply: httpx.Response, question: str) -> list[dict[str, str]]:
    answer = reply.json()["choices"][0]["message"]["content"] or ""
    return [*history, {"role": "assistant", "content": answer}, {"role": "user", "content": question}]


def cached(reply: httpx.Response) -> int:
    return int(reply.json()["usage"]["prompt_tokens_details"]["cached_tokens"])


def prompt_tokens(reply: httpx.Response) -> int:
    return int(reply.json()["usage"]["prompt_tokens"])


@pytest.mark.parametrize("sequences", ["1", "2"])
@pytest.mark.parametrize(("ram_mb", "tier"), [("2048", "ram"), ("0", "disk")])
def test_switching_sessions_restores_kv(start_gateway, ram_mb: str, tier: str, sequences: str) -> None:  # type: ignore[no-untyped-def]
    """A session whose sequence another session took comes back from the tier: on the
    single-sequence engine after one other session, on the batched one after as many as it has
    sequences (the least recently used leaves)."""
    server = start_gateway("--ram-budget-mb", ram_mb, "--sequences", sequences)
    a = "A-" + uuid.uuid4().hex
    history_a = first_turn()
    reply_a = chat(server, a, history_a)
    for other in range(int(sequences)):
        chat(server, f"other-{other}-{uuid.uuid4().hex}", [{"role": "user", "content": f"Name fruit number {other}."}])
    history_a = follow_up(history_a, reply_a, "Is it pure?")
    again = chat(server, a, history_a)
    assert again.headers["X-PFlash-Restored-From"] == tier
    assert cached(again) >= prompt_tokens(reply_a) - 1  # A's whole history came back
    sessions = httpx.get(server.url + "/v1/sessions").json()["data"]
    assert {s["tier"] for s in sessions} >= {"context"}
    assert len(sessions) == 1 + int(sequences)


def test_restart_resumes_without_prefill_and_answers_identically(start_gateway, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    session = "restart-" + uuid.uuid4().hex
    history = first_turn()
    server = start_gateway(store=tmp_path / "restarted")
    reply = chat(server, session, history)
    assert server.stop(signal.SIGTERM) == 0
    assert "sessions flushed" in server.log()

    stored = [p for p in (tmp_path / "restarted" / "sessions").glob("*/*") if p.is_dir()]
    assert len(stored) == 1
    meta = msgpack.unpackb((stored[0] / META).read_bytes(), raw=False)
    header, _start = read_kv_header((stored[0] / KV).read_bytes())
    assert meta["format"] == FORMAT_VERSION == header["format"] and len(header["tokens"]) >= prompt_tokens(reply)
    assert meta["session"]["counters"]["turns"] == 1

    history2 = follow_up(history, reply, "Rewrite it with type hints.")
    resumed_server = start_gateway(store=tmp_path / "restarted")
    resumed = chat(resumed_server, session, history2, max_tokens=24)
    assert resumed.headers["X-PFlash-Restored-From"] == "disk"
    new_tokens = prompt_tokens(resumed) - cached(resumed)
    assert new_tokens <= prompt_tokens(resumed) - prompt_tokens(reply)  # only the new turn (and less)

    reference = start_gateway(store=tmp_path / "never-restarted")
    chat(reference, session, history)
    expected = chat(reference, session, history2, max_tokens=24)
    assert resumed.json()["choices"][0]["message"]["content"] == expected.json()["choices"][0]["message"]["content"]


@pytest.mark.parametrize("fault", ["flip", "truncate", "version", "fingerprint"])
def test_corrupt_store_serves_by_full_prefill(start_gateway, tmp_path: Path, fault: str) -> None:  # type: ignore[no-untyped-def]
    session = "fault-" + uuid.uuid4().hex
    store = tmp_path / fault
    server = start_gateway(store=store)
    history = first_turn()
    reply = chat(server, session, history)
    server.stop()
    path = next(p for p in (store / "sessions").glob("*/*") if p.is_dir())
    if fault == "flip":
        data = bytearray((path / KV).read_bytes())
        data[len(data) // 2] ^= 0xFF
        (path / KV).write_bytes(bytes(data))
    elif fault == "truncate":
        (path / KV).write_bytes((path / KV).read_bytes()[:1000])
    else:
        meta = msgpack.unpackb((path / META).read_bytes(), raw=False)
        meta["format" if fault == "version" else "fingerprint"] = 999 if fault == "version" else "other-model"
        (path / META).write_bytes(msgpack.packb(meta))

    restarted = start_gateway(store=store)
    history2 = follow_up(history, reply, "Explain again.")
    again = chat(restarted, session, history2)
    assert cached(again) == 0  # nothing stale reused: a full prefill
    assert again.headers["X-PFlash-Restored-From"] == "none"
    assert "stored session" in restarted.log() or "stored KV discarded" in restarted.log()
    assert httpx.get(restarted.url + "/health").status_code == 200


def test_resume_after_restart_writes_into_a_buffer_touched_at_start(start_gateway, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """A state of a few MB: the restarted server touches a buffer for it before its first request
    (freed memory on a VM costs a first touch again), and the resume decodes into that buffer."""
    from tests.metrics_util import scrape, value

    session = "buffers-" + uuid.uuid4().hex
    history = [{"role": "system", "content": SYSTEM * 5}, first_turn()[1]]
    server = start_gateway(store=tmp_path / "store")
    reply = chat(server, session, history, max_tokens=4)
    assert server.stop(signal.SIGTERM) == 0
    stored = next(p for p in (tmp_path / "store" / "sessions").glob("*/*") if p.is_dir())
    raw = read_kv_header((stored / KV).read_bytes())[0]["raw_bytes"]

    resumed = start_gateway(store=tmp_path / "store")
    before = scrape(resumed.url)
    assert value(before, "pflash_state_buffer_bytes") >= raw > 4 << 20
    again = chat(resumed, session, follow_up(history, reply, "Why?"), max_tokens=4)
    assert again.headers["X-PFlash-Restored-From"] == "disk"
    after = scrape(resumed.url)
    assert value(after, "pflash_state_buffers_total", kind="reused") == 1
    assert value(after, "pflash_state_buffers_total", kind="allocated") == 1  # the one touched at start
