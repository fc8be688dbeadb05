"""Timing measurements against live gateways (side by side in one run, reported as ratios):
gateway overhead vs llama-cpp-python direct, resume-from-disk vs full prefill, time to first token
with compression vs full prefill, and throughput under concurrent sessions."""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import signal
import statistics
import threading
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import zstandard

from gateway.process import GatewayProcess
from sessions.layout import KV, read_kv_header

Progress = Callable[[str], None]


def wait_until_up(proc: Any, url: str, name: str, log: Path, timeout: float = 300) -> None:
    """Wait until a server we started answers 200 at `url`; RuntimeError with its log's end if it
    exits or does not answer in time."""
    deadline = time.time() + timeout
    while time.time() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{name} exited: {log.read_text(errors='replace')[-2000:]}")
        try:
            if httpx.get(url, timeout=1).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.3)
    raise RuntimeError(f"{name} did not start in {timeout:.0f} s")


def percentile(values: Sequence[float], q: float) -> float:
    return float(np.percentile(np.asarray(values, dtype=float), q))


def chat(url: str, session: str, messages: list[dict[str, Any]], max_tokens: int = 1,
         timeout: float = 900, client: httpx.Client | None = None) -> tuple[float, dict[str, Any], httpx.Headers]:
    """One non-stream turn; with max_tokens=1 its wall time is the time to first token. Pass a
    client to reuse its connection, as SDK clients do."""
    body = {"model": "m", "messages": messages, "max_tokens": max_tokens, "temperature": 0}
    post = client.post if client is not None else httpx.post
    started = time.perf_counter()
    response = post(url + "/v1/chat/completions", json=body, headers={"X-Session-Id": session}, timeout=timeout)
    elapsed = time.perf_counter() - started
    response.raise_for_status()
    return elapsed, response.json(), response.headers


@dataclass(frozen=True)
class StreamedTurn:
    ttft: float  # seconds from sending to the first generated chunk (the whole turn if none came)
    usage: dict[str, Any]  # the final usage chunk, when the server sends one
    headers: httpx.Headers
    status: int


def stream_turn(url: str, body: dict[str, Any], headers: dict[str, str] | None = None,
                timeout: float = 1800) -> StreamedTurn:
    """POST a streamed chat turn and read it to its end (the server is idle again when this
    returns): the time to the first generated chunk (text, a tool call or a finish), the usage."""
    started = time.perf_counter()
    first: float | None = None
    usage: dict[str, Any] = {}
    with httpx.stream("POST", url + "/v1/chat/completions", json={**body, "stream": True}, headers=headers,
                      timeout=timeout) as response:
        if response.status_code != 200:
            response.read()
            return StreamedTurn(time.perf_counter() - started, {}, response.headers, response.status_code)
        for line in response.iter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[6:])
            if chunk.get("usage"):
                usage = chunk["usage"]
            choices = chunk.get("choices") or []
            delta = (choices[0].get("delta") or {}) if choices else {}
            if first is None and choices and (delta.get("content") or delta.get("tool_calls")
                                              or choices[0].get("finish_reason")):
                first = time.perf_counter() - started
        return StreamedTurn(first if first is not None else time.perf_counter() - started, usage,
                            response.headers, 200)


def ttft_stream(url: str, session: str, messages: list[dict[str, Any]], timeout: float = 1800) -> tuple[float, httpx.Headers]:
    """A session's streamed turn of 4 greedy tokens: its time to first token and its headers."""
    turn = session_turn(url, session, {"model": "m", "messages": messages, "max_tokens": 4, "temperature": 0},
                        timeout)
    return turn.ttft, turn.headers


def session_turn(url: str, session: str, body: dict[str, Any], timeout: float = 1800) -> StreamedTurn:
    """A session's streamed turn; RuntimeError unless it answered 200."""
    turn = stream_turn(url, body, {"X-Session-Id": session}, timeout)
    if turn.status != 200:
        raise RuntimeError(f"HTTP {turn.status} from {url}")
    return turn


# --- realistic agent histories ------------------------------------------------------------------

