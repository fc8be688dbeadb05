"""Faults injected into a live gateway, as counts: kill -9 at random moments (mid-turn, mid-flush),
corrupted store files; after each, the session's next turn must be served and answer exactly as a
server that never failed."""

from __future__ import annotations

import random
import signal
import threading
import uuid
from pathlib import Path
from typing import Any

import httpx

from benchmarks.common import BenchContext, Section, md_table
from benchmarks.timing import chat
from gateway.process import GatewayProcess
from sessions.store import KV

SYSTEM = "You are a careful assistant that reviews Python code. " * 15


def _turns(question: str) -> list[dict[str, Any]]:
    return [{"role": "system", "content": SYSTEM}, {"role": "user", "content": question}]


def _answer(body: dict[str, Any]) -> str:
    return str(body["choices"][0]["message"]["content"] or "")


def run(ctx: BenchContext) -> Section:
    if ctx.model_path is None:
        return Section("Faults", f"Skipped: no model ({ctx.model_error}).")
    rng = random.Random(ctx.seed)
    rounds = 2 if ctx.quick else 5
    flags = ("--model", str(ctx.model_path), "--n-ctx", "4096")
    work = ctx.cache_dir / "work" / f"faults-{uuid.uuid4().hex[:8]}"
    reference = GatewayProcess(work / "reference", *flags)
    # injected, next turn failed, wrong answer, state restored from disk. The clean restart is the
    # control: it must restore every time, or persistence itself is broken.
    counts = {"clean restart (SIGTERM), control": [0, 0, 0, 0], "kill -9 mid-turn": [0, 0, 0, 0],
              "kill -9 during shutdown flush": [0, 0, 0, 0], "flipped byte in kv.zst": [0, 0, 0, 0],
              "truncated kv.zst": [0, 0, 0, 0]}
    try:
        for round_ in ctx.progress(range(rounds), "faults"):
            for fault in counts:
                session = f"fault-{round_}-{uuid.uuid4().hex[:6]}"
                first = _turns(f"Round {round_}: what does `sum(range({round_ + 3}))` return?")
                _t, ref1, _h = chat(reference.url, session, first, max_tokens=8)
                follow = [*first, {"role": "assistant", "content": _answer(ref1)},
                          {"role": "user", "content": "And with range doubled?"}]
                _t, expected, _h = chat(reference.url, session, follow, max_tokens=8)
                counts[fault][0] += 1
                store = work / f"store-{round_}-{fault.split()[0]}-{uuid.uuid4().hex[:4]}"
                server = GatewayProcess(store, *flags)
                if fault == "kill -9 mid-turn":
                    chat(server.url, session, first, max_tokens=8)
                    killer = threading.Timer(rng.uniform(0.05, 0.4), server.proc.send_signal, (signal.SIGKILL,))
                    killer.start()
                    try:
                        chat(server.url, session, follow, max_tokens=64)
                    except httpx.HTTPError:
                        pass  # the client saw the crash; it resends, as agents do
                    killer.join()
                    server.stop()
                elif fault == "kill -9 during shutdown flush":
                    chat(server.url, session, first, max_tokens=8)
                    server.proc.send_signal(signal.SIGTERM)
                    threading.Event().wait(rng.uniform(0.0, 0.3))
                    server.stop(signal.SIGKILL)
                else:
                    chat(server.url, session, first, max_tokens=8)
                    server.stop()
                    if not fault.startswith("clean"):
                        _corrupt(store, fault)
                restarted = GatewayProcess(store, *flags)
                try:
                    _t, got, headers = chat(restarted.url, session, follow, max_tokens=8)
                    if _answer(got) != _answer(expected):
                        counts[fault][2] += 1  # served, but not what a never-failed server says
                    counts[fault][3] += headers.get("X-PFlash-Restored-From") == "disk"
                except httpx.HTTPError:
                    counts[fault][1] += 1
                finally:
                    restarted.stop()
    finally:
        reference.stop()
    rows = [[fault, n, failed, wrong, failed + wrong, restored] for fault, (n, failed, wrong, restored) in counts.items()]
    lost = sum(r[4] for r in rows)
    control = counts["clean restart (SIGTERM), control"]
    text = (
        "Each fault hits a live gateway serving a session; a new server process then starts on the "
        "same store and the session's next turn is sent. It must be served (HTTP 200) and its greedy "
        "answer must equal that of a reference server that never failed. A torn or corrupt stored "
        "state must be discarded (full prefill), never loaded. The first row is the control: a clean "
        "restart, whose session must come back from disk every time (were nothing persisted, the "
        "answers would still match, since clients resend the history; that column would show it). "
        "After kill -9 a restore from disk is possible only for a state flushed before the kill.\n\n"
        + md_table(["fault", "injected", "next turn failed", "wrong answer", "sessions lost",
                    "state restored from disk"], rows)
        + f"\n{sum(r[1] for r in rows)} restarts, {lost} sessions lost; the control restored from disk "
        f"{control[3]} of {control[0]} times.\n"
    )
    return Section("Faults", text)


def _corrupt(store: Path, fault: str) -> None:
    for kv in store.glob("sessions/*/*/" + KV):
        data = bytearray(kv.read_bytes())
        if fault.startswith("flipped"):
            data[len(data) // 2] ^= 0xFF
            kv.write_bytes(bytes(data))
        else:
            kv.write_bytes(bytes(data[: len(data) // 3]))
