"""Build the configured engine from settings (the only place that knows both)."""

from __future__ import annotations

import logging
from collections.abc import Callable

from engine.base import Engine
from engine.models.files import model_sha256, resolve_model
from gateway.config import Settings

log = logging.getLogger("pflash.engine")


def build_engine(settings: Settings) -> Engine:
    if settings.engine == "upstream":
        return _build_upstream(settings)
    from engine.llama_engine import LlamaEngine, LlamaOptions
    from engine.prefix_checkpoints import CheckpointOptions

    model_path = resolve_model(settings.model, settings.store_dir / "models")
    sha = model_sha256(model_path)  # an assembled embedded model: the sha256 stamped when it was verified
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
        repeated_line_stop=settings.repeated_line_stop,
        checkpoints=CheckpointOptions(settings.checkpoint_interval, settings.checkpoint_min_tokens),
        persist_idle=settings.persist_idle_states,
    )
    if settings.sequences > 1:
        from engine.batched_engine import BatchedLlamaEngine

        return BatchedLlamaEngine(options, sequences=settings.sequences)
    return LlamaEngine(options)


def local_token_counter(settings: Settings) -> tuple[Callable[[str], int], str]:
    """Line-level token counts without the target in process: tiktoken files the user provides
    (`tiktoken:<encoding>`, read from TIKTOKEN_CACHE_DIR), else a GGUF's vocabulary (by default
    the served model's: --model names the local model closest to the upstream one)."""
    spec = settings.tokenizer
    if spec and spec.startswith("tiktoken:"):
        import tiktoken

        encoding = tiktoken.get_encoding(spec.split(":", 1)[1])
        return (lambda text: len(encoding.encode(text, disallowed_special=()))), spec
    from engine.tokenizer import GgufTokenizer

    path = resolve_model(spec or settings.model, settings.store_dir / "models")
    return GgufTokenizer(path).count_tokens, f"the vocabulary of {path.name}"


def _build_upstream(settings: Settings) -> Engine:
    from engine.upstream import UpstreamEngine, UpstreamOptions

    assert settings.upstream_url is not None  # the settings validator guarantees it
    count, name = local_token_counter(settings)
    options = UpstreamOptions(
        base_url=settings.upstream_url,
        api_key=settings.upstream_api_key,
        model=settings.upstream_model,
        timeout=settings.upstream_timeout,
        retries=settings.upstream_retries,
        n_ctx=settings.upstream_n_ctx,
        multimodal=settings.upstream_multimodal,
        session_header=settings.upstream_session_header or None,
        prompt_cache_key=settings.upstream_prompt_cache_key,
        tool_grammar=settings.upstream_tool_grammar,
    )
    return UpstreamEngine(options, count, name)
