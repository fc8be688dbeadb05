"""Names for token prefixes: a checkpoint is found by the exact token ids it covers.

A key is the sha256 of the prefix's token ids (little-endian int32). The keys of several prefixes
of one prompt come from one incremental pass (a hash chain: each length's digest continues the
previous one's), so looking up every checkpoint length costs one read of the prompt. A key only
finds a candidate: whoever restores compares the token ids themselves.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Sequence

import numpy as np


def token_array(tokens: Sequence[int]) -> np.ndarray:
    return np.asarray(tokens, dtype="<i4")


def prefix_key(tokens: Sequence[int]) -> str:
    return hashlib.sha256(token_array(tokens).tobytes()).hexdigest()


def prefix_keys(tokens: Sequence[int], lengths: Iterable[int]) -> dict[int, str]:
    """The key of `tokens[:n]` for every n in `lengths` that is at most len(tokens)."""
    arr = token_array(tokens)
    chain = hashlib.sha256()
    keys: dict[int, str] = {}
    at = 0
    for n in sorted({n for n in lengths if 0 < n <= len(arr)}):
        chain.update(arr[at:n].tobytes())
        keys[n] = chain.copy().hexdigest()
        at = n
    return keys


def is_prefix(prefix: np.ndarray, tokens: Sequence[int] | np.ndarray) -> bool:
    """Whether `prefix` is exactly the first len(prefix) token ids of `tokens`."""
    n = len(prefix)
    return n <= len(tokens) and bool(np.array_equal(prefix, token_array(tokens[:n])))


def checkpoint_positions(prompt_len: int, reuse: int, marks: Iterable[int], interval: int,
                         min_tokens: int) -> list[int]:
    """Where a prefill starting at `reuse` saves prefix checkpoints: the marks the prompt asked for
    (where its system prompt and tools end), every `interval` tokens of a long cold prompt, and
    the prompt's end (the next turn starts there whatever its answer re-renders to). Only
    positions the prefill itself reaches (past `reuse`), and none shorter than `min_tokens`."""
    wanted = {m for m in marks}
    if interval > 0:
        wanted.update(range(interval, prompt_len, interval))
    wanted.add(prompt_len)
    return sorted(p for p in wanted if reuse < p <= prompt_len and p >= min_tokens)
