"""Shared prefixes: a new Claude Code session and a second sub-agent spawn start from a prefix
checkpoint instead of prefilling the system prompt and tools again (cold, same process, after a
restart); and a session killed with SIGKILL while idle resumes from the state written after its turn.
"""

from __future__ import annotations

import json
import re
import shutil
import signal
import statistics
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from benchmarks.capture_replay import (
    GATEWAY_PREFILLED,
    LLAMA_SERVER_PREFILLED,
    LlamaServer,
    ReplayResult,
    captured_requests,
    llama_server_binary,
    replay,
)
from benchmarks.common import ROOT, BenchContext, Section, coding_sessions, md_table, spread
from benchmarks.timing import agent_history, session_turn
from gateway.process import GatewayProcess

TITLE = "Shared prefixes: new sessions, sub-agents and a kill"
CAPTURES = ROOT.parent / "shared" / "captures" / "claude"
# (capture, what differs in the second request): a print-mode session started in another checkout
# (its git-status reminder says another branch, status and commits), and a second spawn of one
# sub-agent type (the interactive run's Explore agent) with another task. The captured repeats
# (001 and 023, 009 and 018) are byte-identical requests: a pair of them would measure a repeat.
PAIRS = {"new Claude Code session (print mode)": ("001", "git"), "second sub-agent spawn": ("009", "task")}
OTHER_GIT = ("Current branch: feature/parser-rewrite\n", "Status:\nM calc.py\n?? notes.md\n")
OTHER_TASK = "Find every place that parses command-line flags and list the files with line numbers."
GOAL_SHARE, GOAL_SPEEDUP, GOAL_KILL = 0.80, 3.0, 50.0  # issue 50
DROPPED_HEADERS = {"authorization", "host", "content-length", "accept-encoding", "connection"}
CLASSIFIER_CHARS = 120_000  # requests at least this long (the safety classifier's) are left out of the replay


def captured(name: str, variant: str = "") -> tuple[dict[str, Any], dict[str, str]]:
    """A captured Claude Code request as it was sent (headers too), asking for 4 tokens; with a
    `variant`, as another session would send it (see PAIRS)."""
    data = json.loads((CAPTURES / f"{name}.json").read_text(encoding="utf-8"))
    body = {**data["body"], "max_tokens": 4, "stream": True, "temperature": 0}
    headers = {k: v for k, v in data["headers"].items() if k.lower() not in DROPPED_HEADERS}
    if variant:
        body = json.loads(json.dumps(body))  # a deep copy to edit
        headers = {**headers, "X-Claude-Code-Session-Id": str(uuid.uuid4())}
        first = body["messages"][0]["content"]
        blocks = first if isinstance(first, list) else [{"type": "text", "text": first}]
        if variant == "git":
            text = blocks[0]["text"]
            text = re.sub(r"Current branch: [^\n]*\n", OTHER_GIT[0], text, count=1)
            blocks[0]["text"] = re.sub(r"Status:\n[^\n]*\n", OTHER_GIT[1], text, count=1)
        else:  # the task: the first text block that is not a system reminder
            task = next(b for b in blocks if b.get("type") == "text" and not b["text"].startswith("<system-reminder>"))
            task["text"] = OTHER_TASK
        if not isinstance(first, list):
            body["messages"][0]["content"] = blocks[0]["text"]
    return body, headers


@dataclass(frozen=True)
class Answer:
    ttft: float
    prompt_tokens: int
    cached_tokens: int


def ask(url: str, name: str, variant: str = "") -> Answer:
    """One captured request, streamed: the time to its first content event and its usage."""
    body, headers = captured(name, variant)
    started, first = time.perf_counter(), None
    usage: dict[str, Any] = {}
    with httpx.stream("POST", url + "/v1/messages", json=body, headers=headers, timeout=3600) as response:
        response.raise_for_status()
        for line in response.iter_lines():
            if not line.startswith("data: "):
                continue
            event = json.loads(line[6:])
            if first is None and event.get("type") in ("content_block_start", "content_block_delta", "message_delta"):
                first = time.perf_counter() - started
            if event.get("type") == "message_delta" and event.get("usage"):
                usage = event["usage"]
    cached = int(usage.get("cache_read_input_tokens") or 0)
    return Answer(first if first is not None else time.perf_counter() - started,
                  int(usage.get("input_tokens") or 0) + cached, cached)


