"""Build the configured engine from settings (the only place that knows both)."""

from __future__ import annotations

import logging

from engine.base import Engine
from engine.model_files import file_sha256, resolve_model
from gateway.config import Settings

log = logging.getLogger("pflash.engine")


def build_engine(settings: Settings) -> Engine:
    from engine.llama_engine import LlamaEngine, LlamaOptions

    model_path = resolve_model(settings.model, settings.store_dir / "models")
    sha = file_sha256(model_path)
    log.info("model %s (sha256 %s)", model_path, sha[:12])
    options = LlamaOptions(
        model_path=model_path,
        model_sha256=sha,
        n_ctx=settings.n_ctx,
        n_threads=settings.n_threads,
        n_batch=settings.n_batch,
        n_ubatch=settings.n_ubatch,
        n_gpu_layers=settings.n_gpu_layers,
        main_gpu=settings.main_gpu,
        flash_attn=settings.flash_attn,
        swa_full=settings.swa_full,
        cache_type_k=settings.cache_type_k,
        cache_type_v=settings.cache_type_v,
        chat_template=settings.chat_template,
        seed=settings.seed,
        queue_size=settings.queue_size,
    )
    return LlamaEngine(options)