def agent_history(sessions: list[dict[str, Any]], target_tokens: int, count: Callable[[str], int]) -> list[dict[str, str]]:
    """A coding-agent history of about target_tokens: real sessions' messages, in order, stitched."""
    messages: list[dict[str, str]] = [{"role": "system", "content": "You are a software engineering agent. "
                                       "You solve issues by running one bash command per turn."}]
    total = count(messages[0]["content"])
    for session in sessions:
        for message in session["messages"]:
            if message["role"] not in ("user", "assistant"):
                continue
            text = message["content"][:6000]
            tokens = count(text) + 6
            if total + tokens > target_tokens:
                if messages[-1]["role"] == "assistant":
                    messages.append({"role": "user", "content": "Continue."})
                return messages
            if messages[-1]["role"] == message["role"]:
                messages[-1]["content"] += "\n" + text
            else:
                messages.append({"role": message["role"], "content": text})
            total += tokens
    if messages[-1]["role"] != "user":
        messages.append({"role": "user", "content": "Continue."})
    return messages


# --- overhead: gateway vs llama-cpp-python direct ---------------------------------------------

@dataclass
class OverheadResult:
    direct_ms: list[float]
    gateway_ms: list[float]


def measure_overhead(model: Path, work: Path, turns: int, progress: Progress) -> OverheadResult:
    """A short cached turn (a few new tokens on a cached ~300-token prefix, one output token),
    through the gateway over HTTP and with llama-cpp-python called directly, interleaved."""
    from llama_cpp import Llama

    from engine.chat_templates import builtin_template
    from policies.conversation_types import Message

    template = builtin_template("gemma")
    base = [Message("system", "You are a helpful coding assistant. " * 20)]
    threads = os.cpu_count() or 1  # the gateway uses every core too
    llm = Llama(model_path=str(model), n_ctx=4096, n_threads=threads, n_threads_batch=threads, swa_full=False,
                verbose=False, seed=0)
    server = GatewayProcess(work / "overhead-store", "--model", str(model), "--n-ctx", "4096")
    direct: list[float] = []
    through: list[float] = []
    history = [{"role": "system", "content": base[0].content}]
    connection = httpx.Client()  # one keep-alive connection, as an SDK client keeps
    try:
        for i in range(turns + 3):
            question = f"Question {i}: what is {i} + {i}?"
            # Direct: render, tokenize, evaluate past the common prefix, sample one token.
            started = time.perf_counter()
            text = template.render([*base, Message("user", question)], [], add_generation_prompt=True)
            tokens = llm.tokenize(text.encode(), add_bos=True, special=True)
            common = 0
            while common < min(llm.n_tokens, len(tokens) - 1) and llm.input_ids[common] == tokens[common]:
                common += 1
            llm.n_tokens = common
            llm.eval(tokens[common:])
            sampler = llm._init_sampler(temp=0.0)
            sampler.sample(llm._ctx, -1)
            direct_s = time.perf_counter() - started
            gateway_s, _body, _headers = chat(server.url, "overhead", [*history, {"role": "user", "content": question}],
                                              client=connection)
            if i >= 3:  # warm-up turns excluded
                direct.append(direct_s * 1000)
                through.append(gateway_s * 1000)
            progress(f"overhead {i + 1}/{turns + 3}")
    finally:
        connection.close()
        server.stop()
    return OverheadResult(direct, through)


# --- resume after restart ------------------------------------------------------------------------

def rotated(paths: Sequence[str], rep: int) -> list[str]:
    """The paths of one repetition, the first one rotating: no path always runs first."""
    k = rep % len(paths)
    return [*paths[k:], *paths[:k]]


@dataclass
class ResumeResult:
    tokens: int
    full_s: list[float]  # one per repetition
    warm_s: list[float]  # resumed with the KV file in the page cache
    cold_s: list[float]  # resumed with the KV file evicted from the page cache
    restored_from: list[str]
    kv_raw_bytes: int
    kv_zstd_planes_bytes: int
    kv_zstd_plain_bytes: int
    kv_tokens: int
    store_save_s: list[float]  # one per repetition
    store_load_s: list[float]  # page cache cold (the file evicted first)
    new_tokens: list[int]  # per resumed turn: prompt tokens not served from the restored state


