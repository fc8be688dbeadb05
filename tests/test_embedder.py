"""The sentence-encoder scorer (issue 12): the packaged all-MiniLM-L6-v2 converted to GGUF by the real
command line and checked against the numpy reference, its ranking, its per-unit cache travelling
with the session, and the fallback to BM25 when it is missing."""

from __future__ import annotations

import asyncio
from pathlib import Path

import numpy as np
import pytest

from engine.scoring.bundle import bundle_of
from engine.scoring.embedder import EmbeddingScorer
from engine.models.embedder_convert import CHECK_SENTENCES, MIN_COSINE, WordPiece, _vocab, packaged_encoder_dir
from policies.conversation_types import Message
from sessions.record import SessionRecord
from tests.test_compression_e2e import python_module

pytestmark = pytest.mark.engine


def test_conversion_matches_the_reference_implementation(embedder_path: Path) -> None:
    from engine.models.embedder_convert import verify

    result = verify(packaged_encoder_dir(), embedder_path)
    assert len(result.cosines) == len(CHECK_SENTENCES)
    assert min(result.cosines) >= MIN_COSINE, result.cosines
    assert result.token_mismatches == 0  # llama.cpp's WordPiece reads the converted vocabulary as BERT does


def test_reference_wordpiece_splits_like_bert() -> None:
    wp = WordPiece(_vocab(packaged_encoder_dir()))
    ids = wp.encode("Unaffable FAILED: disk", 512)
    inverse = {i: t for t, i in wp.ids.items()}
    assert [inverse[i] for i in ids] == ["[CLS]", "una", "##ffa", "##ble", "failed", ":", "disk", "[SEP]"]


