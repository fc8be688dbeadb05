"""Unit features (the drafter's pooled states, the encoder's vectors) kept in memory by unit text."""

from __future__ import annotations

import hashlib
from collections.abc import Mapping, Sequence

import numpy as np
from cachetools import LRUCache


class FeatureCache:
    """Unit features keyed by sha256 of the unit text, least recently used out first, bounded by
    bytes (vector bytes plus a fixed per-entry overhead). Not thread-safe: the owner holds its lock."""

    ENTRY_OVERHEAD = 200  # key, dict slot, array header: roughly

    def __init__(self, budget_bytes: int) -> None:
        self.budget_bytes = max(0, budget_bytes)
        self._items: LRUCache[bytes, tuple[np.ndarray, int]] = LRUCache(
            max(1, self.budget_bytes), getsizeof=lambda item: item[0].nbytes + self.ENTRY_OVERHEAD)

    @property
    def bytes(self) -> int:
        return int(self._items.currsize)

    def __len__(self) -> int:
        return len(self._items)

    def clear(self) -> None:
        self._items.clear()

    @staticmethod
    def key(text: str) -> bytes:
        return hashlib.sha256(text.encode("utf-8", "surrogatepass")).digest()

    def get(self, key: bytes) -> tuple[np.ndarray, int] | None:
        return self._items.get(key)

    def export(self, units: Sequence[str]) -> dict[str, tuple[bytes, int]]:
        """The cached features of these units (float32 bytes, tokens), keyed by the unit text's
        sha256 in hex: what a session keeps so a follow-up after eviction or a restart reads no
        unit again."""
        out: dict[str, tuple[bytes, int]] = {}
        for unit in units:
            key = self.key(unit)
            hit = self.get(key)
            if hit is not None:
                out[key.hex()] = (np.asarray(hit[0], dtype=np.float32).tobytes(), int(hit[1]))
        return out

    def restore(self, features: Mapping[str, tuple[bytes, int]], dim: int) -> int:
        """Put a session's saved features back (those of the right size and not cached yet);
        returns how many were added."""
        added = 0
        for hex_key, (raw, n_tokens) in features.items():
            key = bytes.fromhex(hex_key)
            vector = np.frombuffer(raw, dtype=np.float32)
            if self.get(key) is None and vector.shape == (dim,):
                self.put(key, vector.copy(), int(n_tokens))
                added += 1
        return added

    def put(self, key: bytes, vector: np.ndarray, n_tokens: int) -> None:
        if vector.nbytes + self.ENTRY_OVERHEAD <= self.budget_bytes:  # a larger one would evict all
            self._items[key] = (vector, n_tokens)
