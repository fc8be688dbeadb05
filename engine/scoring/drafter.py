"""The drafter: a small GGUF model read only up to one layer, to rank the units of a long message.

How it reads: a `cb_eval` callback on the drafter's
own llama.cpp context copies the residual stream after block L (`l_out-L`) and then returns false,
which ends the graph there, so the blocks above L cost nothing. The deeper KV is then empty, so this
context is never used to generate.

Units are tokenized one by one (`add_bos=False`, no special tokens) and packed into windows of at
most `window` tokens, each read from position 0 after a BOS. Each unit's feature is the mean of its
tokens' hidden states; the request is read alone through the same tap. Cost is linear in the
message (windows are independent, each bounded), and unit features are kept in a byte-bounded LRU
keyed by the sha256 of the unit text, so a follow-up that re-scores the same units (the recall
gate) reads only its new question.
"""

from __future__ import annotations

import ctypes
import logging
import math
import os
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from engine.scoring.feature_cache import FeatureCache
from engine.scoring.ranks import ranks

log = logging.getLogger("pflash.drafter")

GGML_TYPE_F32 = 0
RRF_K = 60


class DrafterError(RuntimeError):
    """The drafter produced no usable output; the caller serves the message whole."""


# --- ggml access (llama-cpp-python binds no tensor functions) -----------------------------------


class _TensorHead(ctypes.Structure):
    # The leading fields of `struct ggml_tensor` (ggml.h): stable across ggml releases for years.
    _fields_ = [
        ("type", ctypes.c_int),
        ("buffer", ctypes.c_void_p),
        ("ne", ctypes.c_int64 * 4),
        ("nb", ctypes.c_size_t * 4),
    ]


_ggml_lib: Any = None


def _ggml() -> Any:
    global _ggml_lib
    if _ggml_lib is None:
        import llama_cpp

        lib_dir = Path(llama_cpp.__file__).resolve().parent / "lib"
        candidates = sorted(lib_dir.glob("libggml-base.*")) + sorted(lib_dir.glob("ggml-base.*"))
        if not candidates:
            raise DrafterError(f"libggml-base not found in {lib_dir}")
        lib = ctypes.CDLL(str(candidates[0]))
        lib.ggml_get_name.restype = ctypes.c_char_p
        lib.ggml_get_name.argtypes = [ctypes.c_void_p]
        lib.ggml_nbytes.restype = ctypes.c_size_t
        lib.ggml_nbytes.argtypes = [ctypes.c_void_p]
        lib.ggml_is_contiguous.restype = ctypes.c_bool
        lib.ggml_is_contiguous.argtypes = [ctypes.c_void_p]
        lib.ggml_backend_tensor_get.restype = None
        lib.ggml_backend_tensor_get.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_size_t]
        _ggml_lib = lib
    return _ggml_lib


def _copy_tensor(lib: Any, t: int) -> np.ndarray:
    """A contiguous f32 tensor as an array shaped (ne3, ne2, ne1, ne0) with size-1 dims dropped at
    the front, so `l_out` is (n_tokens, n_embd) and a post-RoPE `Qcur` (n_tokens, n_head, head_dim)."""
    head = _TensorHead.from_address(t)
    if head.type != GGML_TYPE_F32 or not lib.ggml_is_contiguous(t):
        raise DrafterError(f"tensor {lib.ggml_get_name(t)!r} is not contiguous f32 (type {head.type})")
    ne = [int(head.ne[i]) for i in range(4)]
    out = np.empty((ne[3], ne[2], ne[1], ne[0]), dtype=np.float32)
    if out.nbytes != lib.ggml_nbytes(t):
        raise DrafterError(f"tensor {lib.ggml_get_name(t)!r}: size mismatch")
    lib.ggml_backend_tensor_get(t, out.ctypes.data, 0, out.nbytes)
    while out.ndim > 2 and out.shape[0] == 1:
        out = out[0]
    return out


# --- the reader: one llama.cpp context with an eval callback ----------------------------------


