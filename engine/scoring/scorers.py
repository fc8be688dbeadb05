"""Relevance scorers: one value per unit of a long message, against the request text."""

from __future__ import annotations

import hashlib
import threading
from collections import Counter
from collections.abc import Mapping, Sequence
from typing import NamedTuple, Protocol

from cachetools import LRUCache

from policies.lexical import bm25_of_counts, tokenize_for_search

# A unit's counts take ~10 KB; a 17K-token output has ~50 units: ~10 MB for the last ~20 long messages.
DEFAULT_CACHED_UNITS = 1024


class Scorer(Protocol):
    name: str

    def score(self, units: Sequence[str], request: str) -> list[float]:
        """One non-negative relevance value per unit; raises on failure (the caller serves whole)."""
        ...


def size_exponent(scorer: Scorer) -> float:
    """How the planner weighs a unit's size against this scorer's relevance (policies/selection.py):
    1, relevance per token, unless the scorer declares its own (the ranker's is chosen with its weights)."""
    return float(getattr(scorer, "size_exponent", 1.0))


class Bm25Scorer:
    """Lexical relevance, no model: the fallback when no drafter is configured.

    Keeps each unit's term counts (least recently used out first): the recall gate scores every
    unit of a compressed message again on each follow-up, and tokenizing them was most of its
    time (~25 ms for a 17K-token output against ~0.2 ms from the counts). Thread-safe.
    """

    name = "bm25"

    def __init__(self, cache_units: int = DEFAULT_CACHED_UNITS) -> None:
        self.cache_units = max(0, cache_units)
        self.units_tokenized = 0
        self._counts: LRUCache[bytes, Counter[str]] | None = LRUCache(self.cache_units) if self.cache_units else None
        self._lock = threading.Lock()

    def score(self, units: Sequence[str], request: str) -> list[float]:
        return bm25_of_counts([self._term_counts(u) for u in units], request)

    def _term_counts(self, unit: str) -> Counter[str]:
        key = hashlib.sha256(unit.encode("utf-8", "surrogatepass")).digest()
        with self._lock:
            hit = self._counts.get(key) if self._counts is not None else None
        if hit is not None:
            return hit
        counts = Counter(tokenize_for_search(unit))  # outside the lock: the slow part
        with self._lock:
            self.units_tokenized += 1
            if self._counts is not None:
                self._counts[key] = counts
        return counts


class GateScores(NamedTuple):
    evidence: list[float]  # what the recall gate's peak share reads
    choice: list[float]  # what orders the hidden units it brings back


class FeatureStore(Protocol):
    """A scorer whose per-unit features can travel with a session (the drafter's)."""

    def export_features(self, units: Sequence[str]) -> dict[str, tuple[bytes, int]]: ...

    def import_features(self, features: Mapping[str, tuple[bytes, int]]) -> int: ...

    def forget_features(self) -> None:
        """Empty the cache (a benchmark's cold start, a restart in tests)."""
        ...
