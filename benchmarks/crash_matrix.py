"""The crash matrix (issue 14), shared by its test and its benchmark section: a session whose turn 2
brings a long tool output (compressed) and whose turn 3 triggers recall is killed with SIGKILL at
seeded points across turns 2-4 (mid-spill, mid-prefill, mid-stream, right after the response).
After each kill a new server starts on the same store and the client goes on; what it was served
is compared with a server that never failed.

The RAM budget is 0, so every turn of the other session spills the main one to disk: the "spill"
points catch that write.
"""

from __future__ import annotations

import random
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from gateway.process import GatewayProcess

ADMIN = "crash-admin-key"
AUTH = {"Authorization": f"Bearer {ADMIN}"}
FLAGS = ("--admin-keys", ADMIN, "--ram-budget-mb", "0")
SEED = 14
ALL_POINTS = [(2, "spill"), (2, "prefill"), (2, "stream"), (2, "after"), (3, "spill"), (3, "prefill"),
              (3, "stream"), (3, "after"), (4, "prefill"), (4, "stream")]
FIRST_QUESTION = "Where is the invoice total computed, and how is tax applied?"
Start = Callable[..., GatewayProcess]  # start(*flags, store=path): a live server on that store


def python_module(n_functions: int = 40) -> str:
    """A realistic file read: many small functions, one of them about billing."""
    blocks = ['"""Inventory helpers."""', "import math", ""]
    for i in range(n_functions):
        if i == 23:
            blocks.append(
                "def compute_invoice_total(items, tax_rate):\n"
                '    """Sum the invoice lines and apply the tax rate."""\n'
                "    subtotal = sum(item.price * item.quantity for item in items)\n"
                "    return round(subtotal * (1 + tax_rate), 2)\n"
            )
            continue
        blocks.append(
            f"def helper_{i}(values):\n"
            f'    """Return the scaled norm number {i} of the values."""\n'
            f"    total = sum(v * {i + 1} for v in values)\n"
            f"    return math.sqrt(total) if total > 0 else 0.0\n"
        )
    return "\n".join(blocks)


@dataclass(frozen=True)
class Script:
    """What the client sends: its tool output (python_module), the helper its turn-3 question
    asks about (one its compression leaves out), and how many answer tokens it asks for."""

    tool_output: str
    recall_helper: int = 37
    max_tokens: int = 12

    def turns(self) -> list[list[dict[str, Any]]]:
        """The client's request at turns 1-4; its assistant messages are scripted (an agent's history)."""
        system = {"role": "system", "content": "You are a coding agent. " * 30}
        one = [system, {"role": "user", "content": FIRST_QUESTION}]
        two = [*one, {"role": "assistant", "content": "", "tool_calls": [
            {"id": "call_read1", "type": "function",
             "function": {"name": "read_file", "arguments": '{"path": "inventory.py"}'}}]},
            {"role": "tool", "tool_call_id": "call_read1", "content": self.tool_output}]
        three = [*two, {"role": "assistant", "content": "In compute_invoice_total: the subtotal times one plus tax_rate."},
                 {"role": "user", "content": f"What does helper_{self.recall_helper} multiply the values by "
                                             f"(helper_{self.recall_helper})?"}]
        four = [*three, {"role": "assistant", "content": f"By {self.recall_helper + 1}."},
                {"role": "user", "content": "Thanks. Which function should I test first?"}]
        return [one, two, three, four]

    def body(self, messages: list[dict[str, Any]], stream: bool) -> dict[str, Any]:
        return {"model": "m", "messages": messages, "max_tokens": self.max_tokens, "temperature": 0, "stream": stream}


@dataclass
class Run:
    transcripts: dict[int, list[dict[str, str]] | None] = field(default_factory=dict)  # after each turn
    answers: dict[int, str] = field(default_factory=dict)
    headers: dict[int, httpx.Headers] = field(default_factory=dict)
    restored: dict[int, tuple[str, int]] = field(default_factory=dict)  # turn -> (restored from, cached tokens)
    seconds: dict[int, float] = field(default_factory=dict)  # turn -> how long its request took
    kills: list[str] = field(default_factory=list)
    # After each kill and restart: (last turn the client saw answered, the transcript served then).
    after_restart: list[tuple[int, list[dict[str, str]] | None]] = field(default_factory=list)
    metrics: str = ""  # the last server's /metrics text

    def same_restore_turns(self, reference: Run) -> list[int]:
        """The turns up to which every turn's engine state came back as on the server that never
        failed (same source, same reused tokens): the same computation, so the same greedy answer."""
        same: list[int] = []
        for turn in sorted(self.restored):
            if self.restored[turn] != reference.restored.get(turn):
                break
            same.append(turn)
        return same

    def restore_failures(self) -> float:
        """pflash_kv_restore_failures_total on the last server."""
        from prometheus_client.parser import text_string_to_metric_families

        return sum(s.value for f in text_string_to_metric_families(self.metrics) for s in f.samples
                   if s.name == "pflash_kv_restore_failures_total")


