"""Reliability against live gateways on the real model: load, faults, and fuzzed input.

Sized for CI (about a minute and a half on two cores). `PFLASH_SOAK=1` runs the longer version
by hand: more clients and turns, more kill -9 cycles and disconnects, ten times the fuzz examples.

- load: concurrent multi-turn sessions; no errors but deliberate 429/503, history intact (later
  turns reuse the KV cache), bounded time (no deadlock), bounded server memory; /metrics plausible.
- faults: kill -9 while the server flushes sessions to disk, then restart (nothing corrupt is loaded
  and every session is served); a store on a tiny full filesystem (requests keep being served, the
  failure is logged and counted); clients that vanish at random points of a request.
- fuzz: hypothesis-generated bodies for the three APIs: never a 5xx, never a crash, never a file
  outside the store.
Model: Gemma 3 270M Q4_K_M, the fast base model (fixture `model_path`).
"""

from __future__ import annotations

import itertools
import json
import os
import random
import re
import signal
import socket
import struct
import subprocess
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor, wait
from pathlib import Path
from typing import Any

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sessions.store import KV, META
from tests.conftest import ROOT, Gateway
from tests.metrics_util import Samples, scrape, total, value

pytestmark = pytest.mark.engine

SOAK = os.environ.get("PFLASH_SOAK") == "1"
LOAD_CLIENTS = 16 if SOAK else 8
LOAD_TURNS = 8 if SOAK else 3
LOAD_DEADLINE_S = 900 if SOAK else 180
RSS_GROWTH_LIMIT = 256 * 1024 * 1024
KILL_CYCLES = 6 if SOAK else 2
DISCONNECTS = 60 if SOAK else 10
FUZZ_EXAMPLES = int(os.environ.get("PFLASH_FUZZ_EXAMPLES", "3000" if SOAK else "300"))

# Every gateway here: one llama thread (two spinning threads on a shared 2-core box stall each
# other badly), tiny default completions (fuzzed bodies that turn out valid cost one token).
COMMON = ("--n-threads", "1", "--default-max-tokens", "2")


def vm_rss(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS")


def usage(reply: httpx.Response) -> tuple[int, int]:
    data = reply.json()["usage"]
    return int(data["prompt_tokens"]), int(data["prompt_tokens_details"]["cached_tokens"])


def answer(reply: httpx.Response) -> str:
    return reply.json()["choices"][0]["message"]["content"] or ""


def chat(http: httpx.Client | None, server: Gateway, messages: list[dict[str, Any]], session: str | None = None,
         max_tokens: int = 8) -> httpx.Response:
    body = {"model": "m", "messages": messages, "max_tokens": max_tokens, "temperature": 0}
    headers = {"X-Session-Id": session} if session else {}
    if http is None:
        return httpx.post(server.url + "/v1/chat/completions", json=body, headers=headers, timeout=180)
    return http.post(server.url + "/v1/chat/completions", json=body, headers=headers)


@pytest.fixture(scope="module")
def live(tmp_path_factory: pytest.TempPathFactory, model_path: Path) -> Iterator[Gateway]:
    """No RAM tier: every session switch writes the session to disk and restores it from there."""
    server = Gateway(tmp_path_factory.mktemp("live") / "store", model_path, *COMMON, "--ram-budget-mb", "0")
    yield server
    server.stop()


# --------------------------------------------------------------------------------------------
# Load
# --------------------------------------------------------------------------------------------
QUESTIONS = ["Name a color.", "Name a fruit.", "Name an animal.", "Name a city.", "Name a tool.", "Name a planet.",
             "Name a metal.", "Name a tree.", "Name a river."]


def post_retrying(http: httpx.Client, server: Gateway, messages: list[dict[str, Any]], session: str,
                  refusals: Counter[int]) -> httpx.Response:
    """A client that honours 429/503 + Retry-After, as agents do; anything else is returned."""
    for _ in range(100):
        reply = chat(http, server, messages, session, max_tokens=4)
        if reply.status_code not in (429, 503):
            return reply
        refusals[reply.status_code] += 1
        time.sleep(float(reply.headers["Retry-After"]))
    raise AssertionError("refused 100 times in a row")


def converse(server: Gateway, client: int, refusals: Counter[int]) -> tuple[str, list[tuple[int, int, str]]]:
    session = f"load-{client}-{uuid.uuid4().hex}"
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": f"You are assistant number {client}. You answer with one word. " * 3},
        {"role": "user", "content": QUESTIONS[0]},
    ]
    turns: list[tuple[int, int, str]] = []
    with httpx.Client(timeout=300) as http:
        for turn in range(LOAD_TURNS):
            reply = post_retrying(http, server, messages, session, refusals)
            assert reply.status_code == 200, reply.text
            prompt, cached = usage(reply)
            turns.append((prompt, cached, reply.headers["X-PFlash-Restored-From"]))
            messages += [{"role": "assistant", "content": answer(reply)},
                         {"role": "user", "content": QUESTIONS[(turn + 1) % len(QUESTIONS)]}]
    return session, turns