@dataclass
class PairResult:
    cold: list[Answer] = field(default_factory=list)
    warm: list[Answer] = field(default_factory=list)
    restarted: list[Answer] = field(default_factory=list)


def measure_pair(model: Path, work: Path, first: str, variant: str, reps: int, flags: tuple[str, ...]) -> PairResult:
    """Per rep, interleaved: the second request alone on an empty store (cold); after the first
    request in the same process (warm); and on a new process over the store of a server that served
    only the first request (restarted: the checkpoint comes from disk)."""
    result = PairResult()
    for rep in range(reps):
        shutil.rmtree(work, ignore_errors=True)
        cold = GatewayProcess(work / f"cold{rep}", "--model", str(model), *flags)
        result.cold.append(ask(cold.url, first, variant))
        cold.stop()
        server = GatewayProcess(work / f"warm{rep}", "--model", str(model), *flags)
        ask(server.url, first)
        result.warm.append(ask(server.url, first, variant))
        server.stop()
        store = work / f"restart{rep}"
        before = GatewayProcess(store, "--model", str(model), *flags)
        ask(before.url, first)
        before.stop()  # SIGTERM: the RAM tier's checkpoints go to disk
        again = GatewayProcess(store, "--model", str(model), *flags)
        result.restarted.append(ask(again.url, first, variant))
        again.stop()
    shutil.rmtree(work, ignore_errors=True)
    return result


@dataclass
class KillResult:
    tokens: int = 0
    full_s: list[float] = field(default_factory=list)
    resumed_s: list[float] = field(default_factory=list)
    cached: list[int] = field(default_factory=list)


def kv_written(url: str) -> bool:
    text = httpx.get(url + "/metrics", timeout=30).text
    return any(line.startswith('pflash_store_writes_total{kind="kv"}') and float(line.split()[-1]) >= 1
               for line in text.splitlines())


def measure_kill(model: Path, work: Path, history: list[dict[str, str]], reps: int, flags: tuple[str, ...]) -> KillResult:
    """A session served once, left idle until its state is on disk, killed with SIGKILL; its next
    turn on a new process against the same turn on an empty store (a full prefill)."""
    result = KillResult()
    body = {"model": "m", "messages": history, "max_tokens": 4, "temperature": 0,
            "stream_options": {"include_usage": True}}
    for rep in range(reps):
        shutil.rmtree(work, ignore_errors=True)
        session = f"kill-{rep}-{uuid.uuid4().hex}"
        server = GatewayProcess(work / "store", "--model", str(model), *flags)
        first = session_turn(server.url, session, body)
        result.tokens = int(first.usage.get("prompt_tokens", 0))
        deadline = time.time() + 120
        while not kv_written(server.url) and time.time() < deadline:
            time.sleep(0.2)
        server.stop(signal.SIGKILL)
        follow = {**body, "messages": [*history, {"role": "assistant", "content": "ok"},
                                       {"role": "user", "content": "Continue."}]}
        resumed_server = GatewayProcess(work / "store", "--model", str(model), *flags)
        resumed = session_turn(resumed_server.url, session, follow)
        resumed_server.stop()
        baseline = GatewayProcess(work / "empty", "--model", str(model), *flags)
        full = session_turn(baseline.url, session, follow)
        baseline.stop()
        result.resumed_s.append(resumed.ttft)
        result.full_s.append(full.ttft)
        result.cached.append(int((resumed.usage.get("prompt_tokens_details") or {}).get("cached_tokens", 0)))
    shutil.rmtree(work, ignore_errors=True)
    return result


