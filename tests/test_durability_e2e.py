"""Sessions that survive through the real engine: a cancelled prefill keeps the session's state, a
SIGTERM during an abandoned long generation exits fast with every session on disk, and the
`sessions` CLI leaves a running server's store alone."""

from __future__ import annotations

import json
import signal
import socket
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path

import httpx
import pytest

from sessions.identity import session_hash
from sessions.layout import KV, META
from tests.conftest import ROOT, Gateway
from tests.metrics_util import scrape, value
from tests.test_sessions_e2e import SYSTEM
from tests.test_sessions_e2e import chat as sessions_chat

pytestmark = pytest.mark.engine


def chat(server: Gateway, session: str, messages: list[dict[str, str]]) -> httpx.Response:
    return sessions_chat(server, session, messages, max_tokens=2)


def usage(reply: httpx.Response) -> tuple[int, int]:
    data = reply.json()["usage"]
    return int(data["prompt_tokens"]), int(data["prompt_tokens_details"]["cached_tokens"])


def long_question(lines: int) -> str:
    return "".join(f"Line {i}: the parser reads token {i * 7} and stores it in slot {i % 13}.\n" for i in range(lines))


def send_and_leave(server: Gateway, body: dict, session: str, read_first: bool) -> None:
    """A client that sends a request and goes away (after its first response bytes, if asked)."""
    payload = json.dumps(body).encode()
    head = (f"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(payload)}\r\nX-Session-Id: {session}\r\n\r\n").encode()
    with socket.create_connection(("127.0.0.1", server.port), timeout=60) as sock:
        sock.sendall(head + payload)
        if read_first:
            assert sock.recv(1)  # the stream has begun: prefill is under way


def test_cancelled_prefill_then_retry_reuses_the_prefix(start_gateway) -> None:  # type: ignore[no-untyped-def]
    server = start_gateway("--threshold", "100000", "--n-batch", "64", "--n-ubatch", "64", "--n-threads", "1")
    a, b = "cancel-a-" + uuid.uuid4().hex, "cancel-b-" + uuid.uuid4().hex
    first = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "Say ok."}]
    reply = chat(server, a, first)
    chat(server, b, [{"role": "user", "content": "Name a fruit."}])  # A's state moves to the RAM tier
    second = [*first, {"role": "assistant", "content": reply.json()["choices"][0]["message"]["content"] or ""},
              {"role": "user", "content": long_question(150)}]
    body = {"model": "m", "messages": second, "max_tokens": 2, "temperature": 0, "stream": True}
    send_and_leave(server, body, a, read_first=True)  # noticed at the next keep-alive, mid-prefill
    deadline = time.time() + 60
    while "prefill cancelled" not in server.log() and time.time() < deadline:
        time.sleep(0.1)
    assert "prefill cancelled" in server.log(), server.log()[-3000:]

    retry = chat(server, a, second)
    prompt, cached = usage(retry)
    assert cached >= usage(reply)[0] - 1  # at least A's first turn came back: its state was kept
    assert cached < prompt
    assert retry.headers["X-PFlash-Restored-From"] == "context"


def test_sigterm_during_an_abandoned_long_generation(start_gateway, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    store = tmp_path / "sigterm"
    server = start_gateway("--n-threads", "1", "--shutdown-grace-seconds", "2", store=store)
    done, left = "done-" + uuid.uuid4().hex, "left-" + uuid.uuid4().hex
    chat(server, done, [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "Say ok."}])
    # Thousands of tokens for nobody: the client leaves at once, and a non-streaming answer has
    # nothing to write until the end.
    body = {"model": "m", "messages": [{"role": "user", "content": "Count to ten thousand."}], "max_tokens": 100000,
            "temperature": 0}
    send_and_leave(server, body, left, read_first=False)
    time.sleep(2)
    assert server.proc.poll() is None
    started = time.perf_counter()
    server.proc.send_signal(signal.SIGTERM)
    returncode = server.proc.wait(60)
    elapsed = time.perf_counter() - started
    assert returncode == 0, server.log()[-3000:]
    assert elapsed < 15, elapsed
    assert "sessions flushed" in server.log()
    for session in (done, left):
        path = next(store.glob(f"sessions/*/{session_hash('', session)}"))
        assert (path / META).exists() and (path / KV).exists(), (session, list(path.iterdir()))
    print(f"\nSIGTERM during an abandoned {body['max_tokens']}-token generation: exited in {elapsed:.1f} s")


def test_sessions_gc_and_rm_leave_a_running_server_alone(gateway: Gateway) -> None:
    session = "live-" + uuid.uuid4().hex
    chat(gateway, session, [{"role": "user", "content": "Say ok."}])
    path = next(gateway.store.glob(f"sessions/*/{session_hash('', session)}"))
    (path.parent / ("0" * 64)).mkdir()  # an invalid leftover gc would remove with the server down
    for args in (["gc"], ["rm", path.name[:16]]):
        result = subprocess.run([sys.executable, "-m", "gateway.cli", "sessions", *args, "--store-dir", str(gateway.store)],
                                cwd=ROOT, capture_output=True, text=True, timeout=60)
        assert result.returncode == 1
        assert "a running server holds the store" in result.stderr and result.stderr.count("\n") == 1
    assert (path / META).exists() and (path.parent / ("0" * 64)).exists()
    assert httpx.get(f"{gateway.url}/v1/sessions/{session}/transcript").status_code == 200
    (path.parent / ("0" * 64)).rmdir()