def drop_from_page_cache(path: Path) -> None:
    """Evict a file from the page cache (after an fsync, so no dirty page stays behind)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)


def measure_resume(model: Path, work: Path, history: list[dict[str, str]], n_ctx: int, reps: int,
                   progress: Progress) -> ResumeResult:
    """Serve `history` once and stop the server (it flushes the session to its store); then, `reps`
    times and interleaved, time the session's next turn on a new server over a copy of that store
    (page cache warm, then evicted) and on a server with an empty store (full prefill)."""
    from engine.base import SavedState
    from sessions.record import SessionRecord
    from sessions import kv_codec
    from sessions.store import SessionStore

    flags = ("--model", str(model), "--n-ctx", str(n_ctx), "--threshold", "1000000000")
    session = "resume-" + uuid.uuid4().hex
    store = work / f"resume-{uuid.uuid4().hex[:8]}"
    server = GatewayProcess(store, *flags)
    try:
        _t, first, _h = chat(server.url, session, history, max_tokens=8)
    finally:
        server.stop(signal.SIGTERM)
    progress("stopped (flushed)")
    reply = first["choices"][0]["message"]["content"] or ""
    follow = [*history, {"role": "assistant", "content": reply},
              {"role": "user", "content": "Summarise what you found so far in one sentence."}]

    path = next(p for p in (store / "sessions").glob("*/*") if p.is_dir())
    data = (path / KV).read_bytes()
    header, start = read_kv_header(data)
    raw = bytes(kv_codec.decode(memoryview(data)[start:-4], header["frames"], np.empty(header["raw_bytes"], np.uint8)))
    packed = data[start:-4]
    plain = len(zstandard.ZstdCompressor(level=1).compress(raw))
    # Store save/load times on this real state, outside the server.
    probe = SessionStore(work / f"probe-{uuid.uuid4().hex[:8]}", "probe", zstd_level=1)
    record = SessionRecord(session_id=hashlib.sha256(session.encode()).hexdigest(), tenant="")
    state = SavedState(tuple(header["tokens"]), raw)
    probe.save_record(record.to_dict())
    save_s, load_s = [], []
    for _rep in range(reps):
        started = time.perf_counter()
        probe.save_kv(record.session_id, state)
        save_s.append(time.perf_counter() - started)
        drop_from_page_cache(probe.dir / record.session_id / KV)
        started = time.perf_counter()
        probe.load_state(record.session_id)
        load_s.append(time.perf_counter() - started)

    times: dict[str, list[float]] = {"full": [], "warm": [], "cold": []}
    restored: list[str] = []
    new_tokens: list[int] = []
    body = {"model": "m", "messages": follow, "max_tokens": 4, "temperature": 0,
            "stream_options": {"include_usage": True}}
    for rep in range(reps):
        for kind in rotated(list(times), rep):
            target = work / f"{kind}-{uuid.uuid4().hex[:8]}"
            if kind != "full":  # a copy of the flushed store: every repetition resumes the same state
                shutil.copytree(store, target)
                if kind == "cold":
                    for file in target.rglob("*"):
                        if file.is_file():
                            drop_from_page_cache(file)
            resumed = GatewayProcess(target, *flags)
            try:
                turn = session_turn(resumed.url, session, body)
            finally:
                resumed.stop()
                shutil.rmtree(target, ignore_errors=True)
            times[kind].append(turn.ttft)
            if kind != "full":  # a streamed turn's headers leave before its prefill: the log says
                found = re.search(r"KV restored from (\w+)", resumed.log())
                restored.append(found.group(1) if found else "none")
                cached = (turn.usage.get("prompt_tokens_details") or {}).get("cached_tokens", 0)
                new_tokens.append(int(turn.usage.get("prompt_tokens", 0)) - int(cached))
        progress(f"repetition {rep + 1}/{reps}")
    return ResumeResult(
        tokens=int(first["usage"]["prompt_tokens"]), full_s=times["full"], warm_s=times["warm"],
        cold_s=times["cold"], restored_from=restored, kv_raw_bytes=len(raw), kv_zstd_planes_bytes=len(packed),
        kv_zstd_plain_bytes=plain, kv_tokens=len(header["tokens"]), store_save_s=save_s, store_load_s=load_s,
        new_tokens=new_tokens,
    )


# --- time to first token with compression --------------------------------------------------------

@dataclass
class TtftResult:
    tool_tokens: int
    full_s: list[float]  # one per repetition
    compressed_s: list[float]
    kept_tokens: int
    scorer: str
    scorer_s: list[float]


def tool_output_turn(request: str, output: str) -> list[dict[str, Any]]:
    """An agent turn whose new message is the tool output `output` of a call made for `request`."""
    return [
        {"role": "system", "content": "You are a software engineering agent."},
        {"role": "user", "content": request},
        {"role": "assistant", "content": "", "tool_calls": [
            {"id": "call_1", "type": "function", "function": {"name": "bash", "arguments": '{"command": "cat log"}'}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": output},
    ]


def measure_ttft(model: Path, work: Path, output: str, request: str, n_ctx: int, scorer: str, reps: int,
                 progress: Progress, drafter: Path | None = None) -> TtftResult:
    """One agent turn whose new tool output is `output`: served whole (threshold out of reach) and
    compressed (threshold at its default), each on a fresh gateway, scorer time included, `reps`
    times, interleaved. The drafter is the model itself unless given."""
    messages = tool_output_turn(request, output)
    common = ("--model", str(model), "--drafter", str(drafter or model), "--n-ctx", str(n_ctx), "--scorer", scorer)
    flags = {"compressed": ("--threshold", "16384"), "full": ("--threshold", "1000000000")}
    times: dict[str, list[float]] = {"compressed": [], "full": []}
    scorer_s: list[float] = []
    headers = httpx.Headers()
    for rep in range(reps):
        for label in rotated(list(times), rep):
            server = GatewayProcess(work / f"ttft-{label}-{uuid.uuid4().hex[:8]}", *common, *flags[label])
            try:
                elapsed, got = ttft_stream(server.url, "ttft", messages)
            finally:
                server.stop()
                shutil.rmtree(server.store, ignore_errors=True)
            times[label].append(elapsed)
            if label == "compressed":
                headers = got
                scorer_s.append(float(got.get("X-PFlash-Scorer-Ms", 0)) / 1000)
        progress(f"repetition {rep + 1}/{reps}")
    return TtftResult(
        tool_tokens=int(headers.get("X-PFlash-Original-Tokens", 0)), full_s=times["full"],
        compressed_s=times["compressed"], kept_tokens=int(headers.get("X-PFlash-Kept-Tokens", 0)),
        scorer=headers.get("X-PFlash-Scorer", scorer), scorer_s=scorer_s,
    )


# --- load: concurrent sessions that move state ---------------------------------------------------

_RESTORED = re.compile(r"KV restored from (\w+) \((\d+) tokens, ([\d.]+) MB\)")


@dataclass
class LoadResult:
    sessions: int
    requests: int
    errors: int
    seconds: float
    latencies_ms: list[float]
    restored_mb: dict[str, float]  # state moved back into the context, by tier it came from


def restored_since(log: str, offset: int) -> dict[str, float]:
    """MB of session state restored into the context since `offset` of a gateway's log, by tier."""
    moved: dict[str, float] = {}
    for tier, _tokens, mb in _RESTORED.findall(log[offset:]):
        moved[tier] = moved.get(tier, 0.0) + float(mb)
    return moved


