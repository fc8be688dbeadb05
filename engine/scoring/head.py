"""A learned relevance head on the drafter's activations (issue 9), inference and file format.

Features per (unit, request) come from the single drafter read the compression path already does
(DrafterScorer's cached per-unit mean-pooled hidden state at the tap layer, and the request read
alone), the sentence encoder's reading of the same units (issue 12: its cosine with the request, as
the `embed` scorer computes it, cached per unit), plus cheap text features:

- vector part: with û, q̂ the unit and request vectors centred on the message's unit mean and
  scaled to unit length, the elementwise product û⊙q̂ (its sum is the centred cosine) and |û−q̂|;
- scalar part (SCALARS): raw and centred cosine, BM25 (per token and raw, each over the message's
  max), BM25 rank, a no-match flag, log tokens, relative position, segmentation kind one-hot, and
  the encoder's cosine, its share of the message's best and its rank.

The head is standardize → Linear(F→H) → GELU → Linear(H→1): one logit per unit, turned into
relevance mass with drafter.to_mass (same contract as the other drafter scorers). Numpy only.

File: a GGUF (architecture "pflash-head") with the schema name and version, the feature layout,
the tap layer, the sha256 of the drafter GGUF the head was trained on (loading against any other
drafter file is refused), the encoder's name and width (another width is refused), and the
normalization stats and weights as f32 tensors.
"""

from __future__ import annotations

import hashlib
import json
import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from engine.models.files import SHIPPED_HEAD
from engine.scoring.ranks import ranks01
from policies.lexical import bm25_scores
from policies.segmentation import KINDS, detect_kind

log = logging.getLogger("pflash.head")

SCHEMA = "pflash.relevance-head"
VERSION = 2  # 2: the sentence encoder's features (issue 12)
ARCH = "pflash-head"
SCALARS: tuple[str, ...] = (
    "cos", "cos_centred", "bm25_density", "bm25_raw", "bm25_rank", "bm25_zero", "log_tokens", "position",
    *(f"kind_{k}" for k in KINDS), "embed_cos", "embed_share", "embed_rank",
)
VECTOR_PARTS: tuple[str, ...] = ("prod", "absdiff")
ENCODER_KEY = "embed:"  # prefix of the encoder's unit features in a session's saved features


class HeadError(RuntimeError):
    """A head file is missing, malformed, or was trained on another drafter."""


# --- features (pure numpy) ---------------------------------------------------------------------


def unit_kinds(units: Sequence[str]) -> list[str]:
    """Segmentation's Unit.kind from texts alone: the document kind (detected over all lines,
    number prefixes stripped, exactly as segment() does), or "blank" for whitespace-only units."""
    from policies.rendering import split_lines
    from policies.segmentation import _strip_numbers

    lines = [ln.rstrip("\r\n") for u in units for ln in split_lines(u)]
    doc = detect_kind(_strip_numbers(lines))
    return ["blank" if not u.strip() else doc for u in units]


def feature_names(n_embd: int) -> list[str]:
    return [f"{p}[{i}]" for p in VECTOR_PARTS for i in range(n_embd)] + list(SCALARS)