def test_health_answers_quickly_while_sessions_switch_through_disk(start_gateway) -> None:  # type: ignore[no-untyped-def]
    """RAM budget 0: every switch writes a state to disk and reads another back. That I/O runs
    on the store's own thread, never under a lock the event loop takes: /health stays fast."""
    # Four sessions on two sequences: every turn after the first two moves a state out and one in.
    server = start_gateway("--ram-budget-mb", "0", "--n-threads", "1", "--sequences", "2")
    histories = {f"lag-{i}-" + uuid.uuid4().hex[:8]: [{"role": "system", "content": f"Reviewer {i}. " + SYSTEM * 3},
                                                      {"role": "user", "content": "Say ok."}] for i in range(4)}
    latencies: list[float] = []
    stop = threading.Event()

    def probe() -> None:
        with httpx.Client(timeout=30) as http:
            while not stop.is_set():
                started = time.perf_counter()
                assert http.get(server.url + "/health").status_code == 200
                latencies.append(time.perf_counter() - started)
                time.sleep(0.01)

    prober = threading.Thread(target=probe, daemon=True)
    prober.start()
    try:
        for _round in range(3):
            for session, history in histories.items():
                reply = chat(server, session, history)
                history += [{"role": "assistant", "content": reply.json()["choices"][0]["message"]["content"] or ""},
                            {"role": "user", "content": "Again."}]
    finally:
        stop.set()
        prober.join()
    samples = scrape(server.url)
    assert value(samples, "pflash_session_spills_total") >= 8 and value(samples, "pflash_kv_restores_total", tier="disk") >= 8
    latencies.sort()
    p99 = latencies[int(len(latencies) * 0.99) - 1]
    assert p99 < 0.1, (p99, latencies[-5:])
    print(f"\n/health during {len(histories) * 3} disk switches: {len(latencies)} probes, p50 "
          f"{latencies[len(latencies) // 2] * 1000:.1f} ms, p99 {p99 * 1000:.1f} ms, max {latencies[-1] * 1000:.1f} ms")


def test_store_counters_move_on_metrics(start_gateway, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """/metrics shows the store at work: a turn's record written ahead (and fsynced in a batch);
    with a RAM budget of 0, a switch spills a KV state and evicts a record, and coming back reads
    both from the store; after a restart, the leftover of an interrupted write is counted as removed."""
    store = tmp_path / "counted"
    server = start_gateway("--ram-budget-mb", "0", "--sequences", "1", store=store)  # B's turn moves A out
    a, b = "count-a-" + uuid.uuid4().hex, "count-b-" + uuid.uuid4().hex
    history = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "Say ok."}]
    start = scrape(server.url)

    def grown(since: dict, name: str, **labels: str) -> float:
        samples = scrape_until(server, lambda s: value(s, name, **labels) > value(since, name, **labels))
        return value(samples, name, **labels) - value(since, name, **labels)

    chat(server, a, history)
    assert grown(start, "pflash_store_writes_total", kind="record") >= 1
    assert grown(start, "pflash_store_written_bytes_total", kind="record") > 0
    assert grown(start, "pflash_store_syncs_total") >= 1  # record_sync "batched": within a second
    chat(server, b, history)  # A's state leaves the context: over the RAM budget, it goes to disk
    assert grown(start, "pflash_store_writes_total", kind="kv") >= 1
    assert grown(start, "pflash_store_written_bytes_total", kind="kv") > 0
    assert grown(start, "pflash_session_records_evicted_total") >= 1
    switched = scrape(server.url)
    again = chat(server, a, history)
    assert again.headers["X-PFlash-Restored-From"] == "disk"
    assert grown(switched, "pflash_store_reads_total") >= 2  # A's record and its KV state
    failures = scrape(server.url)
    assert all(value(failures, "pflash_store_failures_total", op=op) == 0 for op in ("write", "read", "sync"))
    server.stop()

    session_dir = next(store.glob(f"sessions/*/{session_hash('', a)}"))
    (session_dir / ".kv.zst.4242.0.tmp").write_bytes(b"half a write")  # as a kill -9 mid-write leaves it
    restarted = start_gateway("--ram-budget-mb", "0", "--sequences", "1", store=store)
    assert value(scrape(restarted.url), "pflash_store_leftovers_removed_total") == 1
    assert not list(session_dir.glob(".*.tmp"))


def scrape_until(server: Gateway, ready, timeout: float = 10):  # type: ignore[no-untyped-def]
    """/metrics once `ready(samples)` holds (store I/O runs on its own thread), or at the deadline."""
    deadline = time.time() + timeout
    while True:
        samples = scrape(server.url)
        if ready(samples) or time.time() > deadline:
            return samples
        time.sleep(0.1)