def prepare_sessions(url: str, histories: list[list[dict[str, str]]], run: str) -> list[list[dict[str, str]]]:
    """Serve each history once (its full prefill), so later turns find a state to restore."""
    out = []
    for index, history in enumerate(histories):
        _t, body, _h = chat(url, f"load-{run}-{index}", history, max_tokens=2)
        out.append([*history, {"role": "assistant", "content": body["choices"][0]["message"]["content"] or ""}])
    return out


def measure_load(server: GatewayProcess, histories: list[list[dict[str, str]]], run: str, turns: int) -> LoadResult:
    """One client per history, each taking `turns` short turns of its own session at once; with
    more than one, every turn switches the engine to another session's state. The histories are
    extended in place with what was served."""
    latencies: list[float] = []
    errors = 0
    lock = threading.Lock()

    def client(index: int) -> None:
        nonlocal errors
        history = list(histories[index])
        for turn in range(turns):
            history.append({"role": "user", "content": f"Turn {turn}: what is the next step? One line."})
            try:
                elapsed, body, _headers = chat(server.url, f"load-{run}-{index}", history, max_tokens=4, timeout=900)
                history.append({"role": "assistant", "content": body["choices"][0]["message"]["content"] or ""})
                with lock:
                    latencies.append(elapsed * 1000)
            except httpx.HTTPError:
                with lock:
                    errors += 1
                history.pop()
        histories[index] = history  # the session as served: the next level goes on from it

    offset = len(server.log())
    seconds = at_once(client, len(histories))
    return LoadResult(len(histories), len(histories) * turns, errors, seconds, latencies,
                      restored_since(server.log(), offset))


def at_once(client: Callable[[int], None], n: int, timeout: float = 1800) -> float:
    """Run `client(0)` .. `client(n - 1)` on threads at once; the wall time until all ended."""
    started = time.perf_counter()
    threads = [threading.Thread(target=client, args=(i,)) for i in range(n)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout)
    return time.perf_counter() - started


def summary_ms(values: Sequence[float]) -> tuple[float, float]:
    return (statistics.median(values), percentile(values, 99)) if values else (float("nan"), float("nan"))
