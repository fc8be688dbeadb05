"""Find model files: a GGUF path, or an embedded model (PyPI chunk packages, assembled once).

Two roles use a model file: the served model (`--model`, default: the embedded
Qwen2.5-Coder-0.5B-Instruct) and the drafter of the drafter/fusion/head scorers (`--drafter`,
default: the embedded Gemma 3 270M). Either setting takes a path or an embedded model's name.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

from engine.models.parts import (
    GEMMA_3_270M,
    QWEN_CODER_05B,
    QWEN_CODER_15B,
    ChunkedModel,
    ModelFileError,
    assemble,
    stamped_sha256,
)

__all__ = [
    "DEFAULT_DRAFTER",
    "DEFAULT_MODEL",
    "EMBEDDED_MODELS",
    "ModelFileError",
    "SHIPPED_HEAD",
    "SHIPPED_RANKER",
    "embedded_model",
    "file_sha256",
    "model_sha256",
    "resolve_model",
]

# Trained scorer weights, shipped as package data beside this module.
SHIPPED_HEAD = Path(__file__).resolve().parent / "heads" / "gemma3-270m.head.gguf"
SHIPPED_RANKER = Path(__file__).resolve().parent / "rankers" / "ranker.json"

# The names `--model` and `--drafter` accept besides a path.
EMBEDDED_MODELS: dict[str, ChunkedModel] = {
    "qwen2.5-coder-0.5b-instruct": QWEN_CODER_05B,
    "qwen2.5-coder-1.5b-instruct": QWEN_CODER_15B,  # installed only when asked for (Makefile MODEL=)
    "gemma-3-270m": GEMMA_3_270M,
}
DEFAULT_MODEL = "qwen2.5-coder-0.5b-instruct"  # instruction-tuned, with a chat template and tools
DEFAULT_DRAFTER = "gemma-3-270m"  # the smallest: scoring reads its hidden states, not its answers


def embedded_model(spec: str) -> ChunkedModel | None:
    return EMBEDDED_MODELS.get(spec.strip().lower())


def resolve_model(spec: str, models_dir: Path) -> Path:
    """The GGUF file for a setting: an embedded model (assembled into models_dir once) or a path."""
    embedded = embedded_model(spec)
    if embedded is not None:
        return assemble(embedded, models_dir)
    candidate = Path(spec).expanduser()
    if not candidate.is_file():
        names = ", ".join(EMBEDDED_MODELS)
        raise ModelFileError(f"model file not found: {candidate} (give a GGUF path or one of: {names})")
    with candidate.open("rb") as fh:
        if fh.read(4) != b"GGUF":
            raise ModelFileError(f"not a GGUF file: {candidate}")
    return candidate


def file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def model_sha256(path: Path) -> str:
    """The file's sha256: the one stamped at assembly while the file is unchanged, else hashed now."""
    return stamped_sha256(path) or file_sha256(path)
