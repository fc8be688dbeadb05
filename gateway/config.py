"""Every setting in one pydantic model: TOML file < environment (PFLASH_*) < command-line flags.

The command line is generated from the same fields (see gateway/cli.py), so no option is defined
twice and each field's description is its --help text.
"""

from __future__ import annotations

import contextvars
import ipaddress
import os
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import Field, ValidationError, field_validator, model_validator
from pydantic_settings import (
    BaseSettings,
    NoDecode,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
    TomlConfigSettingsSource,
)

from engine.models.files import DEFAULT_DRAFTER, DEFAULT_MODEL
from policies.admission import DEFAULT_THRESHOLD
from policies.budget import DEFAULT_CURVE_SPEC, parse_curve
from policies.recall import DEFAULT_RECALL_BUDGET, DEFAULT_THETA
from policies.request_finding import DEFAULT_SCORED_TOKENS
from policies.segmentation import DEFAULT_MAX_SEGMENT, DEFAULT_MIN_SEGMENT, TAIL_SLACK, TIGHT_SHARE

_toml_file: contextvars.ContextVar[Path | None] = contextvars.ContextVar("pflash_toml", default=None)

KvType = Literal["f16", "q8_0", "q4_0"]


def default_store_dir() -> Path:
    # systemd's StateDirectory= hands us the exact directory; otherwise follow XDG.
    if state_dir := os.environ.get("STATE_DIRECTORY"):
        return Path(state_dir.split(":")[0])
    xdg = os.environ.get("XDG_STATE_HOME")
    return (Path(xdg) if xdg else Path.home() / ".local" / "state") / "pflash-gateway"


