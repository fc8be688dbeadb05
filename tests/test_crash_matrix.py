"""Crash matrix: a session whose turn 2 brought a long tool output (compressed) and whose turn 3
triggered recall is killed with SIGKILL at seeded points across turns 2-4 (mid-spill, mid-prefill,
mid-stream, right after the response). After each kill, a restart and the next turn, its
transcript equals byte for byte that of a server that never failed, and no session is lost.

The record is written ahead of every response, so this holds with `record_sync = "batched"`; the
last test shows the same kill losing the compressed history with `record_sync = "off"`.

CI runs a few kill points; PFLASH_SOAK=1 runs all ten.
"""

from __future__ import annotations

import os
import random
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.conftest import Gateway
from tests.metrics_util import scrape, value
from tests.test_compression_e2e import python_module

pytestmark = pytest.mark.engine

ADMIN = "crash-admin-key"
AUTH = {"Authorization": f"Bearer {ADMIN}"}
# RAM budget 0: every switch to the other session spills the main one to disk (a "spill" point).
FLAGS = ("--n-threads", "1", "--admin-keys", ADMIN, "--ram-budget-mb", "0")
SEED = 14
ALL_POINTS = [(2, "spill"), (2, "prefill"), (2, "stream"), (2, "after"), (3, "spill"), (3, "prefill"),
              (3, "stream"), (3, "after"), (4, "prefill"), (4, "stream")]
CI_POINTS = [(2, "prefill"), (3, "spill"), (3, "after"), (4, "stream")]  # in order within a turn
POINTS = ALL_POINTS if os.environ.get("PFLASH_SOAK") == "1" else CI_POINTS


def turns() -> list[list[dict[str, Any]]]:
    """The client's request at turns 1-4; its assistant messages are scripted (an agent's history)."""
    system = {"role": "system", "content": "You are a coding agent. " * 30}
    one = [system, {"role": "user", "content": "Where is the invoice total computed, and how is tax applied?"}]
    two = [*one, {"role": "assistant", "content": "", "tool_calls": [
        {"id": "call_read1", "type": "function", "function": {"name": "read_file", "arguments": '{"path": "inventory.py"}'}}]},
        {"role": "tool", "tool_call_id": "call_read1", "content": python_module()}]
    three = [*two, {"role": "assistant", "content": "In compute_invoice_total: the subtotal times one plus tax_rate."},
             {"role": "user", "content": "What does helper_37 multiply the values by (helper_37)?"}]
    four = [*three, {"role": "assistant", "content": "By 38."},
            {"role": "user", "content": "Thanks. Which function should I test first?"}]
    return [one, two, three, four]


def body(messages: list[dict[str, Any]], stream: bool) -> dict[str, Any]:
    return {"model": "m", "messages": messages, "max_tokens": 12, "temperature": 0, "stream": stream}


def post(server: Gateway, session: str, messages: list[dict[str, Any]]) -> httpx.Response:
    reply = httpx.post(server.url + "/v1/chat/completions", json=body(messages, False),
                       headers={**AUTH, "X-Session-Id": session}, timeout=300)
    assert reply.status_code == 200, reply.text
    return reply


def transcript(server: Gateway, session: str) -> list[dict[str, str]] | None:
    reply = httpx.get(f"{server.url}/v1/sessions/{session}/transcript", headers=AUTH, timeout=60)
    return reply.json()["messages"] if reply.status_code == 200 else None


def other_turn(server: Gateway, other: str) -> None:
    post(server, other, [{"role": "user", "content": "Name a color."}])


@dataclass
class Run:
    transcripts: dict[int, list[dict[str, str]] | None] = field(default_factory=dict)  # after each turn
    answers: dict[int, str] = field(default_factory=dict)
    headers: dict[int, httpx.Headers] = field(default_factory=dict)
    restored: list[tuple[int, str, int]] = field(default_factory=list)  # (turn, restored from, cached tokens)
    kills: list[str] = field(default_factory=list)
    # After each kill and restart: (last turn the client saw answered, the transcript served then).
    after_restart: list[tuple[int, list[dict[str, str]] | None]] = field(default_factory=list)
    metrics: Any = None


def complete_turn(server: Gateway, run: Run, main: str, other: str, turn: int) -> None:
    if turn > 1:
        other_turn(server, other)  # the main session's KV spills to disk
    reply = post(server, main, turns()[turn - 1])
    run.transcripts[turn] = transcript(server, main)
    run.answers[turn] = reply.json()["choices"][0]["message"]["content"] or ""
    run.headers[turn] = reply.headers
    cached = int(reply.json()["usage"]["prompt_tokens_details"]["cached_tokens"])
    run.restored.append((turn, reply.headers["X-PFlash-Restored-From"], cached))


def in_background(fn: Callable[[], object]) -> threading.Thread:
    def quietly() -> None:
        try:
            fn()
        except (httpx.HTTPError, AssertionError):
            pass  # the server was killed under this request

    thread = threading.Thread(target=quietly, daemon=True)
    thread.start()
    return thread


def kill(server: Gateway) -> None:
    server.proc.kill()
    server.proc.wait()