def test_load_concurrent_multi_turn_sessions(live: Gateway) -> None:
    assert chat(None, live, [{"role": "user", "content": "warm up"}], max_tokens=1).status_code == 200
    rss_before = vm_rss(live.proc.pid)
    before = scrape(live.url)
    refusals: Counter[int] = Counter()
    started = time.perf_counter()
    with ThreadPoolExecutor(LOAD_CLIENTS) as pool:
        futures = [pool.submit(converse, live, i, refusals) for i in range(LOAD_CLIENTS)]
        done, pending = wait(futures, timeout=LOAD_DEADLINE_S)
        assert not pending, f"{len(pending)} clients still waiting after {LOAD_DEADLINE_S}s: deadlock?"
    elapsed = time.perf_counter() - started
    results = [f.result() for f in done]  # re-raises a client's assertion
    rss_after = vm_rss(live.proc.pid)
    assert live.proc.poll() is None
    assert set(refusals) <= {429, 503}

    for session, turns in results:
        for (prev_prompt, _, _), (prompt, cached, restored) in itertools.pairwise(turns):
            # The whole previous turn came back from the cache (restored from disk: no RAM tier).
            assert cached >= prev_prompt - 1, (session, turns)
            assert cached < prompt
            assert restored in ("context", "disk"), (session, turns)
        transcript = httpx.get(f"{live.url}/v1/sessions/{session}/transcript", timeout=30).json()["messages"]
        assert len(transcript) == 2 * LOAD_TURNS  # system + every question + every answer but the last
        assert transcript[-1] == {"role": "user", "content": QUESTIONS[(LOAD_TURNS - 1) % len(QUESTIONS)], "kind": "user"}
    assert rss_after - rss_before < RSS_GROWTH_LIMIT, (rss_before, rss_after)

    after = scrape(live.url)
    n = LOAD_CLIENTS * LOAD_TURNS
    assert_plausible_metrics(before, after, n, rss_after)
    print(f"\nload: {LOAD_CLIENTS} clients x {LOAD_TURNS} turns in {elapsed:.1f}s "
          f"({n / elapsed:.2f} turns/s), refusals {dict(refusals)}, RSS {rss_before >> 20} -> {rss_after >> 20} MiB")


def delta(before: Samples, after: Samples, name: str, **labels: str) -> float:
    return total(after, name, **labels) - total(before, name, **labels)


