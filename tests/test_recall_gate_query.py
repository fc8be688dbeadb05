"""What the recall gate asks the scorer: the new question, with the question before it for
`hybrid` (an elliptical follow-up says little alone), the bare question for the other scorers or
when the `recall_context` setting says so. Fast: a recording scorer, word counts for tokens."""

from __future__ import annotations

from collections.abc import Sequence

import pytest

from engine.scoring.bundle import bundle_of
from gateway.compressor import CompressionSettings, MessageCompressor
from gateway.recall import RecallGate
from policies.conversation_types import Message, ToolCall
from policies.kept_lines import KeptLineMap, content_hash
from sessions.record import SessionRecord

OUTPUT = "".join(f"line {i}: value {i * 7}\n" for i in range(200))


class Recording:
    def __init__(self, name: str) -> None:
        self.name = name
        self.requests: list[str] = []

    def score(self, units: Sequence[str], request: str) -> list[float]:
        self.requests.append(request)
        return [1.0 if "line 150:" in u else 0.0 for u in units]


def _rewrite(scorer: object, context: int | None) -> str:
    """The follow-up "And line 150?" through the gate at θ = 0: what the model is served."""
    settings = CompressionSettings(50, "50:0.3 100000:0.3", 4, 16, 128, 0.0, recall_theta=0.0)
    compressor = MessageCompressor(lambda text: len(text.split()), bundle_of(scorer), settings)
    key = content_hash(OUTPUT)
    record = SessionRecord(session_id="b" * 64, tenant="")
    record.kept_maps[key] = KeptLineMap(key, ((0, 9),), 1000, 50, content_hash("kept"))
    messages = [Message("user", "Which value does line 3 hold?"),
                Message("assistant", "", (ToolCall("call_1", "read", "{}"),)),
                Message("tool", OUTPUT, tool_call_id="call_1"),
                Message("assistant", "21."),
                Message("user", "And line 150?")]
    got = RecallGate(compressor, 0.0, 2048, context).rewrite(messages, 4, record)
    assert got is not None and got[1].fired
    assert "line 150: value 1050" in got[0].content  # the recalled excerpt, then the question
    assert got[0].content.endswith("And line 150?")  # the question itself is served as the client sent it
    return got[0].content


def _gate_query(scorer_name: str, context: int | None) -> str:
    scorer = Recording(scorer_name)
    _rewrite(scorer, context)
    (request,) = scorer.requests
    return request


def test_hybrid_asks_with_the_question_before() -> None:
    assert _gate_query("hybrid", None) == "And line 150?\n\nWhich value does line 3 hold?"


@pytest.mark.parametrize("scorer_name", ["bm25", "embed", "head"])
def test_other_scorers_and_a_fallback_to_bm25_ask_the_bare_question(scorer_name: str) -> None:
    assert _gate_query(scorer_name, None) == "And line 150?"


def test_the_setting_overrides_the_scorer_default() -> None:
    assert _gate_query("hybrid", 0) == "And line 150?"
    assert _gate_query("bm25", 1) == _gate_query("embed", 1) == "And line 150?\n\nWhich value does line 3 hold?"


def test_the_ranker_gate_asks_its_gate_scorer_not_the_ranker() -> None:
    """The ranker compresses; its gate statistic comes from BM25 (its bundle's gate)."""
    from engine.scoring.ranker import RankerScorer

    ranker = RankerScorer()
    gate = Recording("bm25")
    ranker.gate_scorer = gate  # type: ignore[assignment]
    asked: list[str] = []
    ranker.score = lambda units, request: asked.append(request) or [0.0] * len(units)  # type: ignore[method-assign]
    _rewrite(ranker, None)
    assert gate.requests == ["And line 150?"] and asked == []
