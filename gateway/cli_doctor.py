"""`pflash-gateway doctor`: check what a `serve` with the same settings would need, print one
OK/WARN/FAIL line per check (and what it found), exit 1 if any check fails.

Nothing here loads the full model or touches a session: it is safe to run next to a live server.
"""

from __future__ import annotations

import os
import shutil
import sys
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal, TextIO

from engine.llama_build import AMX_WARNING, amx_crash_risk, cpu_flags, system_info, unsupported_llama_cpp
from gateway.config import Settings
from policies.recall import context_questions_for

Status = Literal["OK", "WARN", "FAIL", "SKIP"]

# Below this the store cannot hold even a few small sessions.
MIN_FREE_BYTES = 256 * 1024 * 1024


@dataclass
class Check:
    name: str
    status: Status
    summary: str
    details: list[str] = field(default_factory=list)


def _mib(n: float) -> str:
    return f"{n / (1024 * 1024):,.0f} MiB"


def check_config(settings: Settings) -> Check:
    """Already validated by load_settings; print the effective values that matter most.
    Keys are counted, never printed."""
    auth = (f"{len(settings.all_keys)} API key(s), {len(settings.admin_keys)} with the admin role"
            if settings.all_keys else "no API keys: loopback only")
    details = [
        f"listen        {settings.host}:{settings.port}  ({auth})",
        f"engine        {settings.engine}" + (f"  upstream {settings.upstream_url}" if settings.engine == "upstream" else ""),
        (f"model         {settings.model}  n_ctx {settings.n_ctx}  "
         f"KV {settings.cache_type_k}/{settings.cache_type_v}  n_gpu_layers {settings.n_gpu_layers}"),
        f"drafter       {settings.drafter}",
        f"store         {settings.store_dir}  RAM budget {settings.ram_budget_mb} MiB  disk budget {settings.disk_budget_mb} MiB",
        f"compression   threshold {settings.threshold} tokens  scorer {settings.scorer}  curve '{settings.budget_curve}'",
        (f"recall        theta {settings.recall_theta}  budget {settings.recall_budget} tokens  "
         f"query: question + {context_questions_for(settings.scorer, settings.recall_context)} earlier"),
        (f"limits        body {settings.max_body_mb} MiB  messages {settings.max_messages}  "
         f"queue {settings.queue_size}  per key {settings.per_key_concurrency}"),
        f"logging       {settings.log_format}, level {settings.log_level}",
    ]
    status: Status = "OK"
    summary = "settings are valid"
    if settings.allow_remote_without_keys and not settings.all_keys:
        status, summary = "WARN", "settings are valid, but remote clients are allowed without API keys"
    return Check("config", status, summary, details)


def check_llama() -> Check:
    try:
        import llama_cpp
    except Exception as exc:  # an ImportError, or a shared library that fails to load
        return Check("llama-cpp-python", "FAIL", f"cannot import llama_cpp: {exc}")
    version = getattr(llama_cpp, "__version__", "?")
    if (problem := unsupported_llama_cpp(str(version))) is not None:
        return Check("llama-cpp-python", "FAIL", problem)
    try:
        gpu = bool(llama_cpp.llama_supports_gpu_offload())
    except Exception:
        gpu = False
    where = "GPU offload available" if gpu else "CPU only (no GPU offload in this build)"
    build = system_info()
    details = [f"build         {build}"] if build else []
    if amx_crash_risk(cpu_flags(), build):
        return Check("llama-cpp-python", "WARN", f"version {version}: {AMX_WARNING}", details)
    return Check("llama-cpp-python", "OK", f"version {version}, {where}", details)


def _gguf_magic(path: Path) -> bool:
    with path.open("rb") as fh:
        return fh.read(4) == b"GGUF"


@contextmanager
def _quiet_stderr() -> Iterator[None]:
    """llama.cpp's loader prints pages of metadata to fd 2, whatever the Python-side settings."""
    sys.stderr.flush()
    saved = os.dup(2)
    devnull = os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(devnull, 2)
        yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)
        os.close(devnull)


@dataclass(frozen=True)
class _VocabInfo:
    n_vocab: int
    metadata: dict[str, str]  # the keys the chat template choice reads


def _vocab_load(path: Path) -> _VocabInfo:
    """Load the model's vocabulary only (no weights, no context): proves llama.cpp parses the file,
    and reads the metadata that picks the chat template."""
    import ctypes

    import llama_cpp

    params = llama_cpp.llama_model_default_params()
    params.vocab_only = True
    with _quiet_stderr():
        model = llama_cpp.llama_model_load_from_file(str(path).encode(), params)
    if not model:
        raise ValueError("llama.cpp cannot load it (vocab-only)")
    try:
        n_vocab = llama_cpp.llama_vocab_n_tokens(llama_cpp.llama_model_get_vocab(model))
        metadata = {}
        for key in ("tokenizer.chat_template", "general.architecture"):
            size = 1 << 16
            while True:
                buf = ctypes.create_string_buffer(size)
                n = llama_cpp.llama_model_meta_val_str(model, key.encode(), buf, size)
                if n < size:
                    break
                size = n + 1
            if n >= 0:
                metadata[key] = buf.value.decode("utf-8", errors="replace")
    finally:
        llama_cpp.llama_model_free(model)
    return _VocabInfo(n_vocab, metadata)