class ActivationReader:
    """Runs token windows through a GGUF model up to a stop tensor and returns tapped tensors.

    `taps` maps a tensor name (e.g. "l_out-8", "Qcur-5") to the occurrence to copy within one
    micro-batch graph (1 = first; post-RoPE Q/K are the third). Not thread-safe:
    the owner holds a lock.
    """

    def __init__(
        self, model_path: Path | str, window: int = 2048, n_threads: int | None = None,
        n_ubatch: int = 512, n_gpu_layers: int = 0,
    ) -> None:
        import llama_cpp
        from llama_cpp import _internals

        self._lib = llama_cpp
        threads = n_threads or os.cpu_count() or 1
        self.window = window
        self.llm = llama_cpp.Llama(
            model_path=str(model_path), n_ctx=window, n_batch=window, n_ubatch=min(n_ubatch, window),
            n_threads=threads, n_threads_batch=threads, n_gpu_layers=n_gpu_layers,
            swa_full=False, verbose=False,
        )
        self.n_layer = int(llama_cpp.llama_model_n_layer(self.llm.model))
        self.n_embd = int(self.llm.n_embd())
        self.bos = int(self.llm.token_bos())
        self._ggml = _ggml()
        # Per-read state, set by read() and consumed by the callback.
        self._want: dict[str, int] = {}
        self._stop = ""
        self._seen: dict[str, int] = {}
        self._got: dict[str, list[np.ndarray]] = {}
        self._error: BaseException | None = None
        # The ctypes callback object must outlive the context: keep it on self.
        self._callback = llama_cpp.ggml_backend_sched_eval_callback(self._on_tensor)
        self.llm.context_params.cb_eval = self._callback
        self.llm.context_params.cb_eval_user_data = None
        self.llm._ctx.close()
        self.llm._ctx = _internals.LlamaContext(model=self.llm._model, params=self.llm.context_params, verbose=False)
        self._batch = llama_cpp.llama_batch_init(window, 0, 1)

    def tokenize(self, text: str) -> list[int]:
        return self.llm.tokenize(text.encode("utf-8"), add_bos=False, special=False)

    def _on_tensor(self, t: int, ask: bool, _user: Any) -> bool:
        try:
            name = self._ggml.ggml_get_name(t).decode("utf-8", "replace")
            if ask:
                if name == "attn_norm-0":  # a new micro-batch graph: occurrence counts restart
                    self._seen = {}
                count = self._seen.get(name, 0) + 1
                self._seen[name] = count
                return self._want.get(name) == count or (name == self._stop and name not in self._want)
            if self._want.get(name) == self._seen.get(name):
                self._got.setdefault(name, []).append(_copy_tensor(self._ggml, t))
            # False ends the graph: nothing above the stop tensor is computed.
            return name != self._stop
        except BaseException as exc:  # noqa: BLE001 - never raise through C; re-raised after decode
            self._error = exc
            return False

    def read(self, tokens: Sequence[int], taps: Mapping[str, int], stop: str) -> dict[str, np.ndarray]:
        """Evaluate BOS + tokens from position 0 and return each tap concatenated over micro-batches
        (token axis first). Positions past the window are an error."""
        n = len(tokens) + 1
        if n > self.window:
            raise ValueError(f"{n} tokens exceed the drafter window {self.window}")
        lib = self._lib
        lib.llama_memory_clear(lib.llama_get_memory(self.llm._ctx.ctx), True)
        batch = self._batch
        batch.n_tokens = n
        for i, tok in enumerate([self.bos, *tokens]):
            batch.token[i] = tok
            batch.pos[i] = i
            batch.n_seq_id[i] = 1
            batch.seq_id[i][0] = 0
            batch.logits[i] = 0  # no logits: the graph stops long before the output layer
        self._want, self._stop, self._seen, self._got, self._error = dict(taps), stop, {}, {}, None
        rc = lib.llama_decode(self.llm._ctx.ctx, batch)
        if self._error is not None:
            raise DrafterError(f"eval callback failed: {self._error}") from self._error
        if rc != 0:
            raise DrafterError(f"llama_decode returned {rc}")
        out: dict[str, np.ndarray] = {}
        for name in taps:
            parts = self._got.get(name)
            if not parts:
                raise DrafterError(f"tensor {name} was never computed (model has {self.n_layer} blocks)")
            out[name] = np.concatenate(parts, axis=0)
            if out[name].shape[0] != n:
                raise DrafterError(f"tensor {name}: {out[name].shape[0]} rows for {n} tokens")
        return out

    def close(self) -> None:
        if self._batch is not None:
            self._lib.llama_batch_free(self._batch)
            self._batch = None
        self.llm.close()


# --- per-unit features ---------------------------------------------------------------------------


def pack_windows(lengths: Sequence[int], capacity: int) -> list[list[int]]:
    """Consecutive unit indices grouped greedily into windows of at most `capacity` tokens."""
    windows: list[list[int]] = []
    size = 0
    for i, n in enumerate(lengths):
        if windows and size + n <= capacity:
            windows[-1].append(i)
            size += n
        else:
            windows.append([i])
            size = n
    return windows


