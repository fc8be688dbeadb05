"""The scorer bundle (engine/scoring/bundle.py) is complete for every scorer name: what the gateway
reads of a scorer (its roles, the features a session keeps, the encoder it gives every core when
idle, the background encoder, the gate's readings and counters) is stated where it is built."""

from __future__ import annotations

import typing
from pathlib import Path

import pytest

from engine.scoring.embedder import EmbeddingScorer
from engine.scoring.bundle import ScorerBundle, bundle_of
from engine.scoring.scorers import Bm25Scorer
from gateway.config import Settings, load_settings
from gateway.scorer_factory import build_scorer

SCORER_NAMES = typing.get_args(Settings.model_fields["scorer"].annotation)
UNITS = ["def compute_invoice_total(items, tax_rate):\n    return sum(items) * (1 + tax_rate)\n",
         "def helper(values):\n    return max(values)\n", "README: install with make\n"]
QUESTION = "Where is the invoice total computed?"

# name -> (keeps unit features with a session, has a sentence encoder, embeds in the background)
EXPECTED = {
    "ranker": (True, True, True),
    "bm25": (False, False, False),
    "embed": (True, True, False),
    "hybrid": (True, True, False),
    "drafter": (True, False, False),
    "fusion": (True, False, False),
    "head": (True, True, False),
}


def test_every_scorer_name_is_covered() -> None:
    assert set(SCORER_NAMES) == set(EXPECTED)


@pytest.mark.engine
@pytest.mark.parametrize("name", SCORER_NAMES)
def test_the_bundle_is_complete_for_every_scorer_name(name: str, model_path: Path, embedder_path: Path,
                                                      tmp_path: Path) -> None:
    settings = load_settings({"scorer": name, "drafter": str(model_path), "embedder": str(embedder_path),
                              "store_dir": tmp_path, "n_threads": 2})
    choice = build_scorer(settings)
    assert choice.fallback is None, choice.fallback  # the configured scorer itself, not a fallback
    bundle = choice.scorers
    assert isinstance(bundle, ScorerBundle) and bundle.name == name
    for role in (bundle.compress, bundle.unasked, bundle.gate):
        scores = role.score(UNITS, QUESTION)
        assert len(scores) == len(UNITS) and all(s >= 0 for s in scores)
    evidence, choice_scores = bundle.gate_scores(UNITS, QUESTION)
    assert len(evidence) == len(choice_scores) == len(UNITS)
    keeps, encodes, background = EXPECTED[name]
    assert (bundle.features is not None) == keeps
    if keeps:  # what a session keeps comes back whole
        exported = bundle.features.export_features(UNITS)
        bundle.features.forget_features()  # as after a restart: the session's copy is all there is
        assert exported and bundle.features.import_features(exported) == len(exported)
        assert bundle.features.import_features(exported) == 0  # already cached: nothing added twice
    assert (bundle.encoder is not None) == encodes
    assert (bundle.background is not None) == background
    if background:
        assert isinstance(bundle.background, EmbeddingScorer)
        assert bundle.gate_readings is not None and set(bundle.counters()) >= {"gate_embedded", "meaning_failures"}
    assert all(isinstance(v, (int, float)) for v in bundle.counters().values())


def test_a_model_free_scorer_plays_every_role_itself() -> None:
    bundle = bundle_of(Bm25Scorer())
    assert bundle.compress is bundle.unasked is bundle.gate
    assert bundle.features is bundle.encoder is bundle.background is None and bundle.counters() == {}
    scores = bundle.compress.score(UNITS, QUESTION)
    assert bundle.gate_scores(UNITS, QUESTION) == (scores, scores)


def test_scorers_know_nothing_of_bundles_the_dependency_goes_one_way() -> None:
    """engine/scoring/bundle.py says what each scorer offers (bundle_of); no scorer imports it back."""
    from pathlib import Path

    scoring = Path(__file__).resolve().parents[1] / "engine" / "scoring"
    importers = [p.name for p in scoring.glob("*.py") if p.name != "bundle.py" and "engine.scoring.bundle" in p.read_text()]
    assert importers == []
    assert not any(hasattr(cls, "bundle") for cls in _scorer_classes())


def _scorer_classes() -> list[type]:
    from engine.scoring.drafter import DrafterScorer
    from engine.scoring.embedder import EmbeddingScorer
    from engine.scoring.fusion import FusionScorer
    from engine.scoring.head import HeadScorer
    from engine.scoring.ranker import RankerScorer
    from engine.scoring.scorers import Bm25Scorer

    return [Bm25Scorer, DrafterScorer, EmbeddingScorer, FusionScorer, HeadScorer, RankerScorer]
