"""The drafter scorer, fusion, the feature cache and GGUF truncation, through the real model.
Model: Gemma 3 270M Q4_K_M, the fast base model (fixture `model_path`).
"""

from __future__ import annotations

import logging
import math
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from engine.scoring.drafter import (
    ActivationReader,
    DrafterError,
    DrafterScorer,
    fuse,
    to_mass,
)
from engine.scoring.feature_cache import FeatureCache
from engine.scoring.fusion import FusionScorer
from engine.scoring.scorers import Bm25Scorer
from engine.models.truncate_gguf import TruncateError, truncate_gguf
from policies.lexical import tokenize_for_search

pytestmark = pytest.mark.engine

ROOT = Path(__file__).resolve().parents[1]

REQUEST = "frobnicate_widget raises QuuxOverflowError when the zorblat buffer exceeds 4096"
TARGET = 2
UNITS = [
    "$ ls src\nmain.c\nutil.c\nMakefile\nREADME.md\n",
    "def add(a, b):\n    return a + b\n\n\ndef sub(a, b):\n    return a - b\n",
    ("Traceback (most recent call last):\n  File \"frob.py\", line 88, in frobnicate_widget\n"
     "    zorblat.grow(4096)\nQuuxOverflowError: zorblat buffer exceeds 4096 in frobnicate_widget\n"),
    "Paris is lovely in spring; cafes open their terraces and people stroll along rivers.\n",
    "SELECT id, name FROM customers ORDER BY created_at DESC LIMIT 20;\n",
]


@pytest.fixture(scope="module")
def drafter(model_path: Path) -> Iterator[DrafterScorer]:
    scorer = DrafterScorer(model_path, window=512, n_threads=2)
    yield scorer
    scorer.close()