def _template_source(metadata: dict[str, str], override: str | None) -> str:
    from engine.chat_templates import select_template

    template = select_template(metadata, override)
    if override is not None:
        return f"chat template: built-in {template.name} (--chat-template)"
    if template.name == "gguf":
        tools = "renders tools itself" if template.native_tools else "tools injected as text"
        return f"chat template: GGUF metadata (tokenizer.chat_template; {tools}, tool calls read as {template.tool_format})"
    return f"chat template: built-in {template.name} (the GGUF has no usable tokenizer.chat_template)"


def check_model_file(role: str, spec: str, settings: Settings, hasher: Callable[[Path], str] | None = None,
                     problem: Status = "FAIL") -> Check:
    """One model setting (a path or an embedded name): path, size, sha256, vocab-only load, chat template."""
    from engine.models.files import ModelFileError, embedded_model, file_sha256
    from engine.models.parts import part_paths

    sha = hasher or file_sha256
    embedded = embedded_model(spec)
    if embedded is not None:
        path = settings.store_dir / "models" / embedded.file_name
        if not path.is_file():
            try:
                part_paths(embedded)
            except (ModelFileError, OSError) as exc:
                return Check(role, problem, str(exc))
            return Check(role, "OK", f"{embedded.label}: {len(embedded.parts)} parts installed, sizes match; "
                                     f"assembled into {path} on first serve (sha256 checked then)")
        digest = sha(path)
        if digest != embedded.sha256:
            return Check(role, problem, f"{path}: sha256 {digest[:16]}… is not the expected {embedded.sha256} "
                                        "(delete it to re-assemble)")
        verified = f"sha256 verified ({embedded.sha256[:16]}…, {embedded.label})"
    else:
        path = Path(spec).expanduser()
        if not path.is_file():
            return Check(role, problem, f"model file not found: {path}")
        if not _gguf_magic(path):
            return Check(role, problem, f"not a GGUF file (bad magic): {path}")
        verified = f"sha256 {sha(path)[:16]}… (a file of yours: nothing to verify against)"
    details = [verified]
    try:
        info = _vocab_load(path)
    except ImportError:
        details.append("not loaded: llama-cpp-python missing")
    except ValueError as exc:
        return Check(role, problem, f"{path}: {exc}")
    else:
        details += [f"vocab-only load ok, {info.n_vocab} tokens",
                    _template_source(info.metadata, settings.chat_template if role == "model" else None)]
    return Check(role, "OK", f"{path} ({_mib(path.stat().st_size)}, GGUF)", details)


def check_model(settings: Settings, hasher: Callable[[Path], str] | None = None) -> Check:
    if settings.engine == "upstream":
        return Check("model", "SKIP", f"engine is upstream ({settings.upstream_url}); no local model")
    return check_model_file("model", settings.model, settings, hasher)


DRAFTER_SCORERS = ("drafter", "fusion", "head")


def check_drafter(settings: Settings, hasher: Callable[[Path], str] | None = None) -> Check:
    """The drafter serves the drafter/fusion/head scorers; serve falls back to bm25 without it."""
    check = check_model_file("drafter", settings.drafter, settings, hasher, problem="WARN")
    if settings.scorer not in DRAFTER_SCORERS:
        check.details.append(f"not used: the scorer is {settings.scorer}")
    elif check.status != "OK":
        check.summary += " (serve falls back to bm25)"
    return check


def check_store(settings: Settings) -> Check:
    root = settings.store_dir
    try:
        root.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        return Check("store", "FAIL", f"cannot create {root}: {exc.strerror or exc}")
    if not root.is_dir():
        return Check("store", "FAIL", f"{root} is not a directory")
    probe = root / f".doctor-probe-{os.getpid()}-{uuid.uuid4().hex[:8]}"
    try:  # the same steps the store takes: write, fsync, (rename), delete
        with probe.open("wb") as fh:
            fh.write(b"pflash-gateway doctor probe\n" * 64)
            fh.flush()
            os.fsync(fh.fileno())
    except OSError as exc:
        probe.unlink(missing_ok=True)
        return Check("store", "FAIL", f"{root} is not writable: {exc.strerror or exc}")
    finally:
        try:
            probe.unlink(missing_ok=True)
        except OSError:
            pass
    usage = shutil.disk_usage(root)
    sessions = sum(1 for p in (root / "sessions").glob("*/*") if p.is_dir()) if (root / "sessions").is_dir() else 0
    details = [f"free {_mib(usage.free)} of {_mib(usage.total)}; {sessions} stored session(s)"]
    if usage.free < MIN_FREE_BYTES:
        return Check("store", "FAIL", f"{root}: only {_mib(usage.free)} free (need at least {_mib(MIN_FREE_BYTES)})",
                     details)
    if usage.free < settings.disk_budget_mb * 1024 * 1024:
        return Check("store", "WARN", f"{root} is writable, but free space ({_mib(usage.free)}) is below the disk "
                                      f"budget ({settings.disk_budget_mb} MiB)", details)
    return Check("store", "OK", f"{root} is writable (write + fsync + delete)", details)


def run_checks(settings: Settings) -> list[Check]:
    return [check_config(settings), check_llama(), check_model(settings), check_drafter(settings),
            check_store(settings)]


def run_doctor(settings: Settings, out: TextIO | None = None) -> int:
    out = out or sys.stdout
    checks = run_checks(settings)
    for check in checks:
        print(f"{check.status:<4}  {check.name}: {check.summary}", file=out)
        for line in check.details:
            print(f"      {line}", file=out)
    failed = [c.name for c in checks if c.status == "FAIL"]
    print(f"doctor: {len(failed)} check(s) failed: {', '.join(failed)}" if failed else "doctor: all checks passed",
          file=out)
    return 1 if failed else 0
