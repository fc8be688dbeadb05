"""Reciprocal-rank fusion of BM25 with a dense relevance: `fusion` (the drafter's cosine) and
`hybrid` (the sentence encoder's)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from engine.scoring.drafter import RRF_K, fuse, to_mass
from policies.lexical import bm25_scores


class FusionScorer:
    """Reciprocal-rank fusion (k=60) of BM25 (ranked by score per token, as selection uses it)
    and a dense relevance: the drafter's cosine (`fusion`, +5 points over BM25 alone on chats,
    the drafter's notes) or the sentence encoder's (`hybrid`, engine/scoring/embedder.py). `dense` is any object
    with `relevance(units, request) -> (relevance per unit, tokens per unit)`."""

    def __init__(self, dense: Any, k: int = RRF_K, name: str = "fusion") -> None:
        self.dense = dense
        self.k = k
        self.name = name

    def score(self, units: Sequence[str], request: str) -> list[float]:
        cos, n_tokens = self.dense.relevance(units, request)
        lexical = bm25_scores(units, request)
        density = np.array([s / n if n else 0.0 for s, n in zip(lexical, n_tokens)])
        fused = fuse(density, cos, self.k)
        return to_mass(fused, n_tokens)

    def close(self) -> None:
        self.dense.close()