def pair_rows(label: str, model: str, r: PairResult) -> list[list[object]]:
    cold, warm, again = (statistics.median(a.ttft for a in v) for v in (r.cold, r.warm, r.restarted))
    prompt = r.cold[0].prompt_tokens
    rows = []
    for where, answers, t in (("same process", r.warm, warm), ("after a restart", r.restarted, again)):
        shares = [a.cached_tokens / a.prompt_tokens for a in answers if a.prompt_tokens]
        rows.append([label, model, where, f"{prompt:,}", f"{min(shares):.1%}" if shares else "n/a",
                     spread([a.ttft for a in r.cold], 1), spread([a.ttft for a in answers], 1), f"{cold / t:.2f}×"])
    return rows


def run(ctx: BenchContext) -> Section:
    sessions = coding_sessions(ctx, TITLE)
    if isinstance(sessions, Section):
        return sessions
    if not CAPTURES.is_dir():
        return Section(TITLE, f"Skipped: {CAPTURES} is missing.")
    from engine.models.parts import QWEN_CODER_05B, assemble

    assert ctx.model_path is not None
    qwen = assemble(QWEN_CODER_05B, ctx.cache_dir / "models")
    flags = ("--n-ctx", "32768", "--no-recall-embedder", "--no-ranker-embedder")
    reps, qwen_reps = (1, 1) if ctx.quick else (3, 2)
    runs = [(label, "Gemma 3 270M", ctx.model_path, pair, reps) for label, pair in PAIRS.items()]
    runs.append((next(iter(PAIRS)), "Qwen2.5-Coder-0.5B", qwen, PAIRS[next(iter(PAIRS))], qwen_reps))
    rows: list[list[object]] = []
    verdicts: list[str] = []
    for label, model_name, path, (first, variant), n in ctx.progress(runs, "prefix pairs"):
        result = measure_pair(path, ctx.cache_dir / "prefix-work", first, variant, n, flags)
        rows += pair_rows(label, model_name, result)
        for where, answers in (("same process", result.warm), ("after a restart", result.restarted)):
            share = min(a.cached_tokens / max(1, a.prompt_tokens) for a in answers)
            speedup = statistics.median(a.ttft for a in result.cold) / statistics.median(a.ttft for a in answers)
            verdicts.append(f"{label}, {model_name}, {where}: {share:.1%} cached (goal {GOAL_SHARE:.0%}: "
                            f"{'met' if share >= GOAL_SHARE else 'missed'}), {speedup:.2f}× sooner")
    size = 2048 if ctx.quick else 16384
    history = agent_history(sessions, size, ctx.count_tokens)
    kill = measure_kill(ctx.model_path, ctx.cache_dir / "kill-work", history, 1 if ctx.quick else reps, flags)
    kill_ratio = statistics.median(kill.full_s) / statistics.median(kill.resumed_s)
    replays = replay_both(ctx, qwen, flags)  # Qwen's template renders the tools on both servers
    text = (
        "Captured Claude Code 2.1.328 requests (`../shared/captures/claude`) are replayed with their own "
        "headers, each asking for 4 tokens. The second request of each pair is timed to its first "
        "streamed content event in three ways, interleaved per repetition: alone on a gateway with an "
        "empty store (**cold**: a full prefill); right after the pair's first request on the same gateway "
        "(**same process**: the system prompt and tools come from the checkpoint the first request saved "
        "where they end); and on a new gateway started, after a SIGTERM, over the store of one that served "
        "only the first request (**after a restart**: the checkpoint read from disk). `cached` is the usage's "
        "`cache_read_input_tokens` over the prompt, the lowest of the repetitions; times are median "
        "(min–max) seconds; speed-ups are ratios of medians. Default settings (`sequences` 4, n_ctx 32768); "
        "the second print-mode session is the captured one with its git-status reminder as another checkout "
        "gives it (branch, status), the second sub-agent spawn the captured one with another task (the "
        "captured repeats are byte-identical requests).\n\n"
        + md_table(["request", "model", "second request", "prompt tokens", "cached", "cold s", "from checkpoint s",
                    "speed-up"], rows)
        + "\n" + "".join(f"- {v}\n" for v in verdicts)
        + f"\n**Killed while idle.** A {kill.tokens:,}-token coding-agent history (real swe-dev sessions, "
        "stitched) is served once; once its state is on disk (the engine writes it in the background "
        "when idle after a turn) the gateway is killed with SIGKILL and restarted, and the session's next "
        "turn is timed against the same turn on an empty store, "
        f"{len(kill.full_s)} times: full prefill {spread(kill.full_s, 1)} s, resumed {spread(kill.resumed_s, 3)} s "
        f"({min(kill.cached):,} tokens cached at least): **{kill_ratio:.0f}×** sooner (goal {GOAL_KILL:.0f}×: "
        f"{'met' if kill_ratio >= GOAL_KILL else 'missed'}).\n"
        + replay_text(replays)
    )
    return Section(TITLE, text, [], model="Gemma 3 270M Q4_K_M and Qwen2.5-Coder-0.5B-Instruct Q4_K_M")