def kill_at(server: Gateway, run: Run, store: Path, main: str, other: str, turn: int, point: str,
            rng: random.Random) -> str:
    """SIGKILL the server at `point` of `turn`; returns what actually happened (for the report)."""
    messages = turns()[turn - 1]
    if point == "spill":
        post(server, main, turns()[turn - 2])  # a client's retry: the main session is in the context again
        thread = in_background(lambda: other_turn(server, other))
        deadline = time.time() + 60
        while time.time() < deadline and not list(store.glob("sessions/*/*/.kv.zst.*.tmp")):
            if not thread.is_alive():
                break
            time.sleep(0.0005)
        caught = bool(list(store.glob("sessions/*/*/.kv.zst.*.tmp")))
        kill(server)
        return f"turn {turn}: {'mid-spill' if caught else 'after the spill (missed the write)'}"
    if point == "after":
        complete_turn(server, run, main, other, turn)
        kill(server)
        return f"turn {turn}: right after the response"
    other_turn(server, other)
    if point == "prefill":
        delay = rng.uniform(0.0, 0.3)
        in_background(lambda: post(server, main, messages))
        time.sleep(delay)
        kill(server)
        return f"turn {turn}: {delay * 1000:.0f} ms into the request (rewrite/prefill)"
    with httpx.stream("POST", server.url + "/v1/chat/completions", json=body(messages, True),
                      headers={**AUTH, "X-Session-Id": main}, timeout=300) as response:
        for line in response.iter_lines():
            if '"content":"' in line.replace(" ", "") and '"content":""' not in line.replace(" ", ""):
                kill(server)
                return f"turn {turn}: mid-stream, after the first text"
    kill(server)
    return f"turn {turn}: after the stream (ended before any text)"


def run_script(start: Callable[..., Gateway], store: Path, points: list[tuple[int, str]], *extra: str) -> Run:
    run = Run()
    main, other = "crash-main-" + uuid.uuid4().hex[:8], "crash-other-" + uuid.uuid4().hex[:8]
    rng = random.Random(SEED)
    server = start(*FLAGS, *extra, store=store)
    complete_turn(server, run, main, other, 1)
    for turn in (2, 3, 4):
        for point in [p for t, p in points if t == turn]:
            run.kills.append(kill_at(server, run, store, main, other, turn, point, rng))
            server = start(*FLAGS, *extra, store=store)
            answered = turn if point == "after" else turn - 1
            run.after_restart.append((answered, transcript(server, main)))
            if point == "after":
                break  # the client got its answer: on to the next turn
        else:
            complete_turn(server, run, main, other, turn)
    run.metrics = scrape(server.url)
    return run


@pytest.fixture(scope="module")
def reference(tmp_path_factory: pytest.TempPathFactory, model_path: Path) -> Run:
    """The same conversation on a server that never fails."""
    started: list[Gateway] = []

    def start(*flags: str, store: Path) -> Gateway:
        server = Gateway(store, model_path, *flags)
        started.append(server)
        return server

    run = run_script(start, tmp_path_factory.mktemp("reference") / "store", [])
    for server in started:
        server.stop()
    assert run.headers[2]["X-PFlash-Compressed"] == "true"
    assert run.headers[3]["X-PFlash-Recall"] == "true"
    return run


def test_crash_matrix_transcripts_equal_a_server_that_never_failed(start_gateway, tmp_path: Path,
                                                                   reference: Run) -> None:  # type: ignore[no-untyped-def]
    run = run_script(start_gateway, tmp_path / "store", POINTS)
    same = [t for t in (1, 2, 3, 4) if run.answers[t] == reference.answers[t]]
    print(f"\ncrash matrix ({len(run.kills)} kills, seed {SEED}): " + "; ".join(run.kills)
          + f"\nturns (turn, restored from, cached tokens): {run.restored}; "
          f"answers equal to the reference at turns {same}")
    assert len(run.kills) == len(POINTS)
    for (answered, served), kill_point in zip(run.after_restart, run.kills):
        # Written ahead: right after the restart, the session is exactly as its last answer left it.
        assert served == reference.transcripts[answered], kill_point
    for turn in (1, 2, 3, 4):
        assert run.transcripts[turn] == reference.transcripts[turn], (turn, run.kills)
    for turn, source, cached in run.restored:
        assert source in ("context", "disk", "none"), run.restored
        assert (cached > 0) == (source != "none"), run.restored  # a restore that happened saved prefill
    assert value(run.metrics, "pflash_kv_restore_failures_total") == 0


def test_without_records_written_ahead_a_kill_loses_the_compressed_history(start_gateway, tmp_path: Path,
                                                                          reference: Run) -> None:  # type: ignore[no-untyped-def]
    """The matrix can fail: with record_sync = "off" the kept-line map of turn 2 exists only in
    memory; killed right after turn 2's answer, the restarted server serves the tool output whole."""
    run = run_script(start_gateway, tmp_path / "store", [(2, "after")], "--record-sync", "off")
    assert run.after_restart[0][1] != reference.transcripts[2]
    assert run.transcripts[3] != reference.transcripts[3]
