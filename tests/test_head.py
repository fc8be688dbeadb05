"""The learned relevance head (issues 9, 12): file format, drafter and encoder checks, the encoder's
features, training, features travelling with a session, serving end to end.
Model: Gemma 3 270M Q4_K_M, the fast base model (fixture `model_path`).
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

from engine.scoring.bundle import bundle_of
from engine.scoring.head import (
    ENCODER_KEY,
    SCALARS,
    HeadError,
    HeadScorer,
    RelevanceHead,
    head_features,
    load_head,
    save_head,
)
from benchmarks.training.head_train import TrainConfig, retention, train

D = 8  # a tiny "drafter" width for the synthetic tests
E = 4  # a tiny sentence encoder's
SHA = "ab" * 32


def _random_head(seed: int = 1, hidden: int = 4) -> RelevanceHead:
    rng = np.random.default_rng(seed)
    f = 2 * D + len(SCALARS)
    return RelevanceHead(rng.normal(size=f), rng.uniform(0.5, 2, f), rng.normal(size=(f, hidden)),
                         rng.normal(size=hidden), rng.normal(size=hidden), 0.25, 3, D, SHA, "tiny.gguf",
                         encoder_name="enc.gguf", encoder_n_embd=E, info={"note": "test"}).as_float32()


Synthetic = tuple[np.ndarray, np.ndarray, list[float], list[int], list[str], np.ndarray, np.ndarray]


def _message(rng: np.random.Generator, n: int = 24) -> Synthetic:
    """Units with a planted signal: positives lie along the request's direction; BM25 is noise
    that only weakly favours them, the encoder's cosine too. The first six are head_features'
    arguments, the last the labels."""
    q = rng.normal(size=D)
    units = rng.normal(size=(n, D))
    labels = np.zeros(n, dtype=bool)
    labels[rng.choice(n, size=3, replace=False)] = True
    units[labels] += 2.5 * q
    bm25 = list(np.maximum(rng.normal(size=n) + 0.3 * labels, 0.0))
    tokens = list(rng.integers(20, 60, size=n))
    embed_cos = np.clip(rng.normal(0.2, 0.1, size=n) + 0.05 * labels, -1, 1)
    return units, q, bm25, tokens, ["code"] * n, embed_cos, labels


def test_gguf_round_trip_gives_identical_scores(tmp_path: Path) -> None:
    head = _random_head()
    path = tmp_path / "h.gguf"
    save_head(head, path)
    back = load_head(path, SHA)
    x = head_features(*_message(np.random.default_rng(0))[:6])
    assert np.array_equal(head.logits(x), back.logits(x))
    assert (back.tap_layer, back.n_embd, back.info) == (3, D, {"note": "test"})
    assert (back.encoder_name, back.encoder_n_embd) == ("enc.gguf", E)
    save_head(back, tmp_path / "again.gguf")  # same head, same bytes
    assert (tmp_path / "again.gguf").read_bytes() == path.read_bytes()


def test_head_for_another_drafter_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "h.gguf"
    save_head(_random_head(), path)
    with pytest.raises(HeadError, match="trained on drafter tiny.gguf"):
        load_head(path, "cd" * 32)
    with pytest.raises(HeadError, match="not found"):
        load_head(tmp_path / "missing.gguf")


def test_training_learns_a_planted_signal_deterministically(tmp_path: Path) -> None:
    rng = np.random.default_rng(7)
    msgs = [_message(rng) for _ in range(60)]
    xs = [head_features(*m[:6]) for m in msgs]
    labels = [m[6] for m in msgs]
    tokens = [np.asarray(m[3]) for m in msgs]
    items = [[[int(k)] for k in np.flatnonzero(m[6])] for m in msgs]
    tr, va = list(range(40)), list(range(40, 60))
    meta = {"tap_layer": 3, "n_embd": D, "drafter_sha256": SHA}
    cfg = TrainConfig(hidden=8, epochs=15, patience=15, lr=1e-2, seed=3)
    first = train(xs, labels, tokens, items, tr, va, cfg, meta, progress=False)
    second = train(xs, labels, tokens, items, tr, va, cfg, meta, progress=False)
    assert np.array_equal(first.head.w1, second.head.w1) and np.array_equal(first.head.w2, second.head.w2)
    save_head(first.head, tmp_path / "a.gguf")
    save_head(second.head, tmp_path / "b.gguf")
    assert (tmp_path / "a.gguf").read_bytes() == (tmp_path / "b.gguf").read_bytes()
    bm25 = float(np.mean([retention(msgs[i][2], tokens[i], items[i]) for i in va]))
    assert first.val_retention >= 0.9 and first.val_retention >= bm25 + 0.25, (first.val_retention, bm25)


def test_the_encoders_cosine_its_share_and_rank_are_features() -> None:
    units, q, bm25, tokens, kinds, _, _ = _message(np.random.default_rng(2), n=4)
    x = head_features(units, q, bm25, tokens, kinds, [0.1, 0.4, -1.0, 0.2])
    assert SCALARS[-3:] == ("embed_cos", "embed_share", "embed_rank")
    np.testing.assert_allclose(x[:, -3], [0.1, 0.4, -1.0, 0.2])
    np.testing.assert_allclose(x[:, -2], [0.25, 1.0, 0.0, 0.5])  # share of the best; a blank unit 0
    np.testing.assert_allclose(x[:, -1], [2 / 3, 0.0, 1.0, 1 / 3])  # rank, best first


def test_training_learns_a_signal_only_the_encoder_sees() -> None:
    """Drafter vectors and BM25 are noise; only the encoder's cosine tells the positives apart."""
    rng = np.random.default_rng(11)
    msgs = []
    for _ in range(60):
        units, q, bm25, tokens, kinds, _, labels = _message(rng)
        units = rng.normal(size=units.shape)  # no planted direction
        bm25 = list(np.maximum(rng.normal(size=len(bm25)), 0.0))
        embed_cos = np.where(labels, 0.55, 0.2) + rng.normal(0, 0.05, size=len(labels))
        msgs.append((units, q, bm25, tokens, kinds, embed_cos, labels))
    xs = [head_features(*m[:6]) for m in msgs]
    tokens = [np.asarray(m[3]) for m in msgs]
    items = [[[int(k)] for k in np.flatnonzero(m[6])] for m in msgs]
    meta = {"tap_layer": 3, "n_embd": D, "drafter_sha256": SHA, "encoder_n_embd": E}
    cfg = TrainConfig(hidden=8, epochs=15, patience=15, lr=1e-2, seed=3)
    result = train(xs, [m[6] for m in msgs], tokens, items, list(range(40)), list(range(40, 60)), cfg, meta,
                   progress=False)
    bm25 = float(np.mean([retention(msgs[i][2], tokens[i], items[i]) for i in range(40, 60)]))
    assert result.val_retention >= 0.9 and result.val_retention >= bm25 + 0.25, (result.val_retention, bm25)
    assert result.head.encoder_n_embd == E