@pytest.fixture(scope="module")
def truncated(model_path: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A 4-block drafter written by the real command line (`make-drafter`)."""
    out = tmp_path_factory.mktemp("drafter") / "drafter-4.gguf"
    proc = subprocess.run(
        [sys.executable, "-m", "gateway.cli", "make-drafter", "--model", str(model_path), "--blocks", "4",
         "--out", str(out)],
        cwd=ROOT, capture_output=True, text=True, timeout=180, check=False,
    )
    assert proc.returncode == 0, proc.stderr
    assert "4 of 18 blocks" in proc.stdout
    return out


def test_scores_one_finite_value_per_unit(drafter: DrafterScorer) -> None:
    for scorer in (drafter, FusionScorer(drafter)):
        scores = scorer.score(UNITS, REQUEST)
        assert len(scores) == len(UNITS)
        assert all(math.isfinite(s) and s >= 0 for s in scores)
        assert max(scores) > 0


def test_fusion_puts_the_unit_with_the_request_words_first(drafter: DrafterScorer) -> None:
    words = set(tokenize_for_search(REQUEST))
    assert all(not words & set(tokenize_for_search(u)) for k, u in enumerate(UNITS) if k != TARGET)
    scores = FusionScorer(drafter).score(UNITS, REQUEST)
    density = [s / len(drafter.tokenize(u)) for s, u in zip(scores, UNITS)]
    assert int(np.argmax(density)) == TARGET


def test_cache_makes_a_follow_up_read_only_the_request(drafter: DrafterScorer) -> None:
    units = [f"{u}# variant 7f3a\n" for u in UNITS]  # texts this module's scorer has not read yet
    before = drafter.stats()
    drafter.score(units, REQUEST)
    first = drafter.stats()
    assert first["units_read"] - before["units_read"] == len(units)
    assert first["cache_bytes"] > before["cache_bytes"]
    follow_up = "which query lists customers?"
    drafter.score(units, follow_up)
    second = drafter.stats()
    assert second["units_read"] == first["units_read"]
    assert second["units_cached"] - first["units_cached"] == len(units)
    assert second["requests_read"] - first["requests_read"] == 1
    assert second["tokens_read"] - first["tokens_read"] == len(drafter.tokenize(follow_up)) + 1  # + BOS
    assert drafter.cache_bytes == second["cache_bytes"]
    drafter.forget_features()  # a benchmark section's cold start: every unit is read again
    assert drafter.cache_bytes == 0
    drafter.score(units, follow_up)
    assert drafter.stats()["units_read"] - second["units_read"] == len(units)


def test_empty_request_fails_loudly(drafter: DrafterScorer) -> None:
    with pytest.raises(DrafterError):
        drafter.score(UNITS, "")


def test_feature_cache_is_a_byte_bounded_lru() -> None:
    vec = np.zeros(10, dtype=np.float32)
    cache = FeatureCache(2 * (vec.nbytes + FeatureCache.ENTRY_OVERHEAD))
    a, b, c = (FeatureCache.key(t) for t in "abc")
    cache.put(a, vec, 1)
    cache.put(b, vec, 1)
    assert cache.get(a) is not None  # a is now the most recent
    cache.put(c, vec, 1)
    assert cache.get(b) is None and cache.get(a) is not None and cache.get(c) is not None
    assert cache.bytes <= cache.budget_bytes and len(cache) == 2
    cache.clear()
    assert len(cache) == 0 and cache.bytes == 0 and cache.get(a) is None


def test_mass_keeps_the_order_and_zeroes_the_lower_half() -> None:
    mass = to_mass(np.array([0.1, 0.9, 0.5, 0.3]), [10, 10, 20, 10])
    assert mass[1] == 10 and mass[0] == 0 and mass[3] == 0 and 0 < mass[2] < 20
    assert to_mass(np.array([0.4, 0.4]), [5, 5]) == [0.0, 0.0]  # nothing stands out: flat
    # A unit BM25 did not match gets nothing from BM25: a match outranks any non-match's best.
    fused = fuse(np.array([0.0, 0.0, 0.2]), np.array([0.9, 0.8, 0.1]))
    assert int(np.argmax(fused)) == 2


def _tiny_gguf(path: Path, blocks: int) -> None:
    from gguf import GGUFWriter

    writer = GGUFWriter(str(path), "gemma3")
    writer.add_uint32("gemma3.block_count", blocks)
    writer.add_uint32("gemma3.embedding_length", 8)
    writer.add_string("general.name", "tiny")
    writer.add_array("tokenizer.ggml.tokens", ["<pad>", "a", "b"])
    writer.add_tensor("token_embd.weight", np.arange(24, dtype=np.float32).reshape(3, 8))
    writer.add_tensor("output_norm.weight", np.ones(8, dtype=np.float32))
    for k in range(blocks):
        writer.add_tensor(f"blk.{k}.attn_norm.weight", np.full(8, k, dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


def test_truncate_gguf_round_trip(tmp_path: Path) -> None:
    from gguf import GGUFReader

    src, dst = tmp_path / "tiny.gguf", tmp_path / "tiny-2.gguf"
    _tiny_gguf(src, 4)
    report = truncate_gguf(src, dst, 2)
    assert report["tensors_kept"] == 4 and report["tensors_dropped"] == 2
    a, b = GGUFReader(str(src)), GGUFReader(str(dst))
    assert int(b.fields["gemma3.block_count"].contents()) == 2
    for name, field in a.fields.items():
        if not name.startswith("GGUF.") and name != "gemma3.block_count":
            assert b.fields[name].contents() == field.contents(), name
    kept = {t.name: np.asarray(t.data) for t in b.tensors}
    assert sorted(kept) == ["blk.0.attn_norm.weight", "blk.1.attn_norm.weight", "output_norm.weight",
                            "token_embd.weight"]
    for t in a.tensors:
        if t.name in kept:
            assert np.array_equal(kept[t.name], np.asarray(t.data))
    for bad in (0, 5):
        with pytest.raises(TruncateError):
            truncate_gguf(src, tmp_path / "bad.gguf", bad)
    with pytest.raises(TruncateError):
        truncate_gguf(src, src, 2)
    assert not (tmp_path / "bad.gguf").exists()


def test_truncated_drafter_matches_the_full_model(model_path: Path, truncated: Path) -> None:
    full = ActivationReader(model_path, window=128, n_threads=2)
    small = ActivationReader(truncated, window=128, n_threads=2)
    try:
        assert (full.n_layer, small.n_layer) == (18, 4)
        tokens = full.tokenize("def frobnicate(widget):\n    return widget.grow(4096)\n")
        a = full.read(tokens, {"l_out-2": 1}, "l_out-2")["l_out-2"]
        b = small.read(tokens, {"l_out-2": 1}, "l_out-2")["l_out-2"]
        assert a.shape == (len(tokens) + 1, 640)
        np.testing.assert_allclose(a, b, rtol=0, atol=1e-5)
    finally:
        full.close()
        small.close()


def test_make_drafter_cli_reports_errors(tmp_path: Path) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "gateway.cli", "make-drafter", "--model", str(tmp_path / "missing.gguf"),
         "--blocks", "4", "--out", str(tmp_path / "out.gguf")],
        cwd=ROOT, capture_output=True, text=True, timeout=60, check=False,
    )
    assert proc.returncode == 2 and "not found" in proc.stderr
    assert not (tmp_path / "out.gguf").exists()


def test_gateway_builds_the_configured_scorer(truncated: Path, tmp_path: Path,
                                              caplog: pytest.LogCaptureFixture) -> None:
    from gateway.config import load_settings
    from gateway.scorer_factory import build_scorer

    settings = load_settings({"scorer": "drafter", "drafter": str(truncated), "store_dir": tmp_path, "n_threads": 2})
    scorer = build_scorer(settings).scorers.compress
    assert isinstance(scorer, DrafterScorer) and scorer.layer == 2  # a 4-block drafter reads block 2
    scorer.close()
    with caplog.at_level(logging.WARNING, logger="pflash.scorer"):
        broken = load_settings({"scorer": "fusion", "drafter": str(tmp_path / "missing.gguf"), "store_dir": tmp_path})
        choice = build_scorer(broken)
        assert isinstance(choice.scorers.compress, Bm25Scorer) and choice.fallback is not None
    assert any("bm25" in r.getMessage() for r in caplog.records)
