"""What a configured relevance scorer offers the gateway, stated where the scorer is built.

A scorer is more than its `score`: the ranker ranks a transcript no call asked for with a second
weight set, the recall gate asks another scorer (and may read its units two ways), a model-backed
scorer's unit features travel with a session, and a sentence encoder takes every core while the
engine is idle or embeds units after a turn. `bundle_of` says which for each scorer class (the
scorers know nothing of bundles: the dependency goes one way); the gateway reads the bundle and
never probes a scorer's attributes.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING

from engine.scoring.scorers import FeatureStore, GateScores, Scorer

if TYPE_CHECKING:
    from engine.scoring.embedder import EmbeddingScorer, LlamaEncoder
    from engine.scoring.ranker import MeaningFailures

GateReadings = Callable[[Sequence[str], str], GateScores]


@dataclass(frozen=True)
class ScorerBundle:
    compress: Scorer  # ranks a new output's units against the request
    unasked: Scorer  # ranks a transcript no call asked for (policies/transcript.py)
    gate: Scorer  # the recall gate's scorer
    # The gate's two readings (evidence, choice) when it separates them (engine/scoring/embedder.py's
    # EmbeddingGate); otherwise its one score serves both.
    gate_readings: GateReadings | None = None
    features: FeatureStore | None = None  # unit features a session keeps (restarts, recall)
    encoder: LlamaEncoder | None = None  # given every core while the engine is idle
    background: EmbeddingScorer | None = None  # embeds a compressed output's units after its turn
    meaning_failures: MeaningFailures | None = None  # /metrics: messages ranked by words alone
    gate_counters: Mapping[str, int] = field(default_factory=dict)  # /metrics: the gate's own

    @property
    def name(self) -> str:
        return self.compress.name

    def gate_scores(self, units: Sequence[str], request: str) -> GateScores:
        if self.gate_readings is not None:
            return self.gate_readings(units, request)
        scores = self.gate.score(units, request)
        return GateScores(scores, scores)

    def counters(self) -> dict[str, float]:
        out: dict[str, float] = dict(self.gate_counters)
        if self.meaning_failures is not None:
            out["meaning_failures"] = self.meaning_failures.count
        return out


def single(scorer: Scorer, features: FeatureStore | None = None) -> ScorerBundle:
    """A scorer that plays every role itself (bm25, drafter, fusion, a test's stub)."""
    return ScorerBundle(scorer, scorer, scorer, features=features)


def bundle_of(scorer: Scorer) -> ScorerBundle:
    """What a scorer offers, by its class (imported here only: each pulls in its model code)."""
    from engine.scoring.drafter import DrafterScorer
    from engine.scoring.embedder import EmbeddingGate, EmbeddingScorer
    from engine.scoring.fusion import FusionScorer
    from engine.scoring.head import HeadScorer
    from engine.scoring.ranker import RankerScorer

    if isinstance(scorer, RankerScorer):
        # Its unasked set for transcripts, its own gate; the encoder's unit vectors travel with a
        # session, and a gate that reads meaning has the units it lacks embedded after the turn.
        gate = scorer.gate_scorer
        embedding = gate if isinstance(gate, EmbeddingGate) else None
        return ScorerBundle(
            scorer, scorer.unasked_scorer, gate,
            gate_readings=embedding.gate_scores if embedding is not None else None,
            features=scorer.dense, encoder=scorer.dense.encoder if scorer.dense is not None else None,
            background=embedding.dense if embedding is not None else None,
            meaning_failures=scorer.meaning_failures,
            gate_counters=embedding.counters if embedding is not None else {},
        )
    if isinstance(scorer, HeadScorer):  # plays every role; both models' features travel with a session
        return ScorerBundle(scorer, scorer, scorer, features=scorer, encoder=scorer.encoder.encoder)
    if isinstance(scorer, FusionScorer):  # plays every role; the dense model's features and encoder are its own
        return replace(bundle_of(scorer.dense), compress=scorer, unasked=scorer, gate=scorer)
    if isinstance(scorer, EmbeddingScorer):  # its unit vectors travel with a session; its encoder gets idle cores
        return replace(single(scorer, features=scorer), encoder=scorer.encoder)
    if isinstance(scorer, DrafterScorer):  # its unit features travel with a session
        return single(scorer, features=scorer)
    return single(scorer)
