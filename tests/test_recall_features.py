"""The drafter's per-unit features travel with the session: after a restart (a new scorer with an
empty cache, the record read back from its persisted form) the recall gate reads only the question.
Model: Gemma 3 270M Q4_K_M, the fast base model (fixture `model_path`).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from engine.scoring.bundle import bundle_of
from policies.conversation_types import Message, ToolCall
from sessions.record import SessionRecord
from tests.test_compression_e2e import python_module

pytestmark = pytest.mark.engine


def rewrite_setup(model_path: Path) -> tuple[Callable[[Any], Any], list[Message]]:
    """A turn service factory that needs only token counts (recall on at θ = 0), and a conversation
    whose tool output is long enough to compress: shared by the drafter and encoder tests."""
    from engine.tokenizer import GgufTokenizer
    from gateway.compressor import CompressionSettings
    from gateway.turns import TurnService

    tokenizer = GgufTokenizer(model_path)

    class Counting:  # rewrite() needs only the engine's token counts
        n_ctx = 4096
        count_tokens = staticmethod(tokenizer.count_tokens)

    settings = CompressionSettings(300, "300:0.3 100000:0.3", 8, 64, 128, 0.0, recall_theta=0.0)
    messages = [Message("user", "Where is the invoice total computed?"),
                Message("assistant", "", (ToolCall("call_1", "read_file", '{"path": "inventory.py"}'),)),
                Message("tool", python_module(), tool_call_id="call_1")]
    return (lambda scorer: TurnService(Counting(), None, bundle_of(scorer), settings)), messages  # type: ignore[arg-type]


def test_follow_up_after_restart_reads_only_the_question(model_path: Path) -> None:
    from engine.scoring.drafter import DrafterScorer

    service, messages = rewrite_setup(model_path)

    before = DrafterScorer(model_path, n_threads=2)
    record = SessionRecord(session_id="a" * 64, tenant="")
    served, report, _ = asyncio.run(service(before).rewrite(messages, record))
    assert report is not None and report.compressed
    assert before.counters.units_read > 0 and record.unit_features
    before.close()

    restored = SessionRecord.from_dict(record.to_dict())  # what meta.msgpack gives back
    record.served_hashes = []
    after = DrafterScorer(model_path, n_threads=2)  # a new process: an empty feature cache
    follow = [*messages, Message("assistant", "Noted."), Message("user", "What does helper_37 return?")]
    _served, _report, recall = asyncio.run(service(after).rewrite(follow, restored))
    assert recall is not None and recall.fired  # θ = 0: the gate scored every unit
    assert after.counters.units_read == 0  # no unit read again ...
    assert after.counters.requests_read == 1  # ... only the new question
    after.close()
