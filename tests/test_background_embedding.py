"""The ranker's recall gate on the sentence encoder (issue 12): a compressed message's units are
embedded after its turn, while the engine is idle, and stored with the session; until then the
gate scores with BM25; a follow-up, even after a restart, embeds only its question; a missing
encoder leaves the gate on BM25 with a warning and a counted metric, never an error."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import httpx
import pytest

from engine.scoring.bundle import bundle_of
from benchmarks.followup_timing import metric
from engine.scoring.embedder import EmbeddingGate, EmbeddingScorer
from engine.scoring.ranker import RankerScorer
from engine.scoring.scorers import Bm25Scorer
from gateway.background_embedding import BackgroundEmbedder
from policies.recall import rank_fusion
from sessions.record import SessionRecord
from sessions.registry import SessionRegistry
from sessions.store import SessionStore
from tests.test_compression_e2e import python_module, tool_conversation

pytestmark = pytest.mark.engine

LOG_UNITS = [
    "INFO worker 3 finished batch 12 in 41 s\n",
    "INFO worker 5 finished batch 13 in 39 s\n",
    "FAILED: disk quota exceeded while writing /var/tmp/build-17.log\n",
    "INFO scheduler sleeping for 30 s\n",
]


def test_the_gate_reads_meaning_once_the_units_are_embedded(sentence_encoder: EmbeddingScorer) -> None:
    gate = EmbeddingGate(sentence_encoder, Bm25Scorer())
    question = "Why did the storage limit break the job?"  # no word in common with the failing line
    assert gate.score(LOG_UNITS, question) == Bm25Scorer().score(LOG_UNITS, question)  # not embedded yet
    assert gate.counters == {"gate_embedded": 0, "gate_lexical": 1} and sentence_encoder.units_embedded == 0

    assert sentence_encoder.embed_units(LOG_UNITS) == len(LOG_UNITS)
    assert sentence_encoder.has_vectors(LOG_UNITS) and sentence_encoder.embed_units(LOG_UNITS) == 0  # cached: read once
    scores = gate.score(LOG_UNITS, question)
    assert max(range(len(scores)), key=scores.__getitem__) == 2  # the quota line, by meaning
    assert gate.counters["gate_embedded"] == 1 and sentence_encoder.units_embedded == len(LOG_UNITS)  # only the question
    # The gate's evidence fuses the encoder's ranks with BM25's; what comes back is chosen by the encoder.
    evidence, choice = gate.gate_scores(LOG_UNITS, question)
    assert choice == sentence_encoder.score(LOG_UNITS, question) == scores
    assert evidence == rank_fusion([scores, Bm25Scorer().score(LOG_UNITS, question)])
    assert max(range(len(evidence)), key=evidence.__getitem__) == 2  # BM25 sees no word: the encoder decides


def test_the_ranker_names_its_background_encoder(sentence_encoder: EmbeddingScorer) -> None:
    assert bundle_of(RankerScorer(dense=sentence_encoder)).background is sentence_encoder
    assert isinstance(bundle_of(RankerScorer()).gate, Bm25Scorer) and bundle_of(RankerScorer()).background is None
    from engine.scoring.fusion import FusionScorer

    assert bundle_of(FusionScorer(sentence_encoder, name="hybrid")).background is None  # hybrid embeds while compressing


def _registry(tmp_path: Path) -> SessionRegistry:
    return SessionRegistry(SessionStore(tmp_path / "store", "fp", 3, 1 << 30), 1 << 30, "always")


def test_background_jobs_wait_for_an_idle_engine_and_persist_with_the_live_record(
        sentence_encoder: EmbeddingScorer, tmp_path: Path) -> None:
    async def scenario() -> tuple[SessionRecord, int, SessionRegistry]:
        registry = _registry(tmp_path)
        record = await registry.get_or_create("a" * 64, "", "x-session-id")
        idle = False
        background = BackgroundEmbedder(sentence_encoder, registry, lambda: idle, chunk_units=2)
        background.start()
        background.submit(record, LOG_UNITS)
        await asyncio.sleep(0.3)
        waited = sentence_encoder.units_embedded  # a turn is running: nothing read yet
        assert background.pending == 1
        idle = True
        for _ in range(200):
            if background.pending == 0:
                break
            await asyncio.sleep(0.05)
        await background.stop()
        assert background.counters["background_jobs"] == 1
        assert background.counters["background_units_embedded"] == len(LOG_UNITS)
        return record, waited, registry

    record, waited, registry = asyncio.run(scenario())
    assert waited == 0
    assert len(record.unit_features) == len(LOG_UNITS)
    stored = SessionStore(tmp_path / "store", "fp", 3, 1 << 30).load_record("a" * 64)
    registry.close()
    assert stored is not None and stored.unit_features == record.unit_features  # on disk with the session


def test_a_session_deleted_meanwhile_is_not_written_back(sentence_encoder: EmbeddingScorer, tmp_path: Path) -> None:
    async def scenario() -> SessionRegistry:
        registry = _registry(tmp_path)
        record = await registry.get_or_create("d" * 64, "", "x-session-id")
        await registry.save_record(record)
        await registry.delete(record.session_id)
        background = BackgroundEmbedder(sentence_encoder, registry, lambda: True)
        background.start()
        background.submit(record, LOG_UNITS)
        for _ in range(200):
            if background.pending == 0:
                break
            await asyncio.sleep(0.05)
        await background.stop()
        return registry

    registry = asyncio.run(scenario())
    registry.close()
    assert not SessionStore(tmp_path / "store", "fp", 3, 1 << 30).has("d" * 64)


def _wait_for(url: str, name: str, at_least: float, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while metric(url, name) < at_least:
        assert time.monotonic() < deadline, f"{name} stayed under {at_least}"
        time.sleep(0.1)


def test_gateway_gate_embeds_after_the_turn_and_a_restart_reads_only_the_question(
        start_gateway, tmp_path: Path) -> None:
    # No --embedder: the packaged encoder is converted into the store's model cache at the first
    # start, as `serve` does by default, and found there after the restart.
    flags = ("--recall-embedder", "--recall-theta", "0")
    session = {"X-Session-Id": "background-embedding"}
    messages = tool_conversation(python_module())

    def turn(url: str, history: list[dict]) -> httpx.Response:
        body = {"model": "m", "max_tokens": 4, "temperature": 0, "messages": history}
        r = httpx.post(f"{url}/v1/chat/completions", json=body, headers=session, timeout=300)
        assert r.status_code == 200, r.text
        return r

    server = start_gateway(*flags)
    assert (tmp_path / "store" / "models" / "all-minilm-l6-v2.f16.gguf").is_file()
    first = turn(server.url, messages)
    assert first.headers["X-PFlash-Compressed"] == "true" and first.headers["X-PFlash-Scorer"] == "ranker"
    _wait_for(server.url, "pflash_background_embedding_jobs_total", 1)
    embedded = metric(server.url, "pflash_background_embedded_units_total")
    assert embedded > 0
    messages += [{"role": "assistant", "content": first.json()["choices"][0]["message"]["content"]},
                 {"role": "user", "content": "What does helper_37 return?"}]
    second = turn(server.url, messages)
    assert second.headers["X-PFlash-Recall"] == "true"  # θ = 0: recall whenever something is hidden
    assert metric(server.url, 'pflash_recall_gate_scoring_total{scorer="embed"}') == 1
    assert metric(server.url, "pflash_background_embedded_units_total") == embedded  # the gate read no unit
    server.stop()

    restarted = start_gateway(*flags)  # same store: the vectors come back with the session
    messages += [{"role": "assistant", "content": second.json()["choices"][0]["message"]["content"]},
                 {"role": "user", "content": "And what does helper_12 return?"}]
    turn(restarted.url, messages)
    assert metric(restarted.url, 'pflash_recall_gate_scoring_total{scorer="embed"}') == 1
    assert metric(restarted.url, 'pflash_recall_gate_scoring_total{scorer="bm25"}') == 0
    assert metric(restarted.url, "pflash_background_embedded_units_total") == 0  # nothing embedded again


def test_a_missing_encoder_leaves_the_gate_on_bm25_with_a_warning_and_ametric(
        start_gateway, tmp_path: Path) -> None:
    server = start_gateway("--recall-embedder", "--ranker-embedder", "--embedder", str(tmp_path / "missing.gguf"))
    body = {"model": "m", "max_tokens": 4, "temperature": 0, "messages": tool_conversation(python_module())}
    r = httpx.post(f"{server.url}/v1/chat/completions", json=body, timeout=300)
    assert r.status_code == 200, r.text
    assert r.headers["X-PFlash-Scorer"] == "ranker"  # compression goes on, on the lexical weights
    assert r.headers["X-PFlash-Compressed"] == "true"
    assert metric(server.url, "pflash_gate_embedder_fallbacks_total") == 1
    assert metric(server.url, "pflash_scorer_fallbacks_total") == 0
    assert "ranks by words alone and the recall gate scores with bm25" in server.log()


def test_units_without_vectors_are_named_for_embedding_after_the_turn(sentence_encoder: EmbeddingScorer, model_path: Path) -> None:
    """A job lost to a restart: the gate scores with BM25 once and names the units, which the
    gateway embeds after that turn; the next follow-up reads them with the encoder."""
    from policies.conversation_types import Message
    from tests.test_recall_features import rewrite_setup

    service, messages = rewrite_setup(model_path)
    turns = service(RankerScorer(dense=sentence_encoder))
    record = SessionRecord(session_id="c" * 64, tenant="")
    _served, report, _ = asyncio.run(turns.rewrite(messages, record))
    assert report is not None and report.compressed and report.unit_texts
    follow = [*messages, Message("assistant", "Noted."), Message("user", "What does helper_37 return?")]
    _served, _report, recall = asyncio.run(turns.rewrite(follow, record))
    assert recall is not None and set(recall.unembedded) == set(report.unit_texts)
    assert turns.stats()["gate_lexical"] == 1

    sentence_encoder.embed_units(recall.unembedded)  # what the background job does after the turn
    follow += [Message("assistant", "It returns a norm."), Message("user", "And helper_12?")]
    _served, _report, recall = asyncio.run(turns.rewrite(follow, record))
    assert recall is not None and recall.unembedded == ()
    assert turns.stats()["gate_embedded"] == 1
