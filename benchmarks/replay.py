"""Whole-session replay: real agent sessions sent turn by turn, exactly as the agent sent them, to
several servers at once, so every server answers the same requests.

Each turn carries the full history up to the next recorded user message, with the recorded
assistant messages (not any server's own output), so the requests are identical for every server.
The turns of all sessions are interleaved (three agents on one workstation), and within a turn the
servers take turns going first, so a slow minute of the machine does not fall on one server only.

Servers: the gateway (`GatewayTarget`), llama.cpp's own llama-server, what users run
(`LlamaCppServerTarget`), llama-cpp-python's OpenAI server with its prompt cache (`LlamaServerTarget`),
and the floor (`FloorTarget`): llama-cpp-python called in-process, one
context per session, prefilling only each turn's new tokens: what those tokens alone cost.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol


from benchmarks.capture_replay import LLAMA_SERVER_PREFILLED, LlamaServer, metric_total
from benchmarks.timing import stream_turn, wait_until_up
from gateway.process import GatewayProcess, free_port


@dataclass
class TurnResult:
    target: str
    session: int
    turn: int
    ttft_s: float
    prompt_tokens: int
    cached_tokens: int
    original_tokens: int = 0  # a compressed new message: its tokens before ...
    kept_tokens: int = 0  # ... and after compression
    overflow: bool = False  # refused: the prompt did not fit the context


class Target(Protocol):
    name: str

    def turn(self, session: int, turn: int, messages: list[dict[str, str]], max_tokens: int) -> TurnResult: ...
    def restart(self) -> None: ...
    def stop(self) -> None: ...


class GatewayTarget:
    """A `pflash-gateway serve` process; restarts keep its store, as a service restart does."""

    def __init__(self, name: str, store: Path, flags: Sequence[str]) -> None:
        self.name, self._store, self._flags = name, store, tuple(flags)
        self._server = GatewayProcess(store, *self._flags, ready_timeout=300)

    def turn(self, session: int, turn: int, messages: list[dict[str, str]], max_tokens: int) -> TurnResult:
        body = {"model": "m", "messages": messages, "max_tokens": max_tokens, "temperature": 0,
                "stream_options": {"include_usage": True}}
        got = stream_turn(self._server.url, body, timeout=1800)
        if got.status != 200 and got.status != 400:
            raise RuntimeError(f"{self.name}: HTTP {got.status} at session {session} turn {turn}")
        details = got.usage.get("prompt_tokens_details") or {}
        compressed = got.headers.get("X-PFlash-Compressed") == "true"
        return TurnResult(
            self.name, session, turn, got.ttft, int(got.usage.get("prompt_tokens", 0)),
            int(details.get("cached_tokens", 0)),
            original_tokens=int(got.headers.get("X-PFlash-Original-Tokens", 0)) if compressed else 0,
            kept_tokens=int(got.headers.get("X-PFlash-Kept-Tokens", 0)) if compressed else 0,
            overflow=got.status == 400,
        )

    def restart(self) -> None:
        self._server.stop()  # SIGTERM: the gateway flushes every session to its store
        self._server = GatewayProcess(self._store, *self._flags, ready_timeout=300)

    def stop(self) -> None:
        self._server.stop()


class LlamaCppServerTarget:
    """llama.cpp's llama-server at its defaults (its prompt cache on, in RAM: a restart loses it). The
    tokens it prefilled are read from its /metrics around each turn (turns are sent one at a time)."""

    def __init__(self, binary: Path, model: Path, n_ctx: int, work: Path) -> None:
        self.name = f"llama-server {binary.name.removeprefix('llama-server-')}"
        self._start_args = (binary, model, n_ctx, work / f"llama-server-{uuid.uuid4().hex[:8]}.log")
        work.mkdir(parents=True, exist_ok=True)
        self._server = LlamaServer(*self._start_args)

    def turn(self, session: int, turn: int, messages: list[dict[str, str]], max_tokens: int) -> TurnResult:
        url = self._server.url
        before = metric_total(url, LLAMA_SERVER_PREFILLED)
        body = {"model": "m", "messages": messages, "max_tokens": max_tokens, "temperature": 0,
                "stream_options": {"include_usage": True}}
        got = stream_turn(url, body, timeout=3600)
        prefilled = metric_total(url, LLAMA_SERVER_PREFILLED) - before
        prompt = int(got.usage.get("prompt_tokens", 0))
        return TurnResult(self.name, session, turn, got.ttft, prompt, max(prompt - int(prefilled), 0),
                          overflow=got.status == 400)

    def restart(self) -> None:
        self._server.stop()
        self._server = LlamaServer(*self._start_args)

    def stop(self) -> None:
        self._server.stop()


_PREFIX_HIT = re.compile(r"Llama\.generate: (\d+) prefix-match hit, remaining (\d+) prompt tokens to eval")


class LlamaServerTarget:
    """`python -m llama_cpp.server` with its RAM prompt cache on: what a user would otherwise run.
    It does not report cached tokens, so they are read from its verbose log, one line per turn."""

    name = "llama_cpp.server"

    def __init__(self, model: Path, n_ctx: int, work: Path, threads: int) -> None:
        self._args = [sys.executable, "-m", "llama_cpp.server", "--model", str(model), "--n_ctx", str(n_ctx),
                      "--cache", "true", "--cache_type", "ram", "--logits_all", "false", "--n_threads", str(threads),
                      "--n_threads_batch", str(threads), "--verbose", "true", "--host", "127.0.0.1"]
        self._log_path = work / f"llama-server-{uuid.uuid4().hex[:8]}.log"
        work.mkdir(parents=True, exist_ok=True)
        self._start()

    def _start(self) -> None:
        port = free_port()
        self.url = f"http://127.0.0.1:{port}"
        self._log = self._log_path.open("ab")
        self._offset = self._log_path.stat().st_size
        self._proc = subprocess.Popen([*self._args, "--port", str(port)], stdout=self._log, stderr=subprocess.STDOUT,
                                      env={**os.environ, "PYTHONUNBUFFERED": "1"})
        wait_until_up(self._proc, self.url + "/v1/models", "llama_cpp.server", self._log_path)

    def _new_log(self) -> str:
        with self._log_path.open("rb") as fh:
            fh.seek(self._offset)
            data = fh.read()
        self._offset += len(data)
        return data.decode(errors="replace")

    def turn(self, session: int, turn: int, messages: list[dict[str, str]], max_tokens: int) -> TurnResult:
        self._new_log()
        body = {"model": "m", "messages": messages, "max_tokens": max_tokens, "temperature": 0}
        got = stream_turn(self.url, body, timeout=3600)
        time.sleep(0.05)  # its log line is written before the first chunk; let the file catch up
        hits = _PREFIX_HIT.findall(self._new_log())
        cached, remaining = (int(hits[-1][0]), int(hits[-1][1])) if hits else (0, 0)
        return TurnResult(self.name, session, turn, got.ttft, cached + remaining, cached, overflow=got.status == 400)

    def restart(self) -> None:
        self.stop()
        self._start()

    def stop(self) -> None:
        if self._proc.poll() is None:
            self._proc.terminate()
            try:
                self._proc.wait(60)
            except subprocess.TimeoutExpired:
                self._proc.kill()
                self._proc.wait()
        self._log.close()


class FloorTarget:
    """llama-cpp-python in-process, one context per session, with the gateway's engine settings
    and chat template: each turn prefills only what its previous turn did not, then samples one
    token. Session switches and restarts cost it nothing: it is the lower bound, not a server."""

    name = "floor (new tokens only)"

    def __init__(self, model: Path, n_ctx: int, threads: int) -> None:
        self._make = lambda: _floor_context(model, n_ctx, threads)
        self._contexts: dict[int, Any] = {}

    def turn(self, session: int, turn: int, messages: list[dict[str, str]], max_tokens: int) -> TurnResult:
        from policies.conversation_types import Message

        llm, template = self._contexts.get(session) or self._contexts.setdefault(session, self._make())
        started = time.perf_counter()
        text = template.render([Message(m["role"], m["content"]) for m in messages], [], add_generation_prompt=True)
        tokens = llm.tokenize(text.encode("utf-8"), add_bos=True, special=True)
        common = 0
        limit = min(llm.n_tokens, len(tokens) - 1)
        while common < limit and llm.input_ids[common] == tokens[common]:
            common += 1
        if len(tokens) >= llm.n_ctx():
            return TurnResult(self.name, session, turn, 0.0, len(tokens), 0, overflow=True)
        llm.n_tokens = common
        llm.eval(tokens[common:])
        llm._init_sampler(temp=0.0).sample(llm._ctx, -1)
        return TurnResult(self.name, session, turn, time.perf_counter() - started, len(tokens), common)

    def restart(self) -> None:
        """The floor has no server to restart."""

    def stop(self) -> None:
        for llm, _template in self._contexts.values():
            llm.close()
        self._contexts.clear()


def _floor_context(model: Path, n_ctx: int, threads: int) -> tuple[Any, Any]:
    import llama_cpp

    from engine.chat_templates import select_template
    from engine.llama_engine import LlamaOptions

    defaults = LlamaOptions(model_path=model, model_sha256="")
    llm = llama_cpp.Llama(model_path=str(model), n_ctx=n_ctx, n_threads=threads, n_threads_batch=threads,
                          n_batch=defaults.n_batch, n_ubatch=defaults.n_ubatch, flash_attn=defaults.flash_attn,
                          swa_full=defaults.swa_full, verbose=False, seed=0)
    return llm, select_template(llm.metadata)


# --- the replay ----------------------------------------------------------------------------------

def agent_turns(session: dict[str, Any], turns: int) -> list[list[dict[str, str]]]:
    """The first `turns` requests of a recorded session: each is the history up to and including
    a user message (the task, then each tool output), with the recorded assistant messages."""
    messages = [{"role": m["role"], "content": m["content"]} for m in session["messages"]]
    ends = [i + 1 for i, m in enumerate(messages) if m["role"] == "user" and i + 1 < len(messages)]
    return [messages[:end] for end in ends[:turns]]


@dataclass
class Replay:
    sessions: list[str]  # ids of the replayed sessions
    restart_after: int  # the servers restarted after this many rounds
    results: list[TurnResult] = field(default_factory=list)

    def of(self, target: str) -> list[TurnResult]:
        return [r for r in self.results if r.target == target]


def replay(sessions: list[dict[str, Any]], turns: int, targets: list[Target], restart_after: int, max_tokens: int,
           progress: Callable[[str], None]) -> Replay:
    """Round-robin over sessions, one turn each per round; every server answers every turn, the
    server that goes first rotating. After `restart_after` rounds every server is restarted."""
    requests = [agent_turns(s, turns) for s in sessions]
    out = Replay([s["id"] for s in sessions], restart_after)
    step = 0
    for turn in range(turns):
        if turn == restart_after:
            for target in targets:
                target.restart()
            progress("restarted")
        for index, session_requests in enumerate(requests):
            if turn >= len(session_requests):
                continue
            order = targets[step % len(targets):] + targets[:step % len(targets)]
            step += 1
            for target in order:
                out.results.append(target.turn(index, turn, session_requests[turn], max_tokens))
            progress(f"turn {turn + 1} session {index + 1}")
    return out