def assert_plausible_metrics(before: Samples, after: Samples, turns: int, rss: int) -> None:
    assert delta(before, after, "pflash_requests_total", api="openai", status="200") >= turns
    assert delta(before, after, "pflash_time_to_first_token_seconds_count", api="openai") >= turns
    ttft = delta(before, after, "pflash_time_to_first_token_seconds_sum", api="openai")
    latency = delta(before, after, "pflash_request_duration_seconds_sum", api="openai")
    assert 0 < ttft <= latency
    assert delta(before, after, "pflash_request_duration_seconds_bucket", api="openai", le="+Inf") >= turns
    reused = delta(before, after, "pflash_prefill_tokens_total", kind="reused")
    evaluated = delta(before, after, "pflash_prefill_tokens_total", kind="evaluated")
    assert reused > 0 and evaluated > 0 and reused > evaluated  # most of a follow-up comes from the cache
    assert delta(before, after, "pflash_completion_tokens_total") >= turns
    assert delta(before, after, "pflash_kv_restores_total", tier="disk") > 0
    assert delta(before, after, "pflash_store_writes_total") > 0
    assert delta(before, after, "pflash_store_reads_total") > 0
    assert value(after, "pflash_sessions", tier="disk") >= LOAD_CLIENTS - 1
    assert value(after, "pflash_sessions", tier="ram") == 0  # RAM budget 0
    assert value(after, "pflash_session_bytes", tier="disk") > 0
    assert value(after, "pflash_queue_depth") == 0
    assert value(after, "pflash_store_failures_total", op="write") == 0
    assert value(after, "pflash_kv_restore_failures_total") == 0
    assert value(after, "pflash_prefix_reuse_refused_total") == 0  # every session extended its prefix
    assert 0.5 * rss < value(after, "process_resident_memory_bytes") < 2 * rss


def test_compression_shows_in_metrics(live: Gateway) -> None:
    before = scrape(live.url)
    lines = "\n".join(f"2024-05-0{i % 9 + 1} 12:00:{i % 60:02d} worker-{i} INFO processed batch {i} ok" for i in range(60))
    messages = [{"role": "user", "content": "Which batch failed?"},
                {"role": "assistant", "content": None, "tool_calls": [
                    {"id": "call_log", "type": "function", "function": {"name": "read_log", "arguments": "{}"}}]},
                {"role": "tool", "tool_call_id": "call_log", "content": lines}]
    reply = chat(None, live, messages, "compress-" + uuid.uuid4().hex, max_tokens=2)
    assert reply.status_code == 200, reply.text
    after = scrape(live.url)
    events = delta(before, after, "pflash_compression_events_total")
    assert events == 1
    tokens_in = delta(before, after, "pflash_compression_tokens_total", direction="in")
    tokens_out = delta(before, after, "pflash_compression_tokens_total", direction="out")
    assert tokens_in == int(reply.headers["X-PFlash-Original-Tokens"]) and tokens_in >= 300
    if reply.headers["X-PFlash-Compressed"] == "true":
        assert 0 < tokens_out < tokens_in
        assert delta(before, after, "pflash_compression_events_total", outcome="compressed") == 1
    else:
        assert delta(before, after, "pflash_compression_events_total", outcome="fallback") == 1
    assert delta(before, after, "pflash_scorer_seconds_total", phase="compression") > 0


# --------------------------------------------------------------------------------------------
# Faults: clients that vanish
# --------------------------------------------------------------------------------------------
def raw_request(server: Gateway, body: dict[str, Any], session: str) -> tuple[bytes, bytes]:
    payload = json.dumps(body).encode()
    head = (f"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1:{server.port}\r\n"
            f"Content-Type: application/json\r\nContent-Length: {len(payload)}\r\n"
            f"X-Session-Id: {session}\r\nConnection: close\r\n\r\n").encode()  # a short answer ends in EOF
    return head, payload


def abandon(server: Gateway, body: dict[str, Any], session: str, rng: random.Random) -> str:
    """Send a request and leave at a random point: mid-body, right after sending, or mid-response;
    half the time with a RST instead of a FIN."""
    head, payload = raw_request(server, body, session)
    point = rng.choice(["mid-body", "after-send", "mid-response", "mid-response"])
    with socket.create_connection(("127.0.0.1", server.port), timeout=60) as sock:
        if rng.random() < 0.5:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))  # close = RST
        if point == "mid-body":
            sock.sendall(head + payload[: rng.randrange(0, len(payload))])
            return point
        sock.sendall(head + payload)
        if point == "after-send":
            return point
        want, got = rng.randrange(1, 1200), 0
        while got < want:
            chunk = sock.recv(want - got)
            if not chunk:
                break
            got += len(chunk)
        return f"{point}@{got}"


