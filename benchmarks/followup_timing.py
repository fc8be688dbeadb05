"""Follow-ups in time: what the recall gate costs a user, measured on live gateways. The same
conversations (a long search output compressed on the first turn, then the recorded follow-ups)
go to a gateway with the gate at its default θ and to one with the gate off; each follow-up is
timed to its first streamed token. Without the gate a follow-up is a warm turn: only its new
tokens are prefilled. With it, a follow-up that fires also prefills the excerpts it brings back.

The gated gateway embeds the compressed output's units in the background once the first turn is
served (its recall gate then scores with the sentence encoder); the follow-ups are sent when that
is done, as a user's next question comes after reading the answer. How long it took is reported."""

from __future__ import annotations

import re
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from benchmarks.timing import ttft_stream
from gateway.process import GatewayProcess

GATE_ON, GATE_OFF = "gate on", "gate off"


@dataclass
class FollowupTimes:
    seconds: dict[str, list[float]] = field(default_factory=lambda: {GATE_ON: [], GATE_OFF: []})
    fired: list[bool] = field(default_factory=list)  # per follow-up, on the gated server
    recalled_tokens: list[int] = field(default_factory=list)  # per follow-up that fired
    background_seconds: list[float] = field(default_factory=list)  # per first turn: until its units were embedded
    conversations: int = 0


def metric(url: str, name: str) -> float:
    """One unlabelled sample of the gateway's /metrics (0 when absent)."""
    found = re.search(rf"^{re.escape(name)} (\S+)$", httpx.get(f"{url}/metrics", timeout=10).text, re.M)
    return float(found.group(1)) if found else 0.0


def wait_for_background(url: str, jobs_before: float, timeout: float = 300.0) -> float:
    """Seconds until the gateway finished one more background embedding job than `jobs_before`."""
    started = time.perf_counter()
    while metric(url, "pflash_background_embedding_jobs_total") <= jobs_before:
        if time.perf_counter() - started > timeout:
            raise TimeoutError(f"background embedding not done after {timeout:.0f} s")
        time.sleep(0.1)
    return time.perf_counter() - started


def to_wire(messages: Sequence[Any]) -> list[dict[str, Any]]:
    """policies.conversation_types.Message list as an OpenAI chat request's messages."""
    out: list[dict[str, Any]] = []
    for m in messages:
        wire: dict[str, Any] = {"role": m.role, "content": m.content}
        if m.tool_calls:
            wire["tool_calls"] = [{"id": c.id, "type": "function", "function": {"name": c.name, "arguments": c.arguments}}
                                  for c in m.tool_calls]
        if m.role == "tool":
            wire["tool_call_id"] = m.tool_call_id
        out.append(wire)
    return out


def measure_followups(model: Path, work: Path, replays: Sequence[Any], threshold: int) -> FollowupTimes:
    """Each conversation on both gateways (the first of the two alternating); the first turn
    (compression) is not timed, every later user turn is."""
    common = ("--model", str(model), "--n-ctx", "32768", "--threshold", str(threshold))
    servers = {GATE_ON: GatewayProcess(work / f"followup-on-{uuid.uuid4().hex[:8]}", *common),
               GATE_OFF: GatewayProcess(work / f"followup-off-{uuid.uuid4().hex[:8]}", *common,
                                        "--recall-theta", "1.0", "--recall-budget", "0", "--no-recall-embedder")}
    out = FollowupTimes()
    try:
        for k, rep in enumerate(replays):
            order = [GATE_ON, GATE_OFF] if k % 2 == 0 else [GATE_OFF, GATE_ON]
            messages = to_wire(rep.messages)
            for label in order:
                session = f"followup-{k}-{uuid.uuid4().hex[:6]}"
                url = servers[label].url
                jobs = metric(url, "pflash_background_embedding_jobs_total")
                _seconds, headers = ttft_stream(url, session, messages[: rep.tool_index + 1])
                if label == GATE_ON and headers.get("X-PFlash-Compressed") == "true":
                    out.background_seconds.append(wait_for_background(url, jobs))
                for q in rep.question_indices:
                    seconds, headers = ttft_stream(servers[label].url, session, messages[: q + 1])
                    out.seconds[label].append(seconds)
                    if label == GATE_ON:
                        fired = headers.get("X-PFlash-Recall") == "true"
                        out.fired.append(fired)
                        if fired:
                            out.recalled_tokens.append(int(headers.get("X-PFlash-Recall-Tokens", 0)))
            out.conversations += 1
    finally:
        for server in servers.values():
            server.stop()
    return out