def head_features(units: np.ndarray, query: np.ndarray, bm25: Sequence[float], n_tokens: Sequence[int],
                  kinds: Sequence[str], embed_cos: Sequence[float]) -> np.ndarray:
    """(n_units, 2·d + len(SCALARS)) float64 features for one message; `embed_cos` is the sentence
    encoder's cosine of each unit with the request (EmbeddingScorer.relevance: -1 for a blank unit)."""
    u = np.asarray(units, dtype=np.float64)
    q = np.asarray(query, dtype=np.float64)
    n, _ = u.shape
    toks = np.asarray(n_tokens, dtype=np.float64)
    has = toks > 0
    # Centre on the message's own units: removes what every unit shares ("this is a traceback").
    mu = u[has].mean(axis=0) if has.any() else np.zeros(u.shape[1])
    uc, qc = u - mu, q - mu
    uh = uc / np.maximum(np.linalg.norm(uc, axis=1, keepdims=True), 1e-9)
    qh = qc / max(float(np.linalg.norm(qc)), 1e-9)
    un = u / np.maximum(np.linalg.norm(u, axis=1, keepdims=True), 1e-9)
    qn = q / max(float(np.linalg.norm(q)), 1e-9)
    prod = uh * qh
    absdiff = np.abs(uh - qh)
    bm = np.asarray(bm25, dtype=np.float64)
    density = np.where(has, bm / np.maximum(toks, 1.0), 0.0)
    sc = np.zeros((n, len(SCALARS)))
    sc[:, 0] = un @ qn
    sc[:, 1] = prod.sum(axis=1)
    sc[:, 2] = density / density.max() if density.max() > 0 else 0.0
    sc[:, 3] = bm / bm.max() if bm.max() > 0 else 0.0
    sc[:, 4] = ranks01(density)  # selection ranks by score per token
    sc[:, 5] = (bm <= 0).astype(np.float64)
    sc[:, 6] = np.log1p(toks)
    sc[:, 7] = np.arange(n) / max(n - 1, 1)
    for k, kind in enumerate(kinds):
        if kind in KINDS:
            sc[k, 8 + KINDS.index(kind)] = 1.0
    ec = np.clip(np.asarray(embed_cos, dtype=np.float64), -1.0, 1.0)
    best = float(ec.max()) if n else 0.0
    sc[:, -3] = ec
    sc[:, -2] = np.clip(ec, 0.0, None) / best if best > 0 else 0.0
    sc[:, -1] = ranks01(ec)
    x = np.concatenate([prod, absdiff, sc], axis=1)
    x[~has, : 2 * u.shape[1]] = 0.0  # a unit with no tokens has no vector
    return x


# --- the model ----------------------------------------------------------------------------------


def gelu(x: np.ndarray) -> np.ndarray:
    return 0.5 * x * (1.0 + np.tanh(0.7978845608028654 * (x + 0.044715 * x**3)))


def gelu_grad(x: np.ndarray) -> np.ndarray:
    c = 0.7978845608028654
    t = np.tanh(c * (x + 0.044715 * x**3))
    return 0.5 * (1.0 + t) + 0.5 * x * (1.0 - t * t) * c * (1.0 + 3 * 0.044715 * x * x)


@dataclass
class RelevanceHead:
    """standardize → Linear(F→H) → GELU → Linear(H→1), plus the metadata the file carries."""

    mean: np.ndarray  # (F,)
    std: np.ndarray  # (F,)
    w1: np.ndarray  # (F, H)
    b1: np.ndarray  # (H,)
    w2: np.ndarray  # (H,)
    b2: float
    tap_layer: int
    n_embd: int
    drafter_sha256: str
    drafter_name: str = ""
    encoder_name: str = ""  # the sentence encoder GGUF it was trained with
    encoder_n_embd: int = 0
    info: dict[str, Any] = field(default_factory=dict)  # training summary (deterministic values only)

    @property
    def n_params(self) -> int:
        return int(self.w1.size + self.b1.size + self.w2.size + 1)

    def logits(self, x: np.ndarray) -> np.ndarray:
        z = (np.asarray(x, dtype=np.float64) - self.mean) / self.std
        return gelu(z @ self.w1 + self.b1) @ self.w2 + self.b2

    def as_float32(self) -> RelevanceHead:
        """The same head with every array rounded to f32, as stored in the file."""
        f = lambda a: np.asarray(a, dtype=np.float32).astype(np.float64)
        return RelevanceHead(f(self.mean), f(self.std), f(self.w1), f(self.b1), f(self.w2),
                             float(np.float32(self.b2)), self.tap_layer, self.n_embd, self.drafter_sha256,
                             self.drafter_name, self.encoder_name, self.encoder_n_embd, dict(self.info))


# --- the file -------------------------------------------------------------------------------------