def read_pooled(reader: ActivationReader, unit_ids: Sequence[Sequence[int]], layers: Sequence[int]) -> dict[int, np.ndarray]:
    """Mean hidden state after each of `layers` for every unit, units packed into windows.

    A unit longer than a window is pooled over its first window's worth of tokens. Zero-token
    units get a zero vector. Raises DrafterError on NaN/inf output.
    """
    capacity = reader.window - 1  # one position for BOS
    ids = [list(u[:capacity]) for u in unit_ids]
    top = max(layers)
    taps = {f"l_out-{L}": 1 for L in layers}
    pooled = {L: np.zeros((len(ids), reader.n_embd), dtype=np.float32) for L in layers}
    for group in pack_windows([len(u) for u in ids], capacity):
        tokens = [t for u in group for t in ids[u]]
        if not tokens:
            continue
        out = reader.read(tokens, taps, f"l_out-{top}")
        pos = 1  # after BOS
        for u in group:
            n = len(ids[u])
            if n:
                for L in layers:
                    pooled[L][u] = out[f"l_out-{L}"][pos : pos + n].mean(axis=0)
            pos += n
    read = np.array([len(u) > 0 for u in ids])
    for L in layers:
        if not np.isfinite(pooled[L]).all():
            raise DrafterError(f"non-finite hidden states at layer {L}")
        if read.any() and not np.abs(pooled[L][read]).sum(axis=1).all():
            raise DrafterError(f"all-zero hidden states at layer {L}: the tap returned nothing")
    return pooled


# --- turning features into scores ------------------------------------------------------------------


def cosines(units: np.ndarray, query: np.ndarray, centre: bool) -> np.ndarray:
    """Cosine of each unit vector with the query; `centre` subtracts the units' mean from both
    first (removes the direction every unit shares, e.g. "this is a Python traceback")."""
    u = units.astype(np.float64)
    q = query.astype(np.float64)
    if centre and len(u) > 1:
        mu = u.mean(axis=0)
        u, q = u - mu, q - mu
    un = np.linalg.norm(u, axis=1)
    qn = float(np.linalg.norm(q))
    if qn == 0.0 or not math.isfinite(qn):
        raise DrafterError("the request has no usable hidden state")
    out = (u @ q) / (np.maximum(un, 1e-12) * qn)
    out[un == 0.0] = -1.0  # a unit with no tokens is never relevant
    return out


def fuse(lexical: np.ndarray, drafter: np.ndarray, k: int = RRF_K) -> np.ndarray:
    """Reciprocal-rank fusion, sum of 1/(k + rank), of a lexical and a drafter ranking.

    Units the lexical ranking did not match at all (score 0) get nothing from it, as a document
    missing from one system's result list does in RRF; otherwise a tie of zeros would share the
    rank just below the last match and outvote real matches through the drafter's term.
    """
    lex = np.asarray(lexical, dtype=np.float64)
    from_lexical = np.where(lex > 0, 1.0 / (k + ranks(lex)), 0.0)
    return from_lexical + 1.0 / (k + ranks(drafter))


def to_mass(relevance: np.ndarray, tokens: Sequence[int]) -> list[float]:
    """Non-negative per-unit scores from a relevance with no natural zero (a cosine, an RRF sum).

    The gateway reads scores as relevance mass: selection ranks by mass per token, the flatness
    gate and the recall gate look at how the mass is shared. So units at or below the message's
    median relevance get no mass, and those above get (r - median) / (max - median) per token:
    the same order as `relevance`, mass only where the scorer prefers a unit. (Min-max over all
    units left most of the mass on middling units: on real tool outputs the flatness gate then
    served 17 of 44 messages whole for the drafter, 11 for fusion.) Zero-token units score 0.
    """
    r = np.asarray(relevance, dtype=np.float64)
    if len(r) != len(tokens):
        raise DrafterError(f"{len(r)} relevance values for {len(tokens)} units")
    if len(r) == 0:
        return []
    if not np.isfinite(r).all():
        raise DrafterError("non-finite relevance")
    mid, hi = float(np.median(r)), float(r.max())
    if hi <= mid:
        return [0.0] * len(r)  # no unit stands out: the gateway serves the message whole
    density = np.clip((r - mid) / (hi - mid), 0.0, 1.0)
    return [float(d) * n for d, n in zip(density, tokens)]


# --- the scorers ------------------------------------------------------------------------------------------


@dataclass
class DrafterCounters:
    units_read: int = 0
    units_cached: int = 0
    tokens_read: int = 0  # tokens evaluated, BOS included, units and requests
    requests_read: int = 0
    seconds: float = 0.0  # time spent evaluating the model


