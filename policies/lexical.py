"""BM25 relevance of units to a request: the lexical scorer, used when no drafter scores.

Tokens are identifier-aware: `parseHTTPResponse_v2` yields the whole identifier and its parts
(`parsehttpresponse_v2`, `parse`, `http`, `response`, `v2`), so a request naming either form
matches. Scores are plain Python floats summed in a fixed order: the same input, the same output.
"""

from __future__ import annotations

import math
import re
from collections import Counter
from collections.abc import Sequence

K1 = 1.2
B = 0.75

_WORD = re.compile(r"\w+")
_CAMEL_LOWER_UPPER = re.compile(r"(?<=[a-z0-9])(?=[A-Z])")
_CAMEL_ACRONYM = re.compile(r"(?<=[A-Z])(?=[A-Z][a-z])")


def _parts(identifier: str) -> list[str]:
    parts: list[str] = []
    for piece in identifier.split("_"):
        if not piece:
            continue
        spaced = _CAMEL_ACRONYM.sub(" ", _CAMEL_LOWER_UPPER.sub(" ", piece))
        parts.extend(spaced.split())
    return parts


def tokenize_for_search(text: str) -> list[str]:
    """Lowercased search tokens in text order; each identifier, then its camel/snake parts.

    Tokens of one character are dropped.
    """
    out: list[str] = []
    for m in _WORD.finditer(text):
        word = m.group().strip("_")
        if not word:
            continue
        whole = word.lower()
        if len(whole) > 1:
            out.append(whole)
        parts = _parts(word)
        if len(parts) > 1:
            out.extend(p.lower() for p in parts if len(p) > 1)
    return out


def bm25_scores(unit_texts: Sequence[str], request: str, k1: float = K1, b: float = B) -> list[float]:
    """Okapi BM25 of each unit against the request's distinct terms (non-negative idf)."""
    docs = [Counter(tokenize_for_search(t)) for t in unit_texts]
    n = len(docs)
    if n == 0:
        return []
    lengths = [sum(d.values()) for d in docs]
    avgdl = sum(lengths) / n
    terms = sorted(set(tokenize_for_search(request)))
    if not terms or avgdl == 0:
        return [0.0] * n
    df = {t: sum(1 for d in docs if t in d) for t in terms}
    # Lucene's idf: ln(1 + (N - df + 0.5) / (df + 0.5)) never goes negative.
    idf = {t: math.log(1.0 + (n - df[t] + 0.5) / (df[t] + 0.5)) for t in terms}
    scores: list[float] = []
    for d, dl in zip(docs, lengths):
        norm = k1 * (1.0 - b + b * dl / avgdl)
        s = 0.0
        for t in terms:
            tf = d.get(t, 0)
            if tf:
                s += idf[t] * tf * (k1 + 1.0) / (tf + norm)
        scores.append(s)
    return scores