def test_a_broken_conversion_is_refused(embedder_path: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import engine.models.embedder_convert as conv

    # A conversion bug (query and key weights of block 0 swapped in the GGUF only): the check
    # against the reference, which reads the untouched weights, refuses the file.
    real = conv.read_safetensors
    calls = []

    def swapped_once(path: Path) -> dict[str, np.ndarray]:
        weights = dict(real(path))
        if not calls:
            q, k = "encoder.layer.0.attention.self.query.weight", "encoder.layer.0.attention.self.key.weight"
            weights[q], weights[k] = weights[k], weights[q]
        calls.append(path)
        return weights

    monkeypatch.setattr(conv, "read_safetensors", swapped_once)
    with pytest.raises(conv.EmbedderConversionError, match="disagrees with the reference"):
        conv.make_embedder(tmp_path / "bad.gguf")
    assert not (tmp_path / "bad.gguf").exists()


def test_meaning_beyond_shared_words(sentence_encoder: EmbeddingScorer) -> None:
    units = [
        "step 1: collected 4 items, all passed in 0.2s\n",
        "error: the job could not write its output because the storage allocation is exhausted\n",
        "Paris is lovely in spring; cafes open their terraces.\n",
    ]
    cos, _ = sentence_encoder.relevance(units, "Why did the build crash? Is the disk full?")
    assert int(np.argmax(cos)) == 1


def test_the_request_is_embedded_by_its_head(sentence_encoder: EmbeddingScorer) -> None:
    """Only the request's first max_query_tokens word pieces reach the encoder: the tail of a long
    task must not move the query vector (it does when the limit is lifted)."""
    units = ["the parser drops the last field of a quoted csv row\n", "the cache evicts the oldest entry\n"]
    head = "Fix the csv parser: a quoted row loses its last field. " * 12  # well over 128 word pieces
    first, _ = sentence_encoder.relevance(units, head + "Also the cache is slow.")
    second, _ = sentence_encoder.relevance(units, head + "Unrelated: the weather in Paris is lovely.")
    assert np.array_equal(first, second)
    sentence_encoder.max_query_tokens = 512
    lifted, _ = sentence_encoder.relevance(units, head + "Unrelated: the weather in Paris is lovely.")
    assert not np.allclose(first, lifted)


def test_units_are_embedded_once_and_travel_with_the_session(embedder_path: Path, model_path: Path) -> None:
    from engine.scoring.fusion import FusionScorer
    from tests.test_recall_features import rewrite_setup

    service, messages = rewrite_setup(model_path)
    before = EmbeddingScorer(embedder_path, n_threads=2)
    record = SessionRecord(session_id="a" * 64, tenant="")
    _served, report, _ = asyncio.run(service(FusionScorer(before, name="hybrid")).rewrite(messages, record))
    assert report is not None and report.compressed and report.scorer == "hybrid"
    assert before.units_embedded > 0 and record.unit_features
    before.close()

    restored = SessionRecord.from_dict(record.to_dict())  # what the store gives back after a restart
    after = EmbeddingScorer(embedder_path, n_threads=2)  # a new process: an empty cache
    follow = [*messages, Message("assistant", "Noted."), Message("user", "What does helper_37 return?")]
    _served, _report, recall = asyncio.run(service(FusionScorer(after, name="hybrid")).rewrite(follow, restored))
    assert recall is not None and recall.fired  # θ = 0: the gate scored every unit
    assert after.units_embedded == 0  # no unit embedded again: only the gate's query was read,
    # hybrid's default: the new question, then the one before it
    query = "What does helper_37 return?\n\nWhere is the invoice total computed?"
    assert after.tokens_read == len(after.encoder.tokenize(query))
    after.close()


def test_encoder_takes_every_core_only_while_the_engine_is_idle(embedder_path: Path) -> None:
    from engine.scoring.fusion import FusionScorer

    scorer = EmbeddingScorer(embedder_path)  # one thread while the engine works
    assert bundle_of(FusionScorer(scorer, name="hybrid")).encoder is scorer.encoder is bundle_of(scorer).encoder
    encoder = scorer.encoder
    texts = ["def add(a, b): return a + b", "The disk quota was exceeded.", "import numpy as np"]
    busy = encoder.embed(texts)
    assert encoder._threads == encoder.busy_threads == 1
    encoder.engine_idle = lambda: True
    idle = encoder.embed(texts)
    assert encoder._threads == encoder.idle_threads >= 1
    np.testing.assert_allclose((busy * idle).sum(axis=1), 1.0, atol=1e-4)  # same vectors either way
    encoder.engine_idle = lambda: False
    encoder.embed(texts)
    assert encoder._threads == 1
    scorer.close()


def test_gateway_serves_with_the_hybrid_scorer_and_falls_back_when_it_is_missing(
        start_gateway, embedder_path: Path, tmp_path: Path) -> None:
    import httpx

    from tests.test_compression_e2e import tool_conversation

    server = start_gateway("--scorer", "hybrid", "--embedder", str(embedder_path))
    body = {"model": "m", "max_tokens": 4, "messages": tool_conversation(python_module()), "temperature": 0}
    r = httpx.post(f"{server.url}/v1/chat/completions", json=body, timeout=300)
    assert r.status_code == 200, r.text
    assert r.headers["X-PFlash-Compressed"] == "true" and r.headers["X-PFlash-Scorer"] == "hybrid"
    assert "while the engine is idle" in server.log()  # the encoder knows when the cores are free
    server.stop()

    missing = start_gateway("--scorer", "hybrid", "--embedder", str(tmp_path / "missing.gguf"), store=tmp_path / "s2")
    r = httpx.post(f"{missing.url}/v1/chat/completions", json=body, timeout=300)
    assert r.status_code == 200, r.text
    assert r.headers["X-PFlash-Scorer"] == "bm25"  # stepped down, never an error
    metrics = httpx.get(f"{missing.url}/metrics", timeout=30).text
    assert "pflash_scorer_fallbacks_total 1.0" in metrics
    assert "sentence encoder unavailable" in missing.log()
