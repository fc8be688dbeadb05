"""The ranker with meaning (`ranker_embedder`, issue 12): the sentence encoder's cosine joins the
lexical features, so a request sharing no word with the output still finds what it means; an
encoder that fails or cannot load leaves the lexical weights; the units' vectors are read once, by
compression, and kept with the session for the recall gate."""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from pathlib import Path

import httpx
import numpy as np
import pytest

from engine.scoring.bundle import bundle_of
from benchmarks.followup_timing import metric
from engine.scoring.embedder import EmbedderError, EmbeddingGate, EmbeddingScorer
from engine.scoring.ranker import (
    ANSWERS_CALL,
    DENSE_FEATURES,
    MEANING_SHARE,
    SHIPPED_RANKER,
    UNASKED,
    WITH_MEANING,
    RankerScorer,
    load_weights,
    meaning_candidates,
    meaning_features,
    ranker_features,
)
from engine.scoring.scorers import Bm25Scorer
from tests.test_compression_e2e import post, tool_conversation, transcript

pytestmark = pytest.mark.engine

QUOTA_LINE = "ERROR writer-3: disk quota exceeded while writing /var/tmp/build-17.log\n"
QUESTION = "Why did the storage limit break the job?"  # no word in common with the quota line


def quota_log(n: int = 60) -> list[str]:
    units = [f"INFO worker {i % 7} finished batch {i} in {30 + i % 11} s\n" for i in range(n)]
    units[n // 2] = QUOTA_LINE
    return units


def test_meaning_features_rank_share_of_best_and_neighbours() -> None:
    x = meaning_features(5, np.arange(5), np.array([0.1, 0.5, 0.9, 0.8, 0.2]), [5, 5, 5, 0, 5])
    assert x.shape == (5, len(DENSE_FEATURES))
    rank, best, neighbour = x.T
    assert rank[2] == 1.0 and rank[3] == 0.0  # a blank unit (no word piece) is never relevant
    assert best[2] == 1.0 and best[1] == pytest.approx((0.5 - 0.2) / (0.9 - 0.2))  # above the median, of the best
    assert best[0] == best[3] == best[4] == 0.0  # at or below the median: no share
    assert neighbour[1] == neighbour[3] == 1.0 and neighbour[2] == pytest.approx(best[1])
    flat = meaning_features(2, np.arange(2), np.array([0.4, 0.4]), [3, 3])
    assert np.allclose(flat[:, 1:], 0.0) and flat[0, 0] == flat[1, 0]  # ties share one rank
    assert meaning_features(0, np.arange(0), np.zeros(0), []).shape == (0, len(DENSE_FEATURES))


def test_units_the_encoder_did_not_read_get_no_meaning_but_their_neighbours_show() -> None:
    x = meaning_features(5, np.array([1, 3]), np.array([0.2, 0.7]), [4, 4])
    assert x[[0, 2, 4], :2].tolist() == [[0.0, 0.0]] * 3  # not read
    assert x[3, :2].tolist() == [1.0, 1.0] and x[1, :2].tolist() == [0.0, 0.0]  # ranked among the read ones
    assert x[2, 2] == x[4, 2] == 1.0 and x[0, 2] == 0.0  # next to the best read unit


def test_the_encoder_reads_the_lexically_best_half_or_everything_without_evidence() -> None:
    model = load_weights(SHIPPED_RANKER)
    units = [*quota_log(40), "def compute_invoice_total(items):\n    return sum(items)\n"]
    sizes = [len(u) for u in units]
    x = ranker_features(units, "compute_invoice_total is wrong")
    read = meaning_candidates(x, model.sets[ANSWERS_CALL], sizes)
    assert len(units) - 1 in read and list(read) == sorted(read)
    assert sum(sizes[i] for i in read) <= MEANING_SHARE * sum(sizes) and len(read) < len(units)
    assert list(meaning_candidates(ranker_features(units, QUESTION), model.sets[ANSWERS_CALL], sizes)) == \
        list(range(len(units)))  # no word in common: meaning is all there is


def test_the_shipped_weights_have_a_set_with_meaning_for_each_kind() -> None:
    model = load_weights(SHIPPED_RANKER)
    for kind in (ANSWERS_CALL, UNASKED):
        lexical, meaning = model.sets[kind], model.sets[kind + WITH_MEANING]
        assert meaning.features == lexical.features + DENSE_FEATURES
        assert meaning.weights[-len(DENSE_FEATURES):].sum() > 0  # meaning raises a unit's odds
    info = model.info
    assert info["encoder"] == "all-minilm-l6-v2.f16.gguf" and info["splits"] == ["train", "validation"]
    cv = info["cross_validated_gold_kept_27"]
    assert cv["ranker"] > cv["ranker_lexical"] > cv["bm25"]  # what made meaning the default


def test_the_ranker_finds_by_meaning_what_shares_no_word(sentence_encoder: EmbeddingScorer) -> None:
    units = quota_log()
    assert RankerScorer().score(units, QUESTION) == [0.0] * len(units)  # words alone: no evidence
    scorer = RankerScorer(dense=sentence_encoder)
    scores = scorer.score(units, QUESTION)
    best_first = sorted(range(len(units)), key=lambda i: -scores[i])
    # Among the top three of sixty: the weights also lift the best unit's neighbours (the body
    # after a matching `def` line), so a one-line unit may stand just behind them.
    assert units.index(QUOTA_LINE) in best_first[:3]
    assert sentence_encoder.has_vectors(units)  # read once, by compression: the gate needs only the question
    assert bundle_of(scorer).unasked.meaning is sentence_encoder


class BrokenEncoder:
    """An encoder whose every call fails, as a corrupt file or an out-of-memory decode would."""

    def relevance(self, units: Sequence[str], request: str) -> tuple[np.ndarray, list[int]]:
        raise EmbedderError("llama_decode failed in the embedder")


def test_an_encoder_error_falls_back_to_the_lexical_weights_and_is_counted(caplog: pytest.LogCaptureFixture) -> None:
    units = [*quota_log(20), "def compute_invoice_total(items):\n    return sum(items)\n"]
    request = "Why is compute_invoice_total wrong?"
    scorer = RankerScorer(dense=BrokenEncoder())  # type: ignore[arg-type]
    with caplog.at_level("WARNING", logger="pflash.ranker"):
        assert scorer.score(units, request) == RankerScorer().score(units, request)
    assert scorer.unasked_scorer.score(units, request) == RankerScorer().unasked_scorer.score(units, request)
    assert scorer.meaning_failures.count == 2 and "by its words alone" in caplog.text  # one count for both sets
    from gateway.metrics import _turn_metrics

    family = next(m for m in _turn_metrics({"meaning_failures": 2.0}, "ranker") if m.name == "pflash_ranker_meaning_failures")
    assert family.samples[0].value == 2.0


def test_meaning_and_the_gate_are_switched_apart(sentence_encoder: EmbeddingScorer) -> None:
    words_only = RankerScorer(dense=sentence_encoder, read_meaning=False)
    assert words_only.meaning is None and isinstance(bundle_of(words_only).gate, EmbeddingGate)
    assert words_only.score(quota_log(), QUESTION) == [0.0] * 60
    bm25_gate = RankerScorer(dense=sentence_encoder, gate_meaning=False)
    assert bm25_gate.meaning is sentence_encoder and isinstance(bundle_of(bm25_gate).gate, Bm25Scorer)
    for ranker in (words_only, bm25_gate):  # one gate, asked of the top-level scorer: the unasked set shares it
        assert bundle_of(ranker).unasked.gate_scorer is bundle_of(ranker).gate


def test_the_factory_loads_no_encoder_when_both_switches_are_off(tmp_path: Path) -> None:
    from gateway.config import load_settings
    from gateway.scorer_factory import build_scorer

    off = build_scorer(load_settings({"store_dir": tmp_path, "ranker_embedder": False, "recall_embedder": False}))
    assert isinstance(off.scorers.compress, RankerScorer) and off.scorers.compress.dense is None and off.gate_fallback is None
    assert not (tmp_path / "models").exists()  # nothing converted: no encoder asked for



def test_gateway_compresses_by_meaning_and_keeps_the_vectors_for_the_gate(start_gateway) -> None:
    """Through a real gateway (default encoder): the quota line survives a question sharing no
    word with it; compression stored the vectors with the session, so no background job reads a
    unit and the follow-up's gate scores with the encoder at once, before and after a restart."""
    flags = ("--ranker-embedder", "--recall-embedder")
    server = start_gateway(*flags)
    session = "meaning-" + uuid.uuid4().hex
    output = "".join(quota_log(120))
    messages = tool_conversation(output, QUESTION)
    first = post(server, session, messages)
    assert first.headers["X-PFlash-Compressed"] == "true" and first.headers["X-PFlash-Scorer"] == "ranker"
    served = transcript(server, session)[3]["content"]
    assert QUOTA_LINE.strip() in served and len(served) < len(output) * 0.6
    messages += [reply(first), {"role": "user", "content": "Which worker finished batch 7?"}]
    second = post(server, session, messages)
    assert_the_gate_read_only_the_question(server.url)
    server.stop()
    restarted = start_gateway(*flags)  # same store: the vectors come back with the session
    messages += [reply(second), {"role": "user", "content": "And which one finished batch 9?"}]
    post(restarted, session, messages)
    assert_the_gate_read_only_the_question(restarted.url)


def reply(response: httpx.Response) -> dict[str, str]:
    return {"role": "assistant", "content": response.json()["choices"][0]["message"]["content"]}


def assert_the_gate_read_only_the_question(url: str) -> None:
    assert metric(url, 'pflash_recall_gate_scoring_total{scorer="embed"}') == 1
    assert metric(url, 'pflash_recall_gate_scoring_total{scorer="bm25"}') == 0
    assert metric(url, "pflash_background_embedded_units_total") == 0
    assert metric(url, "pflash_scorer_fallbacks_total") == 0
