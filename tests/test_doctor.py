"""`pflash-gateway doctor` as a user runs it: a subprocess, its lines and its exit status.
Models: Gemma 3 270M (`model_path`) and, where both embedded models are reported,
Qwen2.5-Coder-0.5B-Instruct (`instruct_model_path`); doctor loads vocabularies only."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import ROOT


def doctor(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "gateway.cli", "doctor", *args], cwd=ROOT, check=False,
                          capture_output=True, text=True, timeout=120, env={**os.environ, **(env or {})})


def section(output: str, check: str) -> str:
    """A check's line and its indented detail lines."""
    lines = output.splitlines()
    start = next(i for i, line in enumerate(lines) if line.split(":")[0].split()[-1:] == [check])
    end = next((i for i in range(start + 1, len(lines)) if not lines[i].startswith(" ")), len(lines))
    return "\n".join(lines[start:end])


def status_of(output: str, check: str) -> str:
    lines = [line for line in output.splitlines() if line.split(":")[0].split()[-1:] == [check]]
    assert len(lines) == 1, output
    return lines[0].split()[0]


def test_healthy_setup_reports_both_models(tmp_path: Path, model_path: Path, instruct_model_path: Path) -> None:
    """Both embedded models already assembled into <store>/models: each is re-hashed in full and
    reported with its path, size, verified sha256 and chat template source.
    Models: Qwen2.5-Coder-0.5B-Instruct (served) and Gemma 3 270M (drafter), vocabulary only."""
    from engine.models.parts import GEMMA_3_270M, QWEN_CODER_05B

    store = tmp_path / "store"
    (store / "models").mkdir(parents=True)
    for path in (model_path, instruct_model_path):
        (store / "models" / path.name).symlink_to(path)
    result = doctor("--store-dir", str(store), "--scorer", "fusion",
                    env={"PFLASH_API_KEYS": "secret-key-1,secret-key-2"})
    assert result.returncode == 0, result.stdout + result.stderr
    out = result.stdout
    for check in ("config", "llama-cpp-python", "model", "drafter", "store"):
        assert status_of(out, check) == "OK"
    model, drafter = section(out, "model"), section(out, "drafter")
    assert f"{store / 'models' / QWEN_CODER_05B.file_name} (469 MiB, GGUF)" in model
    assert f"sha256 verified ({QWEN_CODER_05B.sha256[:16]}…, {QWEN_CODER_05B.label})" in model
    assert "chat template: GGUF metadata (tokenizer.chat_template; renders tools itself, tool calls read as hermes)" in model
    assert f"{store / 'models' / GEMMA_3_270M.file_name} (241 MiB, GGUF)" in drafter
    assert f"sha256 verified ({GEMMA_3_270M.sha256[:16]}…, {GEMMA_3_270M.label})" in drafter
    assert "chat template: " in drafter
    assert "GPU offload available" in out or "CPU only" in out
    # The project's build of llama.cpp has no AMX kernels (they crash on this kind of CPU).
    assert "build         CPU :" in section(out, "llama-cpp-python")
    assert "AMX_INT8 = 1" not in section(out, "llama-cpp-python")
    assert "2 API key(s)" in out and "secret-key" not in out  # counted, never printed
    assert f"{store}" in out and "free" in out and "n_ctx 32768" in out
    assert out.rstrip().endswith("doctor: all checks passed")
    assert not [p for p in store.iterdir() if p.name.startswith(".doctor-probe")]  # the probe is gone


def test_embedded_models_not_yet_assembled(tmp_path: Path) -> None:
    """A fresh install: the parts are checked (present, right sizes); nothing is assembled by doctor."""
    result = doctor("--store-dir", str(tmp_path / "store"))
    assert result.returncode == 0, result.stdout + result.stderr
    assert "Qwen2.5-Coder-0.5B-Instruct Q4_K_M: 6 parts installed, sizes match" in section(result.stdout, "model")
    assert "Gemma 3 270M Q4_K_M: 4 parts installed, sizes match" in section(result.stdout, "drafter")
    assert "not used: the scorer is ranker" in section(result.stdout, "drafter")
    assert not (tmp_path / "store" / "models").exists()