class DrafterScorer:
    """Per-unit mean-pooled hidden state after block `layer`, cosine against the request read alone.

    `score` returns `to_mass` of the cosines. Thread-safe: one lock around the model and the cache.
    """

    name = "drafter"

    def __init__(
        self, model_path: Path | str, *, layer: int = 8, centre: bool = False, window: int = 2048,
        cache_budget_bytes: int = 32 << 20, n_threads: int | None = None, n_gpu_layers: int = 0,
    ) -> None:
        self.model_path = Path(model_path)
        self._reader = ActivationReader(self.model_path, window=window, n_threads=n_threads, n_gpu_layers=n_gpu_layers)
        if self._reader.n_layer < 2:
            self._reader.close()
            raise DrafterError(f"{self.model_path.name}: a drafter needs at least 2 blocks")
        # The last block only keeps rows for requested outputs (none here), so tap below it: a
        # truncated N-block drafter reads block N-2.
        self.layer = min(layer, self._reader.n_layer - 2)
        if self.layer != layer:
            log.info("drafter %s has %d blocks: reading block %d instead of %d", self.model_path.name,
                     self._reader.n_layer, self.layer, layer)
        self.centre = centre
        self.window = window
        self._cache = FeatureCache(cache_budget_bytes)
        self._lock = threading.Lock()
        self.counters = DrafterCounters()

    @property
    def cache_bytes(self) -> int:
        return self._cache.bytes

    def stats(self) -> dict[str, float]:
        c = self.counters
        return {"units_read": c.units_read, "units_cached": c.units_cached, "tokens_read": c.tokens_read,
                "requests_read": c.requests_read, "seconds": c.seconds, "cache_bytes": self._cache.bytes,
                "cache_entries": len(self._cache)}

    # FeatureStore: the features a session keeps (see FeatureCache.export / restore).
    def export_features(self, units: Sequence[str]) -> dict[str, tuple[bytes, int]]:
        with self._lock:
            return self._cache.export(units)

    def import_features(self, features: Mapping[str, tuple[bytes, int]]) -> int:
        with self._lock:
            return self._cache.restore(features, self._reader.n_embd)

    def forget_features(self) -> None:
        """Empty the unit cache: the next scoring reads every unit again (a benchmark's cold start)."""
        with self._lock:
            self._cache.clear()

    def tokenize(self, text: str) -> list[int]:
        return self._reader.tokenize(text)

    def relevance(self, units: Sequence[str], request: str) -> tuple[np.ndarray, list[int]]:
        """(cosine per unit, tokens per unit); reads only units missing from the cache."""
        with self._lock:
            feats, n_tokens = self._unit_features(units)
            query = self._request_feature(request)
        return cosines(feats, query, self.centre), n_tokens

    def score(self, units: Sequence[str], request: str) -> list[float]:
        cos, n_tokens = self.relevance(units, request)
        return to_mass(cos, n_tokens)

    def _read(self, unit_ids: Sequence[Sequence[int]]) -> np.ndarray:
        started = time.perf_counter()
        try:
            pooled = read_pooled(self._reader, unit_ids, [self.layer])[self.layer]
        finally:
            self.counters.seconds += time.perf_counter() - started
        windows = pack_windows([min(len(u), self.window - 1) for u in unit_ids], self.window - 1)
        self.counters.tokens_read += sum(min(len(u), self.window - 1) for u in unit_ids) + len(windows)
        return pooled

    def _unit_features(self, units: Sequence[str]) -> tuple[np.ndarray, list[int]]:
        feats = np.zeros((len(units), self._reader.n_embd), dtype=np.float32)
        n_tokens = [0] * len(units)
        keys = [FeatureCache.key(u) for u in units]
        missing: dict[bytes, list[int]] = {}
        for i, key in enumerate(keys):
            hit = self._cache.get(key)
            if hit is not None:
                feats[i], n_tokens[i] = hit
                self.counters.units_cached += 1
            else:
                missing.setdefault(key, []).append(i)  # a repeated unit is read once
        if missing:
            first = [idx[0] for idx in missing.values()]
            ids = [self._reader.tokenize(units[i]) for i in first]
            pooled = self._read(ids)
            self.counters.units_read += len(first)
            for (key, idx), vec, toks in zip(missing.items(), pooled, ids):
                for i in idx:
                    feats[i], n_tokens[i] = vec, len(toks)
                if toks:
                    self._cache.put(key, vec.copy(), len(toks))
        return feats, n_tokens

    def _request_feature(self, request: str) -> np.ndarray:
        ids = self._reader.tokenize(request)[: self.window - 1]
        if not ids:
            raise DrafterError("empty request: nothing to rank against")
        pooled = self._read([ids])
        self.counters.requests_read += 1
        return pooled[0]

    def close(self) -> None:
        with self._lock:
            self._reader.close()
