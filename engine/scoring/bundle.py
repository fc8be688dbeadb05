"""What a configured relevance scorer offers the gateway, stated where the scorer is built.

A scorer is more than its `score`: the ranker ranks a transcript no call asked for with a second
weight set, the recall gate asks another scorer (and may read its units two ways), a model-backed
scorer's unit features travel with a session, and a sentence encoder takes every core while the
engine is idle or embeds units after a turn. Each scorer class says which in its `bundle()`; the
gateway reads the bundle and never probes a scorer's attributes.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
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