def test_a_missing_drafter_is_a_warning(tmp_path: Path, model_path: Path) -> None:
    result = doctor("--store-dir", str(tmp_path / "store"), "--model", str(model_path), "--scorer", "drafter",
                    "--drafter", str(tmp_path / "nope.gguf"))
    assert result.returncode == 0, result.stdout + result.stderr
    assert status_of(result.stdout, "drafter") == "WARN"
    assert "model file not found" in result.stdout and "(serve falls back to bm25)" in result.stdout


def test_explicit_model_is_loaded_vocab_only(tmp_path: Path, model_path: Path) -> None:
    result = doctor("--store-dir", str(tmp_path / "new" / "store"), "--model", str(model_path), "--n-ctx", "4096")
    assert result.returncode == 0, result.stdout + result.stderr
    assert "vocab-only load ok" in result.stdout and "n_ctx 4096" in result.stdout
    assert "nothing to verify against" in section(result.stdout, "model")  # a user's file has no expected hash
    assert (tmp_path / "new" / "store").is_dir()  # created, as serve would
    assert "llama_model_loader" not in result.stdout + result.stderr  # llama.cpp's chatter is kept out


@pytest.mark.parametrize("problem", ["missing", "not-gguf", "bad-gguf"])
def test_bad_model_fails(tmp_path: Path, problem: str) -> None:
    model = tmp_path / "model.gguf"
    if problem == "not-gguf":
        model.write_bytes(b"PK\x03\x04 not a model")
    elif problem == "bad-gguf":
        model.write_bytes(b"GGUF" + b"\x00" * 64)
    result = doctor("--store-dir", str(tmp_path / "store"), "--model", str(model))
    assert result.returncode == 1
    assert status_of(result.stdout, "model") == "FAIL"
    assert status_of(result.stdout, "store") == "OK"
    assert "doctor: 1 check(s) failed: model" in result.stdout
    assert "Traceback" not in result.stderr


def test_default_model_with_wrong_checksum_fails(tmp_path: Path) -> None:
    from engine.models.parts import QWEN_CODER_05B

    store = tmp_path / "store"
    (store / "models").mkdir(parents=True)
    (store / "models" / QWEN_CODER_05B.file_name).write_bytes(b"GGUF" + b"\x01" * 4096)
    result = doctor("--store-dir", str(store))
    assert result.returncode == 1
    assert status_of(result.stdout, "model") == "FAIL"
    assert f"is not the expected {QWEN_CODER_05B.sha256} (delete it to re-assemble)" in result.stdout


def test_unusable_store_fails(tmp_path: Path, model_path: Path) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("not a directory")
    result = doctor("--store-dir", str(blocker / "store"), "--model", str(model_path))
    assert result.returncode == 1
    assert status_of(result.stdout, "store") == "FAIL" and "cannot create" in result.stdout


def test_invalid_config_is_one_line_before_any_check(tmp_path: Path) -> None:
    result = doctor("--store-dir", str(tmp_path), env={"PFLASH_HOST": "0.0.0.0"})
    assert result.returncode == 2
    assert result.stdout == "" and len(result.stderr.strip().splitlines()) == 1
    assert "refusing to listen on 0.0.0.0" in result.stderr


def test_an_amx_build_on_an_amx_cpu_is_the_risk_doctor_warns_of() -> None:
    from engine.llama_build import amx_crash_risk

    spr = "flags\t\t: fpu avx2 avx512f amx_bf16 amx_tile amx_int8"
    with_amx = "CPU : AVX2 = 1 | AVX512 = 1 | AMX_INT8 = 1 | REPACK = 1 |"
    without = "CPU : AVX2 = 1 | AVX512 = 1 | REPACK = 1 |"
    assert amx_crash_risk(spr, with_amx)
    assert not amx_crash_risk(spr, without)
    assert not amx_crash_risk("flags\t\t: fpu avx2 avx512f", with_amx)


def test_only_the_llama_cpp_python_series_the_engine_was_written_against_serves() -> None:
    from engine.llama_build import unsupported_llama_cpp

    assert unsupported_llama_cpp("0.3.36") is None and unsupported_llama_cpp("0.3.36+cu124") is None
    for version in ("0.3.16", "0.3.37", "0.4.0", "1.0.0"):  # a patch release may move the internals
        assert "pip install 'llama-cpp-python==0.3.36'" in (unsupported_llama_cpp(version) or "")
    assert "not a release number" in (unsupported_llama_cpp("dev") or "")