class _Store:
    """A model's FeatureStore side: what it exports, and what it was given back."""

    def __init__(self, tag: str) -> None:
        self.tag = tag
        self.given: dict[str, tuple[bytes, int]] = {}

    def export_features(self, units: list[str]) -> dict[str, tuple[bytes, int]]:
        return {f"{k:02x}": (self.tag.encode(), k) for k in range(len(units))}

    def import_features(self, features: dict[str, tuple[bytes, int]]) -> int:
        self.given = dict(features)
        return len(features)


def _stub_head_scorer(encoder_width: int = E) -> HeadScorer:
    drafter, encoder = _Store("drafter"), _Store("encoder")
    drafter.layer, drafter._reader = 3, SimpleNamespace(n_embd=D)  # type: ignore[attr-defined]
    encoder.encoder = SimpleNamespace(n_embd=encoder_width)  # type: ignore[attr-defined]
    return HeadScorer(_random_head(), drafter, encoder)


def test_both_models_features_travel_and_come_back_to_their_owner() -> None:
    saved = _stub_head_scorer().export_features(["a", "b"])
    assert saved == {"00": (b"drafter", 0), "01": (b"drafter", 1),
                     ENCODER_KEY + "00": (b"encoder", 0), ENCODER_KEY + "01": (b"encoder", 1)}
    fresh = _stub_head_scorer()
    assert fresh.import_features(saved) == 4
    assert fresh.drafter.given == {"00": (b"drafter", 0), "01": (b"drafter", 1)}
    assert fresh.encoder.given == {"00": (b"encoder", 0), "01": (b"encoder", 1)}
    older = _stub_head_scorer()  # a session saved by a head before issue 12: drafter features only
    older.import_features({"00": (b"drafter", 0)})
    assert older.drafter.given == {"00": (b"drafter", 0)} and older.encoder.given == {}