def test_clients_disconnecting_at_random_points(live: Gateway) -> None:
    rng = random.Random(7)
    session = "vanish-" + uuid.uuid4().hex
    first = [{"role": "user", "content": "List three colors."}]
    one = chat(None, live, first, session)
    assert one.status_code == 200
    second = [*first, {"role": "assistant", "content": answer(one)}, {"role": "user", "content": "Now three fruits."}]
    points = []
    for i in range(DISCONNECTS):
        body = {"model": "m", "messages": second, "max_tokens": 8, "temperature": 0, "stream": rng.random() < 0.7}
        points.append(abandon(live, body, session, rng))
    assert live.proc.poll() is None, points

    final = chat(None, live, second, session)
    assert final.status_code == 200, final.text
    prompt, cached = usage(final)
    assert 0 <= cached < prompt
    reference = chat(None, live, second, "reference-" + uuid.uuid4().hex)
    assert answer(final) == answer(reference)  # the session's state is consistent with a fresh prefill
    transcript = httpx.get(f"{live.url}/v1/sessions/{session}/transcript", timeout=30).json()["messages"]
    assert transcript == [{"role": m["role"], "content": m["content"], "kind": m["role"]} for m in second]
    assert httpx.get(live.url + "/health", timeout=30).json()["status"] == "ok"
    assert "Traceback" not in live.log(), live.log()[-4000:]


# --------------------------------------------------------------------------------------------
# Faults: kill -9 during a store write
# --------------------------------------------------------------------------------------------
BIG_SYSTEM = " ".join(f"rule{i}: keep functions short and named for what they do." for i in range(45))


def sigterm_then_kill(server: Gateway, store: Path, nth: int, deadline_s: float = 60) -> bool:
    """SIGTERM starts the shutdown flush, which writes one session after another; SIGKILL the
    moment the nth session's KV temp file exists. True if it was killed mid-write, False if the
    flush finished first (nth past the number of sessions)."""
    server.proc.send_signal(signal.SIGTERM)
    writing: set[Path] = set()
    deadline = time.time() + deadline_s
    while time.time() < deadline and server.proc.poll() is None:
        writing.update(tmp.parent for tmp in store.glob("sessions/*/*/.kv.zst.*.tmp"))
        if len(writing) >= nth:
            server.proc.kill()
            server.proc.wait()
            return True
        time.sleep(0.0005)
    if server.proc.poll() is None:
        server.proc.kill()
    server.proc.wait()
    return False


def test_kill_9_during_store_flush_then_restart(start_gateway, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    store = tmp_path / "killed"
    sessions = {f"big-{i}-{uuid.uuid4().hex}": [{"role": "system", "content": BIG_SYSTEM},
                                                 {"role": "user", "content": f"Summarise rule {i}."}]
                for i in range(2)}
    mid_write = 0
    last: dict[str, httpx.Response] = {}
    served: dict[str, list[tuple[int, int]]] = {s: [] for s in sessions}  # (prompt, completion) per turn
    for cycle in range(KILL_CYCLES + 1):
        server = start_gateway(*COMMON, store=store)
        for session, history in sessions.items():
            reply = chat(None, server, history, session, max_tokens=4)
            assert reply.status_code == 200, reply.text
            prompt, cached = usage(reply)
            # A stored state is either discarded (full prefill) or restored whole: then it covers
            # exactly some earlier turn (the last flush may have died before this session's write).
            assert cached == 0 or any(p - 1 <= cached <= p + c for p, c in served[session]), (cycle, cached, served)
            served[session].append((prompt, int(reply.json()["usage"]["completion_tokens"])))
            last[session] = reply
            history += [{"role": "assistant", "content": answer(reply)},
                        {"role": "user", "content": f"And rule {cycle + 10}?"}]
        if cycle < KILL_CYCLES:
            # Kill while writing the 2nd session (the 1st is safe), then the 1st (its previous
            # state is on disk), then let a flush finish; and around again in the soak run.
            mid_write += sigterm_then_kill(server, store, nth=(2, 1, 3)[cycle % 3])
    # The survivor serves every session like a fresh prefill would.
    for session, history in sessions.items():
        reference = chat(None, server, history[:-2], "ref-" + uuid.uuid4().hex, max_tokens=4)
        assert answer(reference) == answer(last[session])
    assert value(scrape(server.url), "pflash_kv_restore_failures_total") == 0
    assert mid_write >= 1
    print(f"\nkill -9: {KILL_CYCLES} shutdown flushes interrupted, {mid_write} with a KV file half-written; "
          f"sessions lost: 0")


# --------------------------------------------------------------------------------------------
# Faults: disk full
# --------------------------------------------------------------------------------------------
@pytest.fixture
def tiny_fs(tmp_path: Path) -> Iterator[Path]:
    mount_point = tmp_path / "tiny"
    mount_point.mkdir()
    result = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=3m", "tmpfs", str(mount_point)],
                            check=False, capture_output=True, text=True)
    if result.returncode != 0:
        pytest.skip(f"cannot mount a tiny tmpfs here: {result.stderr.strip()}")
    try:
        yield mount_point
    finally:
        subprocess.run(["umount", "-l", str(mount_point)], check=False, capture_output=True)


