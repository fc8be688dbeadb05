"""Memory at the defaults: the gateway's peak resident set on each embedded model with the settings a
user gets (`sequences` = 4, `n_ctx` 32,768, RAM tier 2,048 MiB), under a small workload that uses
every part (six sessions at once, so two are stashed to the RAM tier, and one compressed tool output,
so the sentence encoder loads), and what takes it."""

from __future__ import annotations

import shutil
import uuid
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from benchmarks.bench_ttft import terminal_log
from benchmarks.capture_replay import metric_total
from benchmarks.common import (
    BOTH_MODELS,
    FAST_MODEL,
    NO_SERVED_DEFAULT,
    SERVED_DEFAULT,
    BenchContext,
    Section,
    coding_sessions,
    md_table,
)
from benchmarks.timing import agent_history, session_turn, tool_output_turn
from gateway.config import Settings
from gateway.process import GatewayProcess

TITLE = "Memory at the defaults"
SESSIONS = 6  # two more than the default 4 sequences: their states go to the RAM tier
MIB = 1024 * 1024


@dataclass(frozen=True)
class Footprint:
    """/proc/<pid>/status of the gateway, MiB."""

    peak: float  # VmHWM: the most it held at once
    anon: float  # RssAnon: KV, compute buffers, Python, tiers
    file: float  # RssFile: mapped model files (weights) read so far

    @staticmethod
    def of(pid: int) -> Footprint:
        fields = {}
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            key, _, value = line.partition(":")
            if key in ("VmHWM", "RssAnon", "RssFile"):
                fields[key] = int(value.split()[0]) / 1024
        return Footprint(fields["VmHWM"], fields["RssAnon"], fields["RssFile"])


@dataclass(frozen=True)
class ModelMemory:
    name: str
    weights_mib: float
    idle_1: Footprint  # at ready, `--sequences 1`
    idle: Footprint  # at ready, the defaults
    busy: Footprint  # after the workload, the defaults
    tier_mib: float  # session states and checkpoints held in the RAM tier after the workload
    buffers_mib: float  # the reused state buffers
    compressed: bool


def measure(ctx: BenchContext, name: str, model: Path, histories: list[list[dict[str, str]]],
            long_turn: list[dict[str, Any]], flags: tuple[str, ...]) -> ModelMemory:
    work = ctx.cache_dir / "work" / f"memory-{uuid.uuid4().hex[:8]}"
    try:
        single = GatewayProcess(work / "one", "--model", str(model), "--sequences", "1", *flags, ready_timeout=600)
        try:
            idle_1 = Footprint.of(single.proc.pid)
        finally:
            single.stop()
        server = GatewayProcess(work / "defaults", "--model", str(model), *flags, ready_timeout=600)
        try:
            idle = Footprint.of(server.proc.pid)

            def turn(index: int) -> None:
                session_turn(server.url, f"memory-{index}", {"model": "m", "messages": histories[index],
                                                             "max_tokens": 4, "temperature": 0}, timeout=3600)

            with ThreadPoolExecutor(SESSIONS) as pool:
                list(pool.map(turn, range(SESSIONS)))
            got = session_turn(server.url, "memory-long", {"model": "m", "messages": long_turn, "max_tokens": 4,
                                                           "temperature": 0}, timeout=3600)
            busy = Footprint.of(server.proc.pid)
            tier = sum(metric_total(server.url, (f'{metric}{{tier="ram"}}',))
                       for metric in ("pflash_session_bytes", "pflash_checkpoint_bytes"))
            buffers = metric_total(server.url, ("pflash_state_buffer_bytes",))
        finally:
            server.stop()
        return ModelMemory(name, model.stat().st_size / MIB, idle_1, idle, busy, tier / MIB, buffers / MIB,
                           got.headers.get("X-PFlash-Compressed") == "true")
    finally:
        shutil.rmtree(work, ignore_errors=True)


def run(ctx: BenchContext) -> Section:
    sessions = coding_sessions(ctx, TITLE)
    if isinstance(sessions, Section):
        return sessions
    history_tokens, long_tokens = (256, 2000) if ctx.quick else (2048, 17000)
    flags = ("--threshold", "1500") if ctx.quick else ()
    histories = [agent_history(sessions[2 * i:], history_tokens, ctx.count_tokens) for i in range(SESSIONS)]
    def long_turn(count: Callable[[str], int]) -> list[dict[str, Any]]:
        """A turn bringing a tool output of `long_tokens` in the model's own tokens (over the threshold)."""
        return tool_output_turn(sessions[0]["issue"][:2000], terminal_log(sessions, long_tokens, count))

    models = [(FAST_MODEL, ctx.model_path, ctx.count_tokens)]
    qwen = ctx.served_default()
    if qwen is not None:
        models.append((SERVED_DEFAULT, qwen, ctx.counter_for(qwen)))
    results = [measure(ctx, name, model, histories, long_turn(count), flags)
               for name, model, count in ctx.progress(models, "memory, models")]
    defaults = Settings()
    rows = []
    for m in results:
        kv_per_sequence = (m.idle.anon - m.idle_1.anon) / (defaults.sequences - 1)
        rows.append([m.name, f"{m.busy.peak:,.0f}", f"{m.weights_mib:,.0f}", f"{kv_per_sequence:,.0f}",
                     f"{m.idle.anon:,.0f}", f"{m.busy.anon - m.idle.anon:,.0f}", f"{m.tier_mib:,.0f}",
                     f"{m.buffers_mib:,.0f}", f"{m.busy.file - m.idle.file:,.0f}", "yes" if m.compressed else "**no**"])
    text = (
        f"The gateway started as `make serve` starts it (`sequences` = {defaults.sequences}, `n_ctx` "
        f"{defaults.n_ctx:,}, RAM tier {defaults.ram_budget_mb:,} MiB, the default scorer), then {SESSIONS} "
        f"sessions of ~{history_tokens:,} tokens of real agent history each take a turn at once (two more than "
        f"the sequences, so two states are stashed to the RAM tier), then one turn brings a ~{long_tokens:,}-token "
        "tool output, compressed by the default ranker (the sentence encoder loads). Read from "
        "`/proc/<pid>/status` of the gateway process (MiB): peak = VmHWM after the workload; weights = the "
        "model file (mapped, counted in the resident set as its pages are read); KV per sequence = the "
        "anonymous memory at start with the defaults less that with `--sequences 1`, over the 3 sequences more "
        "(llama.cpp allocates and clears every sequence's KV at start); at start = anonymous memory when ready "
        "(KV of every sequence, compute buffers, Python); grown by the workload = anonymous memory added by the "
        "turns (tier contents, state buffers, the encoder's context, answers); the RAM tier and state buffers as "
        "`/metrics` reports them after the workload; files mapped by the workload = file-backed memory added "
        "(the sentence encoder's weights, the rest of the model's).\n\n"
        + md_table(["model", "peak MiB", "weights MiB", "KV per sequence MiB", "anonymous at start MiB",
                    "grown by the workload MiB", "RAM tier MiB", "state buffers MiB", "files mapped by the workload MiB",
                    "long output compressed"], rows)
        + ("" if qwen is not None else f"\n{NO_SERVED_DEFAULT}\n")
    )
    raw = [{"model": m.name, "weights_mib": m.weights_mib, "idle_sequences_1": vars(m.idle_1), "idle": vars(m.idle),
            "busy": vars(m.busy), "tier_mib": m.tier_mib, "buffers_mib": m.buffers_mib, "compressed": m.compressed}
           for m in results]
    return Section(TITLE, text, [], model=BOTH_MODELS,
                   raw=raw)