def test_an_encoder_of_another_width_is_refused() -> None:
    with pytest.raises(HeadError, match="4-wide sentence encoder"):
        _stub_head_scorer(encoder_width=E + 1)


@pytest.mark.engine
def test_a_follow_up_after_a_restart_reads_only_the_question(model_path: Path, embedder_path: Path) -> None:
    """The shipped head on the real drafter and encoder: its units' features of both models are kept
    with the session, so the recall gate after a restart reads only the new question."""
    from engine.scoring.head import open_head_scorer
    from policies.conversation_types import Message
    from sessions.record import SessionRecord
    from tests.test_recall_features import rewrite_setup

    service, messages = rewrite_setup(model_path)
    before = open_head_scorer(None, model_path, embedder_path, n_threads=2)
    assert bundle_of(before).encoder is before.encoder.encoder  # the gateway gives it every core while idle
    record = SessionRecord(session_id="h" * 64, tenant="")
    _served, report, _ = asyncio.run(service(before).rewrite(messages, record))
    assert report is not None and report.compressed and report.scorer == "head"
    assert before.drafter.counters.units_read > 0 and before.encoder.units_embedded > 0
    assert any(k.startswith(ENCODER_KEY) for k in record.unit_features)
    before.close()

    restored = SessionRecord.from_dict(record.to_dict())  # what the store gives back after a restart
    after = open_head_scorer(None, model_path, embedder_path, n_threads=2)  # empty caches
    follow = [*messages, Message("assistant", "Noted."), Message("user", "What does helper_37 return?")]
    _served, _report, recall = asyncio.run(service(after).rewrite(follow, restored))
    assert recall is not None and recall.fired  # θ = 0: the gate scored every unit
    assert after.drafter.counters.units_read == 0 and after.encoder.units_embedded == 0
    assert after.drafter.counters.requests_read == 1
    after.close()


@pytest.mark.engine
@pytest.mark.parametrize("missing", ["head", "embedder"])
def test_missing_head_or_encoder_falls_back_to_fusion_once(missing: str, model_path: Path, tmp_path: Path,
                                                           caplog: pytest.LogCaptureFixture) -> None:
    from engine.scoring.fusion import FusionScorer
    from gateway.config import load_settings
    from gateway.scorer_factory import build_scorer

    settings = load_settings({"scorer": "head", missing: str(tmp_path / "nope.gguf"), "store_dir": tmp_path,
                              "model": str(model_path), "n_threads": 2})
    with caplog.at_level(logging.WARNING, logger="pflash.scorer"):
        choice = build_scorer(settings)
    scorer = choice.scorers.compress
    assert isinstance(scorer, FusionScorer) and choice.fallback is not None
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and "head unavailable" in warnings[0].getMessage()
    assert "nope.gguf" in warnings[0].getMessage() and "nope.gguf" in (choice.fallback or "")
    scorer.close()


