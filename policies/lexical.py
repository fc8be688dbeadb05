"""BM25 relevance of units to a request: the lexical scorer, used when no drafter scores.

Tokens are identifier-aware: `parseHTTPResponse_v2` yields the whole identifier and its parts
(`parsehttpresponse_v2`, `parse`, `http`, `response`, `v2`), so a request naming either form
matches. Words that differ only in an inflection also match: a word with a plural, past-tense or
-ing ending also yields its stem (`FAILED` → `failed`, `fail`; `jobs` → `jobs`, `job`), so "why did
the jobs fail?" finds `FAILED: disk quota exceeded`. Scores are plain Python floats summed in a
fixed order: the same input, the same output.
"""

from __future__ import annotations

import math
import re
from collections import Counter
from collections.abc import Mapping, Sequence

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


_VOWEL = re.compile(r"[aeiouy]")
_DOUBLED = re.compile(r"([b-df-hj-np-tv-z])\1$")


def stem(word: str) -> str:
    """A conservative English suffix strip (lowercase input): -ies → -y, -sses → -ss, plural -s,
    -ed and -ing (a doubled final consonant undone: `stopped` → `stop`). Short words (`jobs` is
    the shortest stemmed, `does` and `this` stay), stems left without a vowel, digits and
    identifiers are kept as they are."""
    if len(word) < 4 or not word.isalpha():
        return word
    if len(word) == 4:
        return word[:-1] if word[-1] == "s" and word[-2] not in "aeiousy" else word
    if word.endswith("ies"):
        return word[:-3] + "y"
    if word.endswith("sses"):
        return word[:-2]
    for suffix in ("ing", "ed"):
        if word.endswith(suffix):
            base = word[: -len(suffix)]
            if len(base) >= 3 and _VOWEL.search(base):
                return base[:-1] if _DOUBLED.search(base) and not base.endswith(("ll", "ss", "zz")) else base
            return word
    if word.endswith("s") and not word.endswith(("ss", "us", "is")):
        return word[:-1]
    return word


def _with_stem(token: str, out: list[str]) -> None:
    out.append(token)
    root = stem(token)
    if root != token and len(root) > 1:
        out.append(root)


def tokenize_for_search(text: str) -> list[str]:
    """Lowercased search tokens in text order; each identifier, then its camel/snake parts; an
    inflected word is followed by its stem.

    Tokens of one character are dropped.
    """
    out: list[str] = []
    for m in _WORD.finditer(text):
        word = m.group().strip("_")
        if not word:
            continue
        whole = word.lower()
        if len(whole) > 1:
            _with_stem(whole, out)
        parts = _parts(word)
        if len(parts) > 1:
            for p in parts:
                if len(p) > 1:
                    _with_stem(p.lower(), out)
    return out


def bm25_scores(unit_texts: Sequence[str], request: str, k1: float = K1, b: float = B) -> list[float]:
    """Okapi BM25 of each unit against the request's distinct terms (non-negative idf)."""
    return bm25_of_counts([Counter(tokenize_for_search(t)) for t in unit_texts], request, k1, b)


def bm25_of_counts(docs: Sequence[Mapping[str, int]], request: str, k1: float = K1, b: float = B) -> list[float]:
    """bm25_scores over units already tokenized (term counts), for a caller that needs the counts too."""
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
