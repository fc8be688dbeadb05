"""The embedding scorer: a small sentence encoder (all-MiniLM-L6-v2, converted by `make-embedder`)
run by llama.cpp in embedding mode. Each unit of a long message is embedded once (its first
`max_unit_tokens` word pieces) and cached by the sha256 of its text; the request is embedded alone
(its first `max_query_tokens` word pieces); relevance is the cosine. A follow-up's recall gate
therefore embeds only the new question, and the vectors travel with the session (FeatureStore:
export/import) across eviction and restarts.

Units are scored as text: the encoder has its own vocabulary, unrelated to the served model's or
the drafter's, so no token id is ever shared between them.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

import numpy as np

from engine.scoring.drafter import cosines, to_mass
from engine.scoring.feature_cache import FeatureCache
from engine.scoring.scorers import GateScores, Scorer
from policies.recall import rank_fusion

log = logging.getLogger("pflash.embedder")

DEFAULT_UNIT_TOKENS = 128  # word pieces embedded per unit: its head names what the unit is about
# Word pieces of the request embedded, its head: a long request (the task's text after the
# agent's turn) blurs the query vector while BM25 gains from every word of it. With the request
# finder's 384 tokens, clipping the dense query to 128 word pieces kept 80.6 % of gold on train
# and 83.9 % on validation for `hybrid` at 27 %, against 73.8 / 82.8 % unclipped and 75.3 /
# 79.3 % with the former 128-token request (BENCHMARKS.md has the test split).
DEFAULT_QUERY_TOKENS = 128
# Sequences are packed into one decode up to this many tokens. The batch's sequences share one
# attention (masked per sequence), whose cost grows with the square of the batch: 256 measured
# 2.1× faster than 2048 and 1.5× faster than 512 here. A longer single sequence (a request of up
# to the encoder's 512 positions) still goes alone.
PACK_TOKENS = 256


class EmbedderError(RuntimeError):
    """The encoder produced no usable output; the caller serves the message whole."""


class LlamaEncoder:
    """A BERT-family GGUF in llama.cpp's embedding mode (mean pooling, as the file says).

    Threads per batch: `n_threads` (one by default) while the engine works, every core while it is
    idle (`engine_idle`, set by the gateway). The graph of a 6-layer encoder is many small ops, and
    ggml's threads meet at a barrier after each: with the other core busy two threads measured 20×
    slower than one here (1,614 ms against 73 ms for a 120-token unit), while on idle cores two
    embed 2.1× faster than one (4,256 against 2,056 word pieces/s). Checked before every batch, so
    a turn that starts meanwhile shares the cores with at most one batch (256 word pieces)."""

    def __init__(self, model_path: Path | str, *, n_threads: int | None = 1, n_gpu_layers: int = 0) -> None:
        import llama_cpp

        threads = n_threads or os.cpu_count() or 1
        self.busy_threads = threads
        self.idle_threads = max(threads, os.cpu_count() or 1)
        self.engine_idle: Callable[[], bool] = lambda: False  # no engine known: assume it is busy
        self._threads = threads
        self.model_path = Path(model_path)
        self.llm = llama_cpp.Llama(
            model_path=str(self.model_path), embedding=True, n_ctx=512, n_batch=512, n_ubatch=512, n_threads=threads, n_threads_batch=threads,
            n_gpu_layers=n_gpu_layers, verbose=False,
        )
        self.n_embd = int(self.llm.n_embd())
        self.max_tokens = min(int(llama_cpp.llama_model_n_ctx_train(self.llm.model)), 512)
        self.max_sequences = int(self.llm.context_params.n_seq_max)

    def tokenize(self, text: str) -> list[int]:
        """Word pieces with [CLS] and [SEP], as the encoder reads them."""
        return self.llm.tokenize(text.encode("utf-8"), add_bos=True, special=False)

    def embed_ids(self, sequences: Sequence[Sequence[int]]) -> np.ndarray:
        """Pooled, L2-normalised embeddings, sequences packed into batches of whole sequences."""
        import llama_cpp

        llm = self.llm
        out = np.zeros((len(sequences), self.n_embd), dtype=np.float32)
        batch = llm._batch
        pending: list[int] = []
        used = 0

        def flush() -> None:
            nonlocal used
            if not pending:
                return
            self._use_threads(self.idle_threads if self.engine_idle() else self.busy_threads)
            llm._ctx.kv_cache_clear()
            if llama_cpp.llama_decode(llm._ctx.ctx, batch.batch) != 0:
                raise EmbedderError("llama_decode failed in the embedder")
            for seq, index in enumerate(pending):
                ptr = llama_cpp.llama_get_embeddings_seq(llm._ctx.ctx, seq)
                if not ptr:
                    raise EmbedderError("the embedder returned no pooled embedding (pooling type?)")
                out[index] = np.ctypeslib.as_array(ptr, shape=(self.n_embd,))
            pending.clear()
            batch.reset()
            used = 0

        batch.reset()
        for index, ids in enumerate(sequences):
            ids = list(ids)[: self.max_tokens]
            if not ids:
                continue
            if used + len(ids) > PACK_TOKENS or len(pending) >= self.max_sequences:
                flush()
            batch.add_sequence(ids, len(pending), True)  # embedding mode: every token is an output
            pending.append(index)
            used += len(ids)
        flush()
        if not np.isfinite(out).all():
            raise EmbedderError("non-finite embeddings")
        norms = np.linalg.norm(out, axis=1, keepdims=True)
        return out / np.maximum(norms, 1e-12)

    def _use_threads(self, n: int) -> None:
        if n != self._threads:
            import llama_cpp

            llama_cpp.llama_set_n_threads(self.llm._ctx.ctx, n, n)
            self._threads = n

    def embed(self, texts: Sequence[str]) -> np.ndarray:
        return self.embed_ids([self.tokenize(t) for t in texts])

    def close(self) -> None:
        self.llm.close()


def _clip(ids: Sequence[int], limit: int) -> Sequence[int]:
    """The first `limit` word pieces of an encoded text, its closing [SEP] kept."""
    return list(ids[: limit - 1]) + list(ids[-1:]) if len(ids) > limit else ids


class EmbeddingScorer:
    """Cosine of each unit's embedding with the request's; `score` returns `to_mass` of it.

    Thread-safe: one lock around the encoder and the cache.
    """

    name = "embed"

    def __init__(self, model_path: Path | str, *, max_unit_tokens: int = DEFAULT_UNIT_TOKENS,
                 max_query_tokens: int = DEFAULT_QUERY_TOKENS, cache_budget_bytes: int = 64 << 20,
                 n_threads: int | None = 1, n_gpu_layers: int = 0) -> None:
        self.encoder = LlamaEncoder(model_path, n_threads=n_threads, n_gpu_layers=n_gpu_layers)
        self.model_path = Path(model_path)
        self.max_unit_tokens = max_unit_tokens
        self.max_query_tokens = max_query_tokens
        self._cache = FeatureCache(cache_budget_bytes)
        self._lock = threading.Lock()
        self.units_embedded = 0
        self.units_cached = 0
        self.tokens_read = 0
        self.seconds = 0.0

    def stats(self) -> dict[str, float]:
        return {"units_read": self.units_embedded, "units_cached": self.units_cached, "tokens_read": self.tokens_read,
                "seconds": self.seconds, "cache_bytes": self._cache.bytes, "cache_entries": len(self._cache)}

    # FeatureStore: the vectors a session keeps so a follow-up never embeds its units again.
    def export_features(self, units: Sequence[str]) -> dict[str, tuple[bytes, int]]:
        with self._lock:
            return self._cache.export(units)

    def import_features(self, features: Mapping[str, tuple[bytes, int]]) -> int:
        with self._lock:
            return self._cache.restore(features, self.encoder.n_embd)

    def forget_features(self) -> None:
        """Empty the unit cache: the next scoring embeds every unit again (a benchmark's cold start)."""
        with self._lock:
            self._cache.clear()

    def _embed(self, id_lists: Sequence[Sequence[int]]) -> np.ndarray:
        started = time.perf_counter()
        try:
            return self.encoder.embed_ids(id_lists)
        finally:
            self.seconds += time.perf_counter() - started
            self.tokens_read += sum(len(ids) for ids in id_lists)

    def _unit_vectors(self, units: Sequence[str]) -> tuple[np.ndarray, list[int]]:
        vectors = np.zeros((len(units), self.encoder.n_embd), dtype=np.float32)
        n_tokens = [0] * len(units)
        missing: dict[bytes, list[int]] = {}
        for i, unit in enumerate(units):
            key = FeatureCache.key(unit)
            hit = self._cache.get(key)
            if hit is not None:
                vectors[i], n_tokens[i] = hit
                self.units_cached += 1
            else:
                missing.setdefault(key, []).append(i)  # a repeated unit is embedded once
        if missing:
            first = [idx[0] for idx in missing.values()]
            ids = [self.encoder.tokenize(units[i]) for i in first]
            embedded = self._embed([_clip(seq, self.max_unit_tokens) for seq in ids])
            self.units_embedded += len(first)
            for (key, idx), vec, seq in zip(missing.items(), embedded, ids):
                n = max(len(seq) - 2, 0)  # word pieces without [CLS] and [SEP]
                for i in idx:
                    vectors[i], n_tokens[i] = vec, n
                self._cache.put(key, vec.copy(), n)  # a blank unit too (n = 0: never relevant)
        return vectors, n_tokens

    def has_vectors(self, units: Sequence[str]) -> bool:
        """Every unit's vector is cached: scoring them would embed only the request."""
        with self._lock:
            return all(self._cache.get(FeatureCache.key(unit)) is not None for unit in units)

    def embed_units(self, units: Sequence[str]) -> int:
        """Embed and cache the units not cached yet (no request); returns how many were read. The
        background embedder calls it a few units at a time, so a gate call never waits long."""
        with self._lock:
            before = self.units_embedded
            self._unit_vectors(units)
            return self.units_embedded - before

    def relevance(self, units: Sequence[str], request: str) -> tuple[np.ndarray, list[int]]:
        """(cosine per unit, word pieces per unit); embeds only units missing from the cache."""
        if not request.strip():
            raise EmbedderError("empty request: nothing to rank against")
        with self._lock:
            vectors, n_tokens = self._unit_vectors(units)
            query = self._embed([_clip(self.encoder.tokenize(request), self.max_query_tokens)])[0]
        cos = cosines(vectors, query, centre=False)
        cos[np.asarray(n_tokens) == 0] = -1.0  # blank units are never relevant
        return cos, n_tokens

    def score(self, units: Sequence[str], request: str) -> list[float]:
        cos, n_tokens = self.relevance(units, request)
        return to_mass(cos, n_tokens)

    def close(self) -> None:
        with self._lock:
            self.encoder.close()


class EmbeddingGate:
    """The recall gate's scorer beside a model-free compressor (the ranker). Once every unit of the
    compressed messages has its vector (embedded after the turn, gateway/background_embedding.py),
    the gate's evidence is the sentence encoder's and BM25's ranks fused, and the units brought
    back are chosen by the encoder (policies/recall.py says why); BM25 alone until then. A
    follow-up never waits for units to be embedded: it reads only its question."""

    name = "embed"

    def __init__(self, dense: EmbeddingScorer, lexical: Scorer) -> None:
        self.dense = dense
        self.lexical = lexical
        self.counters: dict[str, int] = {"gate_embedded": 0, "gate_lexical": 0}
        self._lock = threading.Lock()  # gate calls of several sessions run in worker threads

    def gate_scores(self, units: Sequence[str], request: str) -> GateScores:
        """Evidence: the encoder's and BM25's ranks fused; choice: the encoder's (BM25 alone for
        both until every unit has its vector)."""
        embedded = bool(request.strip()) and self.dense.has_vectors(units)
        with self._lock:
            self.counters["gate_embedded" if embedded else "gate_lexical"] += 1
        lexical = self.lexical.score(units, request)
        if not embedded:
            return GateScores(lexical, lexical)
        dense = self.dense.score(units, request)
        return GateScores(rank_fusion([dense, lexical]), dense)

    def score(self, units: Sequence[str], request: str) -> list[float]:
        return self.gate_scores(units, request).choice
