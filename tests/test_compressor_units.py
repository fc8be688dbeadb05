"""Units under a tight budget: compression scores shorter units of code (policies.segmentation.unit_limit),
and the recall gate re-derives exactly those units from the kept-line map."""

from __future__ import annotations

from collections.abc import Sequence

from engine.scoring.bundle import bundle_of
from engine.scoring.scorers import Bm25Scorer
from gateway.compressor import CompressionSettings, MessageCompressor
from gateway.recall import RecallGate
from policies.conversation_types import Message, ToolCall
from policies.kept_lines import KeptLineMap, content_hash
from policies.segmentation import TAIL_SLACK
from sessions.record import SessionRecord


def word_count(text: str) -> int:
    return len(text.split())


def compressor(curve: str) -> MessageCompressor:
    return MessageCompressor(word_count, bundle_of(Bm25Scorer()), CompressionSettings(100, curve, 8, 64, 128, 0.11))


def long_functions(n: int = 12, body: int = 14) -> str:
    """A module of functions of about 60 words each: one unit apiece at 64, two at 32."""
    return "\n".join(f"def step_{i}(rows):\n" + "".join(f"    rows = adjust_{i}(rows, {j})\n" for j in range(body))
                     + f"    rows = checkpoint_{i}(rows)\n    return rows\n" for i in range(n))


def test_a_tight_budget_scores_shorter_units_and_recall_reads_the_same() -> None:
    output = long_functions()
    messages = [Message("user", "Which step calls adjust_7?"), Message("user", output)]
    tight = compressor("100:0.15 100000:0.15")
    plan, report = tight.compress(messages, 1, word_count(output))
    assert plan.compressed
    # What the recall gate derives from the kept-line map's total (gateway/recall.py) is what was scored.
    lines, _tokens, units = tight.segment_message(output, tight.curve_share(plan.total_tokens))
    assert tuple("".join(lines[u.first : u.last + 1]) for u in units) == report.unit_texts
    assert max(u.tokens for u in units) <= 32 * TAIL_SLACK
    _plan, loose = compressor("100:0.3 100000:0.3").compress(messages, 1, word_count(output))
    assert len(report.unit_texts) > len(loose.unit_texts)
    # An explicit share (`pflash-gateway compress --keep-ratio`) cuts as the curve would at that share.
    _plan, explicit = compressor("100:0.3 100000:0.3").compress(messages, 1, word_count(output), keep_ratio=0.15)
    assert explicit.unit_texts == report.unit_texts


def test_prose_is_scored_in_whole_passages_under_a_tight_budget() -> None:
    """Retrieved passages count only whole (segmentation.TIGHT_KINDS): a tight budget scores the
    units a loose one does, though each passage is longer than half max_segment."""
    passages = "\n\n".join(f"Passage {i} on the harbour plan.\n" + "".join(
        f"The council weighed point {j} of proposal harbour{i}x with care.\n" for j in range(5)) for i in range(16))
    messages = [Message("user", "What did the council weigh in proposal harbour7x?"), Message("user", passages)]
    plan, tight = compressor("100:0.15 100000:0.15").compress(messages, 1, word_count(passages))
    _plan, loose = compressor("100:0.3 100000:0.3").compress(messages, 1, word_count(passages))
    assert plan.compressed and tight.unit_texts == loose.unit_texts
    assert max(word_count(u) for u in tight.unit_texts) > 32


class UnitsSeen:
    """A scorer that records the units it is asked about."""

    name = "bm25"

    def __init__(self) -> None:
        self.seen: list[tuple[str, ...]] = []

    def score(self, units: Sequence[str], request: str) -> list[float]:
        self.seen.append(tuple(units))
        wanted = "def step_9" if "step_9" in request else "adjust_7(rows, 3)"
        return [1.0 if wanted in u else 0.0 for u in units]


def test_the_recall_gate_scores_the_units_compression_cut() -> None:
    output = long_functions()
    scorer = UnitsSeen()
    settings = CompressionSettings(100, "100:0.15 100000:0.15", 8, 64, 128, 0.0, recall_theta=0.0)
    tight = MessageCompressor(word_count, bundle_of(scorer), settings)
    messages = [Message("user", "Which step calls adjust_7?"),
                Message("assistant", "", (ToolCall("call_1", "read", "{}"),)),
                Message("tool", output, tool_call_id="call_1")]
    plan, report = tight.compress(messages, 2, word_count(output))
    assert plan.compressed
    record = SessionRecord(session_id="c" * 64, tenant="")
    key = content_hash(output)
    record.kept_maps[key] = KeptLineMap(key, plan.kept_ranges, plan.total_tokens, plan.kept_tokens, content_hash(plan.text))
    follow = [*messages, Message("assistant", "Step 7."), Message("user", "And what does step_9 do?")]
    got = RecallGate(tight, 0.0, 2048, None).rewrite(follow, 4, record)
    assert got is not None and got[1].fired and "def step_9(rows):" in got[0].content
    assert scorer.seen[-1] == report.unit_texts  # the gate ranked the very units compression chose from