def post(server: GatewayProcess, script: Script, session: str, messages: list[dict[str, Any]]) -> httpx.Response:
    reply = httpx.post(server.url + "/v1/chat/completions", json=script.body(messages, False),
                       headers={**AUTH, "X-Session-Id": session}, timeout=600)
    if reply.status_code != 200:
        raise AssertionError(f"HTTP {reply.status_code}: {reply.text[:500]}")
    return reply


def transcript(server: GatewayProcess, session: str) -> list[dict[str, str]] | None:
    reply = httpx.get(f"{server.url}/v1/sessions/{session}/transcript", headers=AUTH, timeout=60)
    return reply.json()["messages"] if reply.status_code == 200 else None


def other_turn(server: GatewayProcess, script: Script, other: str) -> None:
    post(server, script, other, [{"role": "user", "content": "Name a color."}])


def complete_turn(server: GatewayProcess, script: Script, run: Run, main: str, other: str, turn: int) -> None:
    if turn > 1:
        other_turn(server, script, other)  # the main session's KV spills to disk
    started = time.perf_counter()
    reply = post(server, script, main, script.turns()[turn - 1])
    run.seconds[turn] = time.perf_counter() - started
    run.transcripts[turn] = transcript(server, main)
    run.answers[turn] = reply.json()["choices"][0]["message"]["content"] or ""
    run.headers[turn] = reply.headers
    cached = int(reply.json()["usage"]["prompt_tokens_details"]["cached_tokens"])
    run.restored[turn] = (reply.headers["X-PFlash-Restored-From"], cached)


def in_background(fn: Callable[[], object]) -> threading.Thread:
    def quietly() -> None:
        try:
            fn()
        except (httpx.HTTPError, AssertionError):
            pass  # the server was killed under this request

    thread = threading.Thread(target=quietly, daemon=True)
    thread.start()
    return thread


def kill(server: GatewayProcess) -> None:
    server.proc.kill()
    server.proc.wait()


def kill_at(server: GatewayProcess, script: Script, run: Run, store: Path, main: str, other: str, turn: int,
            point: str, rng: random.Random, reference_seconds: dict[int, float]) -> str:
    """SIGKILL the server at `point` of `turn`; returns what actually happened (for the report).
    A "prefill" kill falls within the time the reference took for that request (rewrite, scoring,
    prefill), so it lands inside the request whatever the machine's speed."""
    messages = script.turns()[turn - 1]
    if point == "spill":
        post(server, script, main, script.turns()[turn - 2])  # a client's retry: the main session is in the context again
        thread = in_background(lambda: other_turn(server, script, other))
        deadline = time.time() + 120
        while time.time() < deadline and not list(store.glob("sessions/*/*/.kv.zst.*.tmp")):
            if not thread.is_alive():
                break
            time.sleep(0.0005)
        caught = bool(list(store.glob("sessions/*/*/.kv.zst.*.tmp")))
        kill(server)
        return f"turn {turn}: {'mid-spill' if caught else 'after the spill (missed the write)'}"
    if point == "after":
        complete_turn(server, script, run, main, other, turn)
        kill(server)
        return f"turn {turn}: right after the response"
    other_turn(server, script, other)
    if point == "prefill":
        delay = rng.uniform(0.05, 0.8) * reference_seconds[turn]
        in_background(lambda: post(server, script, main, messages))
        time.sleep(delay)
        kill(server)
        return f"turn {turn}: {delay * 1000:.0f} ms into the request (rewrite/prefill)"
    with httpx.stream("POST", server.url + "/v1/chat/completions", json=script.body(messages, True),
                      headers={**AUTH, "X-Session-Id": main}, timeout=600) as response:
        for line in response.iter_lines():
            if '"content":"' in line.replace(" ", "") and '"content":""' not in line.replace(" ", ""):
                kill(server)
                return f"turn {turn}: mid-stream, after the first text"
    kill(server)
    return f"turn {turn}: after the stream (ended before any text)"


def run_script(start: Start, script: Script, store: Path, points: list[tuple[int, str]], *extra: str,
               reference: Run | None = None) -> Run:
    """The four turns on servers started by `start`, killed at `points` (none: the reference run,
    which the others then need)."""
    if points and reference is None:
        raise ValueError("kill points need the reference run (its timings place the prefill kills)")
    reference_seconds = reference.seconds if reference is not None else {}
    run = Run()
    main, other = "crash-main-" + uuid.uuid4().hex[:8], "crash-other-" + uuid.uuid4().hex[:8]
    rng = random.Random(SEED)
    server = start(*FLAGS, *extra, store=store)
    complete_turn(server, script, run, main, other, 1)
    for turn in (2, 3, 4):
        for point in [p for t, p in points if t == turn]:
            run.kills.append(kill_at(server, script, run, store, main, other, turn, point, rng, reference_seconds))
            server = start(*FLAGS, *extra, store=store)
            answered = turn if point == "after" else turn - 1
            run.after_restart.append((answered, transcript(server, main)))
            if point == "after":
                break  # the client got its answer: on to the next turn
        else:
            complete_turn(server, script, run, main, other, turn)
    run.metrics = httpx.get(server.url + "/metrics", timeout=30).text
    return run
