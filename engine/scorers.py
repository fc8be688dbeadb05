"""Relevance scorers: one value per unit of a long message, against the request text."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Protocol

from policies.lexical import bm25_scores


class Scorer(Protocol):
    name: str

    def score(self, units: Sequence[str], request: str) -> list[float]:
        """One non-negative relevance value per unit; raises on failure (the caller serves whole)."""
        ...


class Bm25Scorer:
    """Lexical relevance, no model: the fallback when no drafter is configured."""

    name = "bm25"

    def score(self, units: Sequence[str], request: str) -> list[float]:
        return bm25_scores(units, request)


def gate_scorer_of(scorer: Any) -> Scorer:
    """What the recall gate scores with: the scorer's own `gate_scorer` when it names one (the ranker's
    weights were fitted to choose what to keep of a new output, not to ask whether a later question
    needs what was left out), else the scorer itself."""
    return getattr(scorer, "gate_scorer", scorer)  # type: ignore[no-any-return]


def unasked_scorer_of(scorer: Any) -> Scorer:
    """What scores a transcript no call asked for (policies/transcript.py: a pasted session log): the
    scorer's own `unasked_scorer` when it has one (the ranker's second weight set), else the scorer."""
    return getattr(scorer, "unasked_scorer", scorer)  # type: ignore[no-any-return]


class FeatureStore(Protocol):
    """A scorer whose per-unit features can travel with a session (the drafter's)."""

    def export_features(self, units: Sequence[str]) -> dict[str, tuple[bytes, int]]: ...

    def import_features(self, features: Mapping[str, tuple[bytes, int]]) -> int: ...


def feature_store_of(scorer: Any) -> FeatureStore | None:
    """The model behind a scorer (itself, the dense scorer fusion wraps, the head's drafter), if any."""
    for candidate in (scorer, getattr(scorer, "dense", None), getattr(scorer, "drafter", None)):
        if candidate is not None and hasattr(candidate, "export_features") and hasattr(candidate, "import_features"):
            return candidate  # type: ignore[no-any-return]
    return None