def test_disk_full_store_keeps_serving(start_gateway, tiny_fs: Path) -> None:  # type: ignore[no-untyped-def]
    server = start_gateway(*COMMON, "--ram-budget-mb", "0", store=tiny_fs)
    try:
        first = "full-0-" + uuid.uuid4().hex
        history = [{"role": "system", "content": BIG_SYSTEM[:300]}, {"role": "user", "content": "Say ok."}]
        replies = []
        for i in range(16):  # each switch writes the previous session (a few hundred KiB, zstd) to a 3 MiB disk
            session = first if i == 0 else f"full-{i}-" + uuid.uuid4().hex
            reply = chat(None, server, history, session, max_tokens=2)
            assert reply.status_code == 200, reply.text
            replies.append(reply)
        samples = scrape(server.url)
        assert value(samples, "pflash_store_failures_total", op="write") >= 1
        assert "store write failed" in server.log() and "No space left on device" in server.log()
        assert not list(tiny_fs.glob("sessions/*/*/.*.tmp"))  # a failed write leaves no temp file behind
        # Sessions written before the disk filled still restore; the rest are served by full prefill.
        again = chat(None, server, [*history, {"role": "assistant", "content": answer(replies[0])},
                                    {"role": "user", "content": "Again."}], first, max_tokens=2)
        assert again.status_code == 200
        assert usage(again)[1] >= usage(replies[0])[0] - 1 and again.headers["X-PFlash-Restored-From"] == "disk"
        assert httpx.get(server.url + "/health", timeout=30).status_code == 200
    finally:
        assert server.stop() == 0  # the shutdown flush fails too, and is only logged


# --------------------------------------------------------------------------------------------
# Fuzz
# --------------------------------------------------------------------------------------------
CANARIES = [Path("/tmp/pflash-fuzz-canary"), Path("/tmp/pflash-fuzz-canary-2")]
PATH_IDS = ["../../etc", "../../../../../../../../tmp/pflash-fuzz-canary", str(CANARIES[0]), "/etc/passwd", "..",
            ".", "a/../../b", "..\\..\\windows\\win.ini", "%2e%2e%2f%2e%2e%2f", "~root/.ssh", "sessions/../../../x",
            "../../../../../../tmp/pflash-fuzz-canary-2/x", " ", "-", "*", "$(touch /tmp/pflash-fuzz-canary)"]
ASCII = st.characters(min_codepoint=0x20, max_codepoint=0x7E)
# Header values: what HTTP can carry at all (no control characters, no surrounding blanks).
session_ids = (st.sampled_from(PATH_IDS) | st.text(ASCII, max_size=40)).map(str.strip)
body_session_ids = session_ids | st.sampled_from(["\x00", "../\x00/etc", "\ud800", "é/../é"]) | st.text(max_size=20)
odd_text = st.sampled_from(["", "hi", "Name a color.", "\ud800", "a\udfffb", "\x00", "\u2028", "😀" * 3, "é"])
texts = odd_text | st.text(max_size=60)
leaf = (st.none() | st.booleans() | st.integers(-(2**70), 2**70) | st.floats(allow_nan=True, allow_infinity=True)
        | texts)
any_json = st.recursive(leaf, lambda c: st.lists(c, max_size=4) | st.dictionaries(st.text(max_size=12), c, max_size=4),
                        max_leaves=12)