class Settings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="PFLASH_", extra="forbid", validate_default=True)

    # --- network -------------------------------------------------------------------------------
    host: str = Field("127.0.0.1", description="Address to listen on.")
    port: int = Field(8090, ge=1, le=65535, description="TCP port to listen on.")
    api_keys: Annotated[list[str], NoDecode] = Field(
        default_factory=list, description="Accepted API keys, comma-separated (empty: no auth, loopback only)."
    )
    admin_keys: Annotated[list[str], NoDecode] = Field(
        default_factory=list, description="API keys with the admin role (session admin endpoints), comma-separated."
    )
    allow_remote_without_keys: bool = Field(
        False, description="Allow binding to a non-loopback address without API keys (unsafe)."
    )

    # --- engine --------------------------------------------------------------------------------
    engine: Literal["llama", "upstream"] = Field("llama", description="Engine: in-process llama.cpp or an upstream server.")
    model: str = Field(
        DEFAULT_MODEL, description="Served model: a GGUF path, or an embedded model: qwen2.5-coder-0.5b-instruct "
        "(default; instruction-tuned, answers chat and calls tools) or gemma-3-270m (a fast base model).",
    )
    model_name: str = Field("pflash-local", description="Model id reported by /v1/models.")
    drafter: str = Field(
        DEFAULT_DRAFTER, description="Drafter of the drafter/fusion/head scorers: a GGUF path or an embedded model "
        "(default: the small Gemma 3 270M). Any family works: units are scored as text, token ids never shared.",
    )
    chat_template: Literal["gemma", "chatml", "llama3", "mistral"] | None = Field(
        None, description="Force a built-in chat template instead of the GGUF's own."
    )
    n_ctx: int = Field(32768, ge=256, description="Context size in tokens.")
    n_threads: int | None = Field(None, ge=1, description="CPU threads (default: all cores).")
    n_batch: int = Field(512, ge=8, description="Logical batch size for prefill.")
    sequences: int = Field(
        4, ge=1, le=64, description="Sessions decoded together in one context (continuous batching), each in its "
        "own sequence of n_ctx tokens (KV memory: sequences x n_ctx). 1: the single-sequence engine.",
    )
    n_ubatch: int = Field(512, ge=8, description="Physical micro-batch size for prefill.")
    n_gpu_layers: int = Field(-1, ge=-1, description="Layers offloaded to a GPU (-1 = all; ignored by CPU builds).")
    main_gpu: int = Field(0, ge=0, description="GPU index for the model.")
    flash_attn: bool = Field(False, description="Use flash attention (required for a quantized V cache).")
    swa_full: bool = Field(False, description="Full-size sliding-window cache (slower prefill, larger state).")
    cache_type_k: KvType = Field("f16", description="KV cache type for keys.")
    cache_type_v: KvType = Field("f16", description="KV cache type for values.")
    seed: int = Field(0, description="Sampling seed used when the request gives none.")
    default_max_tokens: int = Field(1024, ge=1, description="Completion limit when a request gives none.")
    repeated_line_stop: int = Field(
        32, ge=0, description="An answer that loops ends there, as a stop: one line repeated this many times in a "
        "row, this many lines in a row echoing one of the 8 before (3/4 of their words shared), or a phrase looping "
        "in one 2,000-character line (a small model's loop would run to max_tokens while every other session "
        "waits); 0: never.",
    )
    max_tokens_limit: int | None = Field(
        None, ge=1, description="Most tokens one answer may have, whatever the request asks (Claude Code asks for "
        "32,000: minutes of a small CPU's time if the model rambles); default: no limit but the context.",
    )

    # --- upstream engine -----------------------------------------------------------------------
    upstream_url: str | None = Field(None, description="Base URL of an OpenAI-compatible server (engine=upstream).")
    upstream_api_key: str | None = Field(None, description="API key sent to the upstream server.")
    upstream_model: str | None = Field(None, description="Model name sent to the upstream server.")
    upstream_timeout: float = Field(600.0, gt=0, description="Upstream request timeout in seconds.")
    upstream_retries: int = Field(2, ge=0, description="Retries on upstream connect errors.")
    upstream_n_ctx: int | None = Field(None, ge=256, description="Upstream context size (default: asked from the upstream).")
    upstream_multimodal: bool = Field(
        False, description="The upstream model reads images: send clients' images on as image_url parts "
        "instead of their text placeholders (tool results keep the placeholder: OpenAI tool messages are text).")
    upstream_session_header: str | None = Field(
        "X-Session-Id", description="Header carrying each session's stable key to the upstream, for a router with "
        "session affinity (vLLM's router --routing-logic session, llm-d); empty: none.",
    )
    upstream_prompt_cache_key: bool = Field(
        False, description="Also send the session key as OpenAI's prompt_cache_key (upstreams that read it).",
    )
    upstream_tool_grammar: bool = Field(
        True, description="Send the gateway's tool-call grammar (offered names, schema-valid arguments) with "
        "tool_choice auto to an upstream that takes one (llama-server, found by its /props).",
    )
    tokenizer: str | None = Field(
        None, description="Token counting without a local target: a GGUF path (vocabulary only) or "
        "'tiktoken:<encoding>' (files from TIKTOKEN_CACHE_DIR); default: the vocabulary of --model.",
    )

    # --- sessions ------------------------------------------------------------------------------
    store_dir: Path = Field(default_factory=default_store_dir, description="Session store directory.")
    ram_budget_mb: int = Field(2048, ge=0, description="Host-RAM tier budget for session KV states, MiB.")
    disk_budget_mb: int = Field(20480, ge=0, description="Disk budget for the session store, MiB.")
    zstd_level: int = Field(1, ge=1, le=19, description="zstd level for stored KV states.")
    record_sync: Literal["always", "batched", "off"] = Field(
        "batched", description="Session records written ahead of each response: 'always' (fsynced first), "
        "'batched' (on disk at once, fsynced within a second) or 'off' (only with a KV state written: a spill, "
        "an idle write, shutdown).",
    )
    checkpoint_ram_mb: int = Field(
        1024, ge=0, description="Host-RAM budget for prefix checkpoints (KV states of prompt prefixes any session "
        "may start from: the system prompt and tools every new session of an agent shares), MiB.",
    )
    checkpoint_disk_mb: int = Field(8192, ge=0, description="Disk budget for prefix checkpoints, MiB (0: RAM only).")
    checkpoint_interval: int = Field(
        8192, ge=0, description="A long cold prompt saves a prefix checkpoint every this many tokens (0: only where "
        "the system prompt and tools end and at each prompt's end).",
    )
    checkpoint_min_tokens: int = Field(1024, ge=1, description="No prefix checkpoint shorter than this (tokens).")
    persist_idle_states: bool = Field(
        True, description="When the engine is idle after a turn, write the session's KV state to disk in the "
        "background, so a kill or power cut costs no full prefill.",
    )
    shutdown_grace_seconds: float = Field(
        3.0, ge=0, description="On SIGTERM, seconds in-flight turns may still run before they are cancelled.",
    )

    # --- compression and recall ----------------------------------------------------------------
    threshold: int = Field(DEFAULT_THRESHOLD, ge=1, description="Tokens in one new message before it is compressed.")
    budget_curve: str = Field(
        DEFAULT_CURVE_SPEC,
        description="Kept fraction by message tokens, piecewise linear: 'TOKENS:FRACTION ...'.",
    )
    min_segment: int = Field(DEFAULT_MIN_SEGMENT, ge=1, description="Units smaller than this (tokens) merge forward.")
    max_segment: int = Field(DEFAULT_MAX_SEGMENT, ge=2, description="Units larger than this (tokens) split at line boundaries; "
                             f"a remainder up to {TAIL_SLACK:g}× this stays whole; half of it for code, grep "
                             f"and logs where the budget keeps under {TIGHT_SHARE:g} of a message.")
    request_tokens: int = Field(DEFAULT_SCORED_TOKENS, ge=8, description="Request tokens the scorer ranks against.")
    fallback_spread: float = Field(0.11, ge=0, le=1, description="Relevance spread below which a message is served whole.")
    scorer: Literal["ranker", "bm25", "embed", "hybrid", "drafter", "fusion", "head"] = Field(
        "ranker", description="Relevance scorer for compression: ranker (learned over lexical evidence and the "
        "sentence encoder's reading; lexical alone, no model, without it), "
        "bm25 (lexical, no model), embed (sentence encoder), hybrid (bm25 + encoder fusion), drafter, fusion "
        "(bm25 + drafter), head (learned head on the drafter).",
    )
    ranker: str | None = Field(
        None, description="Ranker weights (JSON) for --scorer ranker (default: the weights shipped with the package; "
        "see `python -m benchmarks.train ranker`).",
    )
    embedder: str | None = Field(
        None, description="Sentence-encoder GGUF for --scorer embed/hybrid/head and the ranker's meaning features and "
        "recall gate (default: the packaged all-MiniLM-L6-v2, converted once into the model cache; see "
        "`pflash-gateway make-embedder`).",
    )
    head: str | None = Field(
        None, description="Relevance head GGUF for --scorer head (default: the head shipped for the embedded drafter "
        "and the packaged sentence encoder).",
    )
    ranker_embedder: bool = Field(
        True, description="With --scorer ranker, compression also ranks by meaning: the sentence encoder (--embedder) "
        "reads the lexically best half of a long message (all of it when no word of the request matches; ~2.4 s for "
        "30K tokens on two cores) and the ranker's weights with meaning features rank it. Off, or when the encoder "
        "cannot load or fails, the ranker uses its lexical weights.",
    )
    recall_embedder: bool = Field(
        True, description="With --scorer ranker, the recall gate scores with the sentence encoder (--embedder): a "
        "compressed message's units are embedded by compression (ranker_embedder) or else in the background after "
        "its turn, while the engine is idle, and kept with the session; until then, or when this is off or the "
        "encoder cannot load, the gate uses BM25.",
    )
    recall_theta: float = Field(
        DEFAULT_THETA, ge=0, le=1, description="Recall fires when the best omitted unit's share of the two peaks "
        "(best omitted vs best visible relevance; with the sentence encoder, of its and BM25's fused ranks) reaches "
        "this; chosen on the train and validation splits. 1.0 turns recall off.",
    )
    recall_budget: int = Field(DEFAULT_RECALL_BUDGET, ge=0, description="Tokens of recalled excerpts per follow-up.")
    recall_context: int | None = Field(
        None, ge=0, description="Earlier user questions the recall gate's query carries after the new one. "
        "Default: 1 for hybrid, 0 for the other scorers; chosen on the validation split.",
    )

    # --- limits --------------------------------------------------------------------------------
    queue_size: int = Field(16, ge=1, description="Requests waiting for the engine before 503.")
    per_key_concurrency: int = Field(8, ge=1, description="Concurrent requests per API key before 429.")
    max_body_mb: float = Field(32.0, gt=0, description="Largest request body, MiB (413 above).")
    max_messages: int = Field(4096, ge=1, description="Most messages in one request.")
    keepalive_seconds: float = Field(5.0, gt=0, description="Seconds between SSE keep-alives during prefill, and while a turn waits for its conversation or its compression.")

    # --- logging -------------------------------------------------------------------------------
    log_format: Literal["text", "json"] = Field("text", description="Log line format.")
    log_level: Literal["debug", "info", "warning", "error"] = Field("info", description="Log level.")

    @field_validator("api_keys", "admin_keys", mode="before")
    @classmethod
    def _split_keys(cls, value: Any) -> Any:
        if isinstance(value, str):
            return [k.strip() for k in value.split(",") if k.strip()]
        return value

    @field_validator("budget_curve")
    @classmethod
    def _valid_curve(cls, value: str) -> str:
        parse_curve(value)
        return value

    @model_validator(mode="after")
    def _consistent(self) -> Settings:
        if self.min_segment >= self.max_segment:
            raise ValueError("min_segment must be smaller than max_segment")
        if self.sequences > self.n_batch:  # each step carries one token per answering sequence
            raise ValueError(f"sequences ({self.sequences}) must not exceed n_batch ({self.n_batch})")
        if self.cache_type_v != "f16" and not self.flash_attn:
            raise ValueError("a quantized V cache (cache_type_v) needs flash_attn = true")
        if self.engine == "upstream" and not self.upstream_url:
            raise ValueError("engine = 'upstream' needs upstream_url")
        if not self.api_keys and not self.allow_remote_without_keys and not is_loopback(self.host):
            raise ValueError(
                f"refusing to listen on {self.host} without API keys: set --api-keys (PFLASH_API_KEYS), "
                "or --allow-remote-without-keys to accept anyone who can reach the port"
            )
        return self

    @property
    def all_keys(self) -> list[str]:
        return list(dict.fromkeys([*self.api_keys, *self.admin_keys]))

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        sources: list[PydanticBaseSettingsSource] = [init_settings, env_settings]
        toml_path = _toml_file.get()
        if toml_path is not None:
            sources.append(TomlConfigSettingsSource(settings_cls, toml_file=toml_path))
        return tuple(sources)


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


class SettingsError(Exception):
    """A setting is invalid; the message is one line fit for the terminal."""


def load_settings(overrides: dict[str, Any] | None = None, config_file: Path | None = None) -> Settings:
    """Build Settings from defaults < TOML file < environment < overrides (the command line)."""
    if config_file is not None and not config_file.is_file():
        raise SettingsError(f"config file not found: {config_file}")
    token = _toml_file.set(config_file)
    try:
        return Settings(**(overrides or {}))
    except ValidationError as exc:
        first = exc.errors()[0]
        message = str(first["msg"]).removeprefix("Value error, ")  # pydantic's prefix says nothing to a user
        where = ".".join(str(p) for p in first.get("loc", ()))
        raise SettingsError(f"invalid setting {where}: {message}" if where else message) from None
    except Exception as exc:  # a malformed TOML file, for instance
        raise SettingsError(f"invalid configuration: {exc}") from None
    finally:
        _toml_file.reset(token)