@pytest.mark.engine
def test_head_scorer_compresses_end_to_end(start_gateway, embedder_path: Path) -> None:
    from tests.test_compression_e2e import post, python_module, tool_conversation

    server = start_gateway("--scorer", "head", "--embedder", str(embedder_path), "--n-threads", "2")
    response = post(server, "head-" + uuid.uuid4().hex, tool_conversation(python_module()))
    assert response.headers["X-PFlash-Scorer"] == "head"
    assert response.headers["X-PFlash-Compressed"] == "true"
    assert int(response.headers["X-PFlash-Kept-Tokens"]) < int(response.headers["X-PFlash-Original-Tokens"])


def test_unit_kinds_match_segmentation() -> None:
    from engine.scoring.head import unit_kinds
    from policies.rendering import split_lines
    from policies.segmentation import segment
    from tests.test_compression_e2e import python_module

    lines = split_lines(python_module(12) + "\n\n\n")
    units = segment(lines, [len(x) // 4 + 1 for x in lines], 8, 64)
    texts = ["".join(lines[u.first : u.last + 1]) for u in units]
    assert unit_kinds(texts) == [u.kind for u in units]


@pytest.mark.engine
def test_train_head_command_trains_with_the_encoder_and_the_gateway_loads_it(model_path: Path, embedder_path: Path,
                                                                              tmp_path: Path) -> None:
    """`python -m benchmarks.train head` end to end on a tiny MTRAG-shaped data folder (conversation ids of
    the frozen train and validation splits, invented passages): it reads the drafter and the encoder,
    writes a head that records its encoder, and a scorer opens it on the same files."""
    import json
    import subprocess
    import sys

    import zstandard

    from engine.scoring.head import load_head, open_head_scorer
    from benchmarks.training.splits import SPLITS_FILE
    from tests.conftest import ROOT

    sides = json.loads(SPLITS_FILE.read_text())["splits"]["mtrag"]
    ids = [next(c for c, s in sorted(sides.items()) if s == side) for side in ("train", "validation")]
    topics = ["tax refunds for freelancers", "mortgage interest deductions", "index fund expense ratios",
              "credit card balance transfers", "emergency savings accounts", "stock option vesting"]
    records = []
    for n, cid in enumerate(ids):
        for turn, k in enumerate((n, n + 2), start=1):
            records.append({"conversation_id": cid, "turn": str(turn), "Collection": "tiny",
                            "contexts": [{"document_id": f"d{k}", "text": f"All about {topics[k]}. " * 12}],
                            "input": [{"speaker": "user", "text": f"Tell me about {topics[k]}."}]})
    records.append({"conversation_id": ids[0], "turn": "3", "Collection": "tiny", "input": [],
                    "contexts": [{"document_id": f"d{k}", "text": f"All about {topics[k]}. " * 12} for k in (4, 5)]})
    data = tmp_path / "data"
    data.mkdir()
    raw = "".join(json.dumps(r) + "\n" for r in records).encode()
    (data / "mtrag-un-reference.jsonl.zst").write_bytes(zstandard.ZstdCompressor().compress(raw))
    out = tmp_path / "head.gguf"
    proc = subprocess.run([sys.executable, "-m", "benchmarks.train", "head", "--out", str(out), "--data", str(data),
                           "--drafter", str(model_path), "--embedder", str(embedder_path), "--epochs", "3",
                           "--store-dir", str(tmp_path / "store"), "--n-threads", "2"],
                          cwd=ROOT, capture_output=True, text=True, timeout=600, check=False)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "embed " in proc.stderr  # the encoder alone is reported beside the head
    head = load_head(out)
    assert head.encoder_name == embedder_path.name and head.encoder_n_embd == 384
    scorer = open_head_scorer(out, model_path, embedder_path, n_threads=2)
    try:
        mass = scorer.score([f"All about {t}.\n" for t in topics], "Tell me about mortgage interest deductions.")
        assert len(mass) == len(topics) and all(m >= 0 for m in mass)
    finally:
        scorer.close()
