"""The learned relevance head (issue 9): file format, drafter check, training, serving end to end.
Model: Gemma 3 270M Q4_K_M, the fast base model (fixture `model_path`).
"""

from __future__ import annotations

import logging
import uuid
from pathlib import Path

import numpy as np
import pytest

from engine.head import (
    SCALARS,
    SHIPPED_HEAD,
    HeadError,
    RelevanceHead,
    head_features,
    load_head,
    save_head,
)
from engine.head_train import TrainConfig, retention, train

D = 8  # a tiny "drafter" width for the synthetic tests
SHA = "ab" * 32


def _random_head(seed: int = 1, hidden: int = 4) -> RelevanceHead:
    rng = np.random.default_rng(seed)
    f = 2 * D + len(SCALARS)
    return RelevanceHead(rng.normal(size=f), rng.uniform(0.5, 2, f), rng.normal(size=(f, hidden)),
                         rng.normal(size=hidden), rng.normal(size=hidden), 0.25, 3, D, SHA, "tiny.gguf",
                         {"note": "test"}).as_float32()


def _message(rng: np.random.Generator, n: int = 24) -> tuple[np.ndarray, np.ndarray, list[float], list[int], list[str], np.ndarray]:
    """Units with a planted signal: positives lie along the request's direction; BM25 is noise
    that only weakly favours them."""
    q = rng.normal(size=D)
    units = rng.normal(size=(n, D))
    labels = np.zeros(n, dtype=bool)
    labels[rng.choice(n, size=3, replace=False)] = True
    units[labels] += 2.5 * q
    bm25 = list(np.maximum(rng.normal(size=n) + 0.3 * labels, 0.0))
    tokens = list(rng.integers(20, 60, size=n))
    return units, q, bm25, tokens, ["code"] * n, labels


def test_gguf_round_trip_gives_identical_scores(tmp_path: Path) -> None:
    head = _random_head()
    path = tmp_path / "h.gguf"
    save_head(head, path)
    back = load_head(path, SHA)
    x = head_features(*_message(np.random.default_rng(0))[:5])
    assert np.array_equal(head.logits(x), back.logits(x))
    assert (back.tap_layer, back.n_embd, back.info) == (3, D, {"note": "test"})
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
    xs = [head_features(*m[:5]) for m in msgs]
    labels = [m[5] for m in msgs]
    tokens = [np.asarray(m[3]) for m in msgs]
    items = [[[int(k)] for k in np.flatnonzero(m[5])] for m in msgs]
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


@pytest.mark.engine
def test_missing_head_falls_back_to_fusion_once(model_path: Path, tmp_path: Path,
                                                caplog: pytest.LogCaptureFixture) -> None:
    from engine.drafter import FusionScorer
    from gateway.config import load_settings
    from gateway.scorer_factory import build_scorer

    settings = load_settings({"scorer": "head", "head": str(tmp_path / "nope.gguf"), "store_dir": tmp_path,
                              "model": str(model_path),
                              "n_threads": 2})
    with caplog.at_level(logging.WARNING, logger="pflash.scorer"):
        choice = build_scorer(settings)
    scorer = choice.scorer
    assert isinstance(scorer, FusionScorer) and choice.fallback is not None
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and "head unavailable" in warnings[0].getMessage()
    scorer.close()


@pytest.mark.engine
def test_head_scorer_compresses_end_to_end(start_gateway) -> None:
    from tests.test_compression_e2e import post, python_module, tool_conversation

    if not SHIPPED_HEAD.is_file():
        pytest.skip("no shipped head: run `pflash-gateway train-head --out engine/heads/gemma3-270m.head.gguf`")
    server = start_gateway("--scorer", "head", "--n-threads", "2")
    response = post(server, "head-" + uuid.uuid4().hex, tool_conversation(python_module()))
    assert response.headers["X-PFlash-Scorer"] == "head"
    assert response.headers["X-PFlash-Compressed"] == "true"
    assert int(response.headers["X-PFlash-Kept-Tokens"]) < int(response.headers["X-PFlash-Original-Tokens"])


def test_unit_kinds_match_segmentation() -> None:
    from engine.head import unit_kinds
    from policies.rendering import split_lines
    from policies.segmentation import segment
    from tests.test_compression_e2e import python_module

    lines = split_lines(python_module(12) + "\n\n\n")
    units = segment(lines, [len(x) // 4 + 1 for x in lines], 8, 64)
    texts = ["".join(lines[u.first : u.last + 1]) for u in units]
    assert unit_kinds(texts) == [u.kind for u in units]