def replay_both(ctx: BenchContext, model: Path, flags: tuple[str, ...]) -> list[ReplayResult] | str:
    """Every captured Claude Code request, in order, on the gateway and on llama-server."""
    # The auto-mode classifier's 145K-character system prompt fits no 32K context: llama-server
    # refuses it, the gateway cuts it to fit (minutes of prefill either way), so it is left out.
    requests = [r for r in captured_requests(CAPTURES) if len(json.dumps(r[1])) < CLASSIFIER_CHARS]
    requests = requests[: 4 if ctx.quick else None]
    work = ctx.cache_dir / "capture-replay"
    shutil.rmtree(work, ignore_errors=True)
    gateway = GatewayProcess(work / "store", "--model", str(model), *flags)
    results = [replay(gateway.url, "pflash-gateway", requests, GATEWAY_PREFILLED)]
    gateway.stop()
    binary = llama_server_binary(ROOT)
    if binary is None:
        return "llama-server could not be built here (scripts/build_llama_server.sh): no baseline in this run."
    server = LlamaServer(binary, model, 32768, work / "llama-server.log")
    results.append(replay(server.url, f"llama-server ({binary.name.removeprefix('llama-server-')}, defaults, "
                          "--metrics --jinja)", requests, LLAMA_SERVER_PREFILLED))
    server.stop()
    return results


def replay_text(results: list[ReplayResult] | str) -> str:
    if isinstance(results, str):
        return "\n" + results + "\n"
    rows = [[r.server, r.requests, f"{r.prompt_tokens:,}", f"{r.prefilled:,.0f}",
             f"{r.prefilled / max(r.prompt_tokens, 1):.1%}", f"{r.wait_s:.1f}", r.failures] for r in results]
    text = ("\n**The captured traffic, replayed.** Every Messages request of the capture (five Claude Code runs: "
            "print-mode sessions, interactive ones with their sub-agents and title requests; the two auto-mode "
            "classifier requests, whose 145K-character system prompt fits no 32K context, left out), "
            "in the order sent, each asking for 4 tokens, on a fresh gateway (Qwen2.5-Coder-0.5B-Instruct, "
            "defaults) and on llama-server with the same model file, one request at a time. Prefilled tokens are "
            "each server's own count of prompt tokens it evaluated (`pflash_prefill_tokens_total{kind=\"evaluated\"}`, "
            "`llamacpp:prompt_tokens_total`); prompt tokens are the sum of each answer's usage (fresh + cached). "
            "Each server renders the requests with its own template, so prompt sizes differ a little. (With "
            "Gemma 3, whose template has no tools, llama-server leaves Claude Code's tools out of the prompt: "
            "its prompts are a third of the gateway's, so that pair would not compare.)\n\n"
            + md_table(["server", "requests", "prompt tokens", "tokens prefilled", "prefilled share", "total wait s",
                        "failed"], rows))
    if len(results) == 2:
        ours, theirs = results
        text += (f"\nThe gateway prefilled {ours.prefilled / max(theirs.prefilled, 1):.2f}× llama-server's tokens "
                 f"and waited {ours.wait_s / max(theirs.wait_s, 1e-9):.2f}× its time (goal: no more tokens than "
                 f"llama-server: {'met' if ours.prefilled <= theirs.prefilled else 'missed'}).\n")
    return text