def save_head(head: RelevanceHead, path: Path | str) -> None:
    """Write the head as GGUF. Same head → byte-identical file (no timestamps, fixed order)."""
    import gguf

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    w = gguf.GGUFWriter(str(path), ARCH)
    w.add_string("pflash.head.schema", SCHEMA)
    w.add_uint32("pflash.head.version", VERSION)
    w.add_uint32("pflash.head.tap_layer", head.tap_layer)
    w.add_uint32("pflash.head.n_embd", head.n_embd)
    w.add_array("pflash.head.vector_parts", list(VECTOR_PARTS))
    w.add_array("pflash.head.scalars", list(SCALARS))
    w.add_string("pflash.head.model", "standardize > linear > gelu > linear")
    w.add_string("pflash.head.drafter_sha256", head.drafter_sha256)
    w.add_string("pflash.head.drafter_name", head.drafter_name)
    w.add_string("pflash.head.encoder_name", head.encoder_name)
    w.add_uint32("pflash.head.encoder_n_embd", head.encoder_n_embd)
    w.add_string("pflash.head.info", json.dumps(head.info, sort_keys=True))
    for name, arr in (("norm.mean", head.mean), ("norm.std", head.std), ("fc1.weight", head.w1),
                      ("fc1.bias", head.b1), ("fc2.weight", head.w2), ("fc2.bias", np.array([head.b2]))):
        w.add_tensor(name, np.ascontiguousarray(arr, dtype=np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def _field(reader: Any, key: str) -> Any:
    f = reader.fields.get(key)
    if f is None:
        raise HeadError(f"not a relevance head: no {key}")
    return f.contents()


def load_head(path: Path | str, drafter_sha256: str | None = None) -> RelevanceHead:
    """Read a head file; with `drafter_sha256`, refuse a head trained on another drafter file."""
    import gguf

    path = Path(path)
    if not path.is_file():
        raise HeadError(f"head file not found: {path}")
    try:
        reader = gguf.GGUFReader(str(path))
    except Exception as exc:
        raise HeadError(f"{path}: not a readable GGUF ({exc})") from exc
    if _field(reader, "pflash.head.schema") != SCHEMA:
        raise HeadError(f"{path}: schema {_field(reader, 'pflash.head.schema')!r}, expected {SCHEMA!r}")
    version = int(_field(reader, "pflash.head.version"))
    if version != VERSION:
        raise HeadError(f"{path}: head version {version}, this gateway reads version {VERSION}")
    if tuple(_field(reader, "pflash.head.scalars")) != SCALARS or \
            tuple(_field(reader, "pflash.head.vector_parts")) != VECTOR_PARTS:
        raise HeadError(f"{path}: feature layout differs from this gateway's")
    trained_on = str(_field(reader, "pflash.head.drafter_sha256"))
    drafter_name = str(_field(reader, "pflash.head.drafter_name"))
    if drafter_sha256 is not None and drafter_sha256 != trained_on:
        raise HeadError(
            f"{path.name} was trained on drafter {drafter_name or '?'} (sha256 {trained_on[:12]}…), "
            f"not on this drafter file (sha256 {drafter_sha256[:12]}…): retrain it with "
            "`python -m benchmarks.train head` for this drafter")
    t = {tensor.name: np.array(tensor.data, dtype=np.float64) for tensor in reader.tensors}
    n_embd = int(_field(reader, "pflash.head.n_embd"))
    f_dim = len(VECTOR_PARTS) * n_embd + len(SCALARS)
    try:
        mean, std = t["norm.mean"].reshape(f_dim), t["norm.std"].reshape(f_dim)
        w1 = t["fc1.weight"].reshape(f_dim, -1)
        b1, w2 = t["fc1.bias"].reshape(-1), t["fc2.weight"].reshape(-1)
        b2 = float(t["fc2.bias"].reshape(-1)[0])
    except (KeyError, ValueError) as exc:
        raise HeadError(f"{path}: malformed tensors ({exc})") from exc
    if not (len(b1) == len(w2) == w1.shape[1]):
        raise HeadError(f"{path}: inconsistent hidden size")
    return RelevanceHead(mean, std, w1, b1, w2, b2, int(_field(reader, "pflash.head.tap_layer")), n_embd,
                         trained_on, drafter_name, str(_field(reader, "pflash.head.encoder_name")),
                         int(_field(reader, "pflash.head.encoder_n_embd")),
                         json.loads(str(_field(reader, "pflash.head.info")) or "{}"))


_sha_cache: dict[tuple[str, int, int], str] = {}


def drafter_sha256(path: Path | str) -> str:
    """sha256 of a drafter file, memoised by (path, size, mtime): start-up hashes it once."""
    from engine.models.files import file_sha256

    p = Path(path).resolve()
    st = p.stat()
    key = (str(p), st.st_size, st.st_mtime_ns)
    if key not in _sha_cache:
        _sha_cache[key] = file_sha256(p)
    return _sha_cache[key]


# --- the scorer -----------------------------------------------------------------------------------


def drafter_features(drafter: Any, units: Sequence[str], request: str) -> tuple[np.ndarray, np.ndarray, list[int]]:
    """(unit vectors, request vector, tokens per unit) from a DrafterScorer, through its feature
    cache: a follow-up over the same units reads only the request. Uses the drafter's private
    read methods under its lock (the same calls `DrafterScorer.relevance` makes)."""
    with drafter._lock:
        feats, n_tokens = drafter._unit_features(units)
        query = drafter._request_feature(request)
    return feats, query, n_tokens


class HeadScorer:
    """The learned head over the drafter's and the sentence encoder's cached unit features; `score`
    returns relevance mass. Both models' unit features travel with a session (FeatureStore), so a
    follow-up after a restart reads only its question."""

    name = "head"

    def __init__(self, head: RelevanceHead, drafter: Any, encoder: Any) -> None:
        if drafter.layer != head.tap_layer:
            raise HeadError(f"the head taps layer {head.tap_layer}, the drafter reads layer {drafter.layer}")
        if drafter._reader.n_embd != head.n_embd:
            raise HeadError(f"the head expects width {head.n_embd}, the drafter has {drafter._reader.n_embd}")
        if encoder.encoder.n_embd != head.encoder_n_embd:
            raise HeadError(f"the head was trained with a {head.encoder_n_embd}-wide sentence encoder "
                            f"({head.encoder_name or '?'}), this one is {encoder.encoder.n_embd} wide")
        self.head = head
        self.drafter = drafter
        self.encoder = encoder

    def score(self, units: Sequence[str], request: str) -> list[float]:
        from engine.scoring.drafter import to_mass

        feats, query, n_tokens = drafter_features(self.drafter, units, request)
        embed_cos, _ = self.encoder.relevance(units, request)
        x = head_features(feats, query, bm25_scores(units, request), n_tokens, unit_kinds(units), embed_cos)
        return to_mass(self.head.logits(x), n_tokens)

    # FeatureStore over both models; the encoder's keys carry a prefix (the same unit has both).
    def export_features(self, units: Sequence[str]) -> dict[str, tuple[bytes, int]]:
        out = self.drafter.export_features(units)
        out.update({ENCODER_KEY + k: v for k, v in self.encoder.export_features(units).items()})
        return out  # type: ignore[no-any-return]

    def import_features(self, features: Mapping[str, tuple[bytes, int]]) -> int:
        encoder = {k[len(ENCODER_KEY):]: v for k, v in features.items() if k.startswith(ENCODER_KEY)}
        drafter = {k: v for k, v in features.items() if not k.startswith(ENCODER_KEY)}
        return int(self.drafter.import_features(drafter)) + int(self.encoder.import_features(encoder))

    def forget_features(self) -> None:
        self.drafter.forget_features()
        self.encoder.forget_features()

    def close(self) -> None:
        self.drafter.close()
        self.encoder.close()


def open_head_scorer(head_path: Path | str | None, drafter_path: Path | str, encoder_path: Path | str, *,
                     n_threads: int | None = None, n_gpu_layers: int = 0) -> HeadScorer:
    """Load and verify a head against the drafter file (sha256), then load the drafter at the
    head's tap layer and the sentence encoder. Raises HeadError (or a model's error) on any mismatch."""
    from engine.scoring.drafter import DrafterScorer
    from engine.scoring.embedder import EmbeddingScorer

    path = Path(head_path) if head_path else SHIPPED_HEAD
    head = load_head(path, drafter_sha256(drafter_path))
    drafter = DrafterScorer(drafter_path, layer=head.tap_layer, n_threads=n_threads, n_gpu_layers=n_gpu_layers)
    try:
        encoder = EmbeddingScorer(encoder_path, n_gpu_layers=n_gpu_layers)
    except Exception:
        drafter.close()
        raise
    try:
        return HeadScorer(head, drafter, encoder)
    except Exception:
        drafter.close()
        encoder.close()
        raise


def data_digest(*parts: bytes | str) -> str:
    h = hashlib.sha256()
    for p in parts:
        h.update(p.encode() if isinstance(p, str) else p)
        h.update(b"\x00")
    return h.hexdigest()


__all__ = [
    "SCALARS",
    "SHIPPED_HEAD",
    "HeadError",
    "HeadScorer",
    "RelevanceHead",
    "drafter_features",
    "drafter_sha256",
    "gelu",
    "head_features",
    "load_head",
    "open_head_scorer",
    "save_head",
    "unit_kinds",
]
