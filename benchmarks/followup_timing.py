"""Follow-ups in time: what the recall gate costs a user, measured on live gateways. The same
conversations (a long search output compressed on the first turn, then the recorded follow-ups)
go to a gateway with the gate at its default θ and to one with the gate off; each follow-up is
timed to its first streamed token. Without the gate a follow-up is a warm turn: only its new
tokens are prefilled. With it, a follow-up that fires also prefills the excerpts it brings back."""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from benchmarks.timing import ttft_stream
from gateway.process import GatewayProcess

GATE_ON, GATE_OFF = "gate on", "gate off"


@dataclass
class FollowupTimes:
    seconds: dict[str, list[float]] = field(default_factory=lambda: {GATE_ON: [], GATE_OFF: []})
    fired: list[bool] = field(default_factory=list)  # per follow-up, on the gated server
    recalled_tokens: list[int] = field(default_factory=list)  # per follow-up that fired
    conversations: int = 0


def to_wire(messages: Sequence[Any]) -> list[dict[str, Any]]:
    """policies.conversation.Message list as an OpenAI chat request's messages."""
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
                                        "--recall-theta", "1.0", "--recall-budget", "0")}
    out = FollowupTimes()
    try:
        for k, rep in enumerate(replays):
            order = [GATE_ON, GATE_OFF] if k % 2 == 0 else [GATE_OFF, GATE_ON]
            messages = to_wire(rep.messages)
            for label in order:
                session = f"followup-{k}-{uuid.uuid4().hex[:6]}"
                ttft_stream(servers[label].url, session, messages[: rep.tool_index + 1])
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
