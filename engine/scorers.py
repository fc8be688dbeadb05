"""Relevance scorers: one value per unit of a long message, against the request text."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

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
