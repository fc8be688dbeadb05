"""The BM25 scorer keeps each unit's term counts, so the recall gate's follow-up scoring tokenizes
only what is new. Cached scores must equal a fresh computation, the cache must stay bounded, and a
follow-up through the gate must not tokenize the compressed message's units again."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from engine.scoring.bundle import bundle_of
from engine.scoring.scorers import Bm25Scorer
from gateway.compressor import CompressionSettings, MessageCompressor
from gateway.recall import RecallGate
from policies.conversation_types import Message, ToolCall
from policies.kept_lines import KeptLineMap, content_hash
from policies.lexical import bm25_scores
from sessions.record import SessionRecord

WORDS = st.sampled_from(["disk", "quota", "exceeded", "failed", "jobs", "parse_header", "HttpClient", "the", "a", "42"])
TEXTS = st.lists(WORDS, max_size=12).map(" ".join)


@settings(max_examples=60, deadline=None)
@given(units=st.lists(TEXTS, min_size=1, max_size=8), requests=st.lists(TEXTS, min_size=1, max_size=3))
def test_cached_scores_equal_a_fresh_bm25(units: list[str], requests: list[str]) -> None:
    scorer = Bm25Scorer(cache_units=4)  # smaller than some unit lists: eviction mid-call too
    for request in requests:
        assert scorer.score(units, request) == bm25_scores(units, request)


def test_units_are_tokenized_once_and_the_cache_stays_bounded() -> None:
    scorer = Bm25Scorer(cache_units=3)
    units = ["disk quota exceeded", "jobs failed", "all good"]
    scorer.score(units, "why did the jobs fail")
    scorer.score(units, "disk quota")
    assert scorer.units_tokenized == 3
    scorer.score(["a new unit here"], "unit")  # evicts the least recently used ("disk quota exceeded")
    assert scorer.units_tokenized == 4
    scorer.score(units[1:], "jobs")
    assert scorer.units_tokenized == 4
    scorer.score(units[:1], "disk")
    assert scorer.units_tokenized == 5


def test_no_cache_still_scores() -> None:
    scorer = Bm25Scorer(cache_units=0)
    units = ["disk quota exceeded", "jobs failed"]
    assert scorer.score(units, "disk") == scorer.score(units, "disk") == bm25_scores(units, "disk")
    assert scorer.units_tokenized == 4


def test_a_follow_up_through_the_gate_tokenizes_only_new_units() -> None:
    records = [f"record {i}: worker {i % 7} finished batch {i * 3}\n" for i in range(300)]
    records.insert(150, "alice used 512 MB of her disk quota in /var/tmp/build-17\n")
    output = "".join(records)
    scorer = Bm25Scorer()
    settings = CompressionSettings(100, "100:0.3 100000:0.3", 8, 64, 128, 0.0)
    compressor = MessageCompressor(lambda t: len(t.split()), bundle_of(scorer), settings)
    messages = [Message("user", "summarise the workers"),
                Message("assistant", "", (ToolCall("c1", "read_log", "{}"),)),
                Message("tool", output, tool_call_id="c1", name="read_log"),
                Message("assistant", "The workers finished their batches."),
                Message("user", "How much of her disk quota did alice use?")]
    plan, _report = compressor.compress(messages[:3], 2, len(output.split()))
    assert plan.compressed
    record = SessionRecord(session_id="s", tenant="")
    key = content_hash(output)
    record.kept_maps[key] = KeptLineMap(key, plan.kept_ranges, plan.total_tokens, plan.kept_tokens,
                                        content_hash(plan.text))
    gate = RecallGate(compressor, theta=0.45, budget_tokens=64)
    after_compression = scorer.units_tokenized
    first = gate.rewrite(messages, 4, record)
    assert first is not None and first[1].fired  # the quota line was left out and is asked about
    assert "alice used 512 MB of her disk quota" in first[0].content
    messages += [Message("assistant", "The quota."), Message("user", "Which worker finished batch 30?")]
    gate.rewrite(messages, 6, record)
    assert scorer.units_tokenized == after_compression  # every unit's counts came from the cache