small_max = st.sampled_from([1, 1, 1, 0, -1, "1", 1.5, None, True, "many", [1]])  # never a long generation
ids = st.sampled_from(["call_1", "toolu_1", "", "call 1", "../x"]) | st.text(max_size=12)
names = st.sampled_from(["read_file", "", "bad name!", "a" * 300]) | st.text(max_size=12)


def either(valid: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    """Mostly the right type, sometimes anything at all."""
    return st.one_of(valid, valid, any_json)


def obj(required: dict[str, Any], optional: dict[str, Any]) -> st.SearchStrategy[dict[str, Any]]:
    return st.fixed_dictionaries(required, optional=optional)


functions = obj({"type": either(st.just("function")), "function": either(obj(
    {"name": names}, {"description": texts, "parameters": either(st.just({"type": "object", "properties": {}}))}))}, {})
openai_part = obj({"type": either(st.sampled_from(["text", "image_url", "input_text", "refusal"]))},
                  {"text": either(texts), "image_url": any_json})
openai_message = obj(
    {"role": either(st.sampled_from(["system", "user", "user", "assistant", "tool", "developer", "wizard"]))},
    {"content": either(texts | st.lists(openai_part, max_size=3)),
     "tool_calls": either(st.lists(obj({"id": ids, "type": either(st.just("function")),
                                        "function": either(obj({"name": names, "arguments": either(texts)}, {}))}, {}),
                                   max_size=2)),
     "tool_call_id": either(ids), "name": either(names)})
openai_body = obj(
    {"messages": either(st.lists(openai_message, max_size=4))},
    {"model": either(texts), "max_tokens": small_max, "max_completion_tokens": small_max,
     "stream": either(st.booleans()), "temperature": either(st.floats(0, 2)), "top_p": any_json,
     "seed": either(st.integers(-(2**70), 2**70)), "n": either(st.integers(0, 3)), "stop": any_json,
     "tools": either(st.lists(functions, max_size=2)), "tool_choice": either(st.sampled_from(["auto", "none", "required"])),
     "user": either(body_session_ids), "prompt_cache_key": either(body_session_ids),
     "metadata": either(obj({}, {"user_id": body_session_ids})),
     "stream_options": either(obj({}, {"include_usage": st.booleans()})), "response_format": any_json})

anthropic_block = obj(
    {"type": either(st.sampled_from(["text", "text", "tool_use", "tool_result", "image", "thinking", "document"]))},
    {"text": either(texts), "id": either(ids), "name": either(names), "input": any_json, "tool_use_id": either(ids),
     "content": either(texts | st.lists(obj({"type": st.just("text"), "text": texts}, {}), max_size=2)),
     "cache_control": any_json, "source": any_json})
anthropic_message = obj({"role": either(st.sampled_from(["user", "user", "assistant", "system"])),
                         "content": either(texts | st.lists(anthropic_block, max_size=3))}, {})
legacy_user_ids = st.builds(lambda s: f"user_abc_account_def_session_{s}", session_ids)
json_user_ids = st.builds(lambda s: json.dumps({"session_id": s}), body_session_ids)
anthropic_body = obj(
    {"max_tokens": small_max, "messages": either(st.lists(anthropic_message, max_size=4))},
    {"model": either(texts), "system": either(texts | st.lists(anthropic_block, max_size=2)),
     "stream": either(st.booleans()), "temperature": either(st.floats(0, 1)), "top_k": any_json,
     "stop_sequences": either(st.lists(texts, max_size=3)), "thinking": any_json,
     "tools": either(st.lists(obj({"name": names}, {"description": texts, "input_schema": any_json}), max_size=2)),
     "tool_choice": either(obj({"type": st.sampled_from(["auto", "any", "tool", "none"])}, {"name": names})),
     "metadata": either(obj({}, {"user_id": either(body_session_ids | legacy_user_ids | json_user_ids)}))})

responses_part = obj({"type": either(st.sampled_from(["input_text", "output_text", "input_image"]))},
                     {"text": either(texts)})
responses_item = st.one_of(
    obj({"role": either(st.sampled_from(["user", "assistant", "system", "developer"]))},
        {"type": either(st.just("message")), "content": either(texts | st.lists(responses_part, max_size=2))}),
    obj({"type": st.just("function_call"), "call_id": either(ids), "name": either(names)},
        {"arguments": either(texts), "id": ids}),
    obj({"type": st.just("function_call_output"), "call_id": either(ids)}, {"output": either(texts)}),
    any_json,
)
responses_body = obj(
    {"input": either(texts | st.lists(responses_item, max_size=4))},
    {"model": either(texts), "instructions": either(texts), "max_output_tokens": small_max,
     "stream": either(st.booleans()), "temperature": either(st.floats(0, 2)),
     "tools": either(st.lists(obj({"type": st.just("function"), "name": names},
                                  {"parameters": any_json, "description": texts}), max_size=2)),
     "tool_choice": any_json, "previous_response_id": either(ids), "store": either(st.booleans()),
     "prompt_cache_key": either(body_session_ids), "user": either(body_session_ids), "reasoning": any_json})

API_BODIES = {"/v1/chat/completions": openai_body, "/v1/messages": anthropic_body, "/v1/responses": responses_body}

# Valid requests (one token each) with odd text and odd session hints: they reach the engine and
# the store.
hints = {"user": body_session_ids, "prompt_cache_key": body_session_ids,
         "metadata": obj({}, {"user_id": body_session_ids | legacy_user_ids | json_user_ids})}
user_turns = st.lists(obj({"role": st.just("user"), "content": texts}, {}), min_size=1, max_size=2)
VALID_BODIES = {
    "/v1/chat/completions": obj({"messages": user_turns, "max_tokens": st.just(1)},
                                {"stream": st.booleans(), "temperature": st.floats(0, 1), **hints}),
    "/v1/messages": obj({"messages": user_turns, "max_tokens": st.just(1)},
                        {"stream": st.booleans(), "system": texts, **hints}),
    "/v1/responses": obj({"input": texts | user_turns, "max_output_tokens": st.just(1)},
                         {"stream": st.booleans(), "instructions": texts, **hints}),
}


def _json_bytes(value: Any) -> bytes:
    # allow_nan: NaN/Infinity are not JSON, but Python's parser accepts them; lone surrogates ride
    # as \ud800 escapes.
    return json.dumps(value, allow_nan=True).encode()


@st.composite
def fuzz_case(draw: st.DrawFn, path: str) -> tuple[bytes, dict[str, str]]:
    kind = draw(st.integers(0, 99))
    body = draw(VALID_BODIES[path] if kind < 12 else API_BODIES[path])
    raw = _json_bytes(body)
    if 60 <= kind < 72:
        raw = _json_bytes(draw(any_json))
    elif 72 <= kind < 78:  # truncated
        raw = raw[: draw(st.integers(0, max(0, len(raw) - 1)))]
    elif 78 <= kind < 84:  # invalid UTF-8 spliced in
        at = draw(st.integers(0, len(raw)))
        raw = raw[:at] + draw(st.sampled_from([b"\xff", b"\xc3\x28", b"\xed\xa0\x80", b"\xf0\x28\x8c\x28", b"\x80"])) + raw[at:]
    elif 84 <= kind < 90:  # deep nesting, bare or inside a field
        depth = draw(st.sampled_from([64, 999, 1001, 5000, 200_000]))
        nest = b"[" * depth + b"]" * depth if draw(st.booleans()) else b'{"a":' * depth + b"1" + b"}" * depth
        raw = nest if draw(st.booleans()) else raw[:-1] + b', "content": ' + nest + b"}" if raw.endswith(b"}") else nest
    elif 90 <= kind < 95:  # huge strings: under and over the 1 MiB body limit
        size = draw(st.sampled_from([100_000, 700_000, 1_100_000]))
        field = draw(st.sampled_from(["model", "user", "prompt_cache_key", "junk"]))
        raw = raw[:-1] + f', "{field}": "'.encode() + b"x" * size + b'"}' if raw.endswith(b"}") else b'"' + b"x" * size + b'"'
    elif 95 <= kind < 100:
        raw = draw(st.binary(max_size=300))
    headers = {"Content-Type": draw(st.sampled_from(["application/json", "text/plain", "application/x-www-form-urlencoded"]))}
    if draw(st.booleans()):
        headers["X-Session-Id"] = draw(session_ids)
    if draw(st.integers(0, 9)) == 0:
        headers["x-claude-code-session-id"] = draw(session_ids)
    return raw, headers


def check_answer(response: httpx.Response, path: str) -> None:
    assert response.status_code < 500, (response.status_code, response.text[:500])
    if response.status_code == 200:
        return
    assert response.status_code in (400, 404, 413, 422, 429, 503), response.text[:300]
    body = response.json()
    if path == "/v1/messages":
        assert body["type"] == "error" and body["error"]["message"], body
    else:
        assert body["error"]["message"] and body["error"]["type"], body


@pytest.fixture(scope="module")
def fuzz_target(tmp_path_factory: pytest.TempPathFactory, model_path: Path) -> Iterator[Gateway]:
    root = tmp_path_factory.mktemp("fuzz")
    for canary in CANARIES:
        assert not canary.exists(), f"{canary} exists before the fuzz run: remove it"
    server = Gateway(root / "store", model_path, *COMMON, "--max-body-mb", "1", "--ram-budget-mb", "64")
    yield server
    if server.proc.poll() is None:
        server.stop()


@pytest.mark.parametrize("path", list(API_BODIES))
def test_fuzzed_bodies_never_5xx(fuzz_target: Gateway, path: str) -> None:
    statuses: Counter[int] = Counter()
    with httpx.Client(base_url=fuzz_target.url, timeout=120) as http:

        @settings(max_examples=FUZZ_EXAMPLES, deadline=None, database=None, derandomize=not SOAK,
                  suppress_health_check=list(HealthCheck))
        @given(case=fuzz_case(path))
        def run(case: tuple[bytes, dict[str, str]]) -> None:
            raw, headers = case
            response = http.post(path, content=raw, headers=headers)
            statuses[response.status_code] += 1
            check_answer(response, path)

        run()
    assert fuzz_target.proc.poll() is None, "the gateway died"
    assert httpx.get(fuzz_target.url + "/health", timeout=30).json()["status"] == "ok"
    assert sum(statuses.values()) >= FUZZ_EXAMPLES
    assert statuses[200] > 0 and statuses[400] > 0, statuses  # both sides of the parser were reached
    print(f"\nfuzz {path}: {dict(sorted(statuses.items()))}")


HEX64 = re.compile(r"^[0-9a-f]{64}$")
HEX16 = re.compile(r"^[0-9a-f]{16}$")


def test_fuzz_left_no_file_outside_the_store(fuzz_target: Gateway) -> None:
    """After the fuzz runs (this test comes last in the module), stop the server so every session
    is flushed, then look at everything the server could have written."""
    assert fuzz_target.stop() == 0
    store = fuzz_target.store
    for canary in CANARIES:
        assert not canary.exists()
    for item in store.parent.iterdir():  # the fuzz root: only the store and the server's log
        assert item == store or item == fuzz_target.log_path, item
    stored = 0
    for item in store.rglob("*"):
        parts = item.relative_to(store).parts
        if parts in ((".lock",), ("sessions", ".current")):  # the store's advisory lock, and the
            continue  # pointer to the fingerprint directory the last server used (sessions/layout.py)
        if parts[0] == "checkpoints":  # prefix checkpoints: <fingerprint>/<sha256 of the token ids>.kv
            assert len(parts) == 1 or HEX16.match(parts[1]), item
            assert len(parts) <= 2 or (len(parts) == 3 and HEX64.match(parts[2].removesuffix(".kv"))
                                       and parts[2].endswith(".kv")), item
            continue
        assert parts[0] == "sessions", item
        if len(parts) >= 2:
            assert HEX16.match(parts[1]), item
        if len(parts) >= 3:
            assert HEX64.match(parts[2]), item
            stored += len(parts) == 3
        if len(parts) == 4:
            assert parts[3] in (META, KV), item
        assert len(parts) <= 4, item
    assert stored > 0  # sessions were written, all of them under hashed names
    assert not [p for p in ROOT.iterdir() if "canary" in p.name or p.name in ("etc", "passwd", "x", "b")]
