"""Settings: TOML < environment < flags; one clear line for invalid settings; the systemd unit.
Model: none (no model is loaded).
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from gateway.cli import build_parser, settings_from
from gateway.config import Settings, SettingsError, load_settings
from tests.conftest import ROOT


def test_precedence_flags_over_env_over_toml(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    toml = tmp_path / "config.toml"
    toml.write_text('port = 9001\nthreshold = 1000\nn_ctx = 8192\napi_keys = ["a", "b"]\n')
    monkeypatch.setenv("PFLASH_PORT", "9002")
    monkeypatch.setenv("PFLASH_THRESHOLD", "2000")
    args = build_parser().parse_args(["serve", "--config", str(toml), "--port", "9003"])
    settings = settings_from(args)
    assert settings.port == 9003  # flag
    assert settings.threshold == 2000  # environment
    assert settings.n_ctx == 8192  # file
    assert settings.api_keys == ["a", "b"]
    assert settings.host == "127.0.0.1"  # default


def test_env_lists_are_comma_separated(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PFLASH_API_KEYS", "k1, k2,,k3")
    assert load_settings().api_keys == ["k1", "k2", "k3"]


@pytest.mark.parametrize(
    ("overrides", "fragment"),
    [
        ({"port": 70000}, "port"),
        ({"budget_curve": "16384:0.3 100:0.2"}, "budget_curve"),
        ({"cache_type_v": "q8_0"}, "flash_attn"),
        ({"host": "0.0.0.0"}, "without API keys"),
        ({"engine": "upstream"}, "upstream_url"),
        ({"min_segment": 600, "max_segment": 512}, "min_segment"),
    ],
)
def test_invalid_settings_fail_with_one_line(overrides: dict[str, object], fragment: str) -> None:
    with pytest.raises(SettingsError) as info:
        load_settings(overrides)
    message = str(info.value)
    assert "\n" not in message and fragment in message


def test_cli_invalid_setting_exits_2_without_traceback() -> None:
    result = subprocess.run([sys.executable, "-m", "gateway.cli", "serve", "--n-ctx", "10"],
                            cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert result.returncode == 2
    assert result.stderr.strip().count("\n") == 0 and "n_ctx" in result.stderr
    assert "Traceback" not in result.stderr


def test_help_documents_every_setting() -> None:
    result = subprocess.run([sys.executable, "-m", "gateway.cli", "serve", "--help"],
                            cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert result.returncode == 0
    for name in Settings.model_fields:
        assert "--" + name.replace("_", "-") in result.stdout
        assert "PFLASH_" + name.upper() in result.stdout


def test_shipped_config_example_is_valid() -> None:
    settings = load_settings(config_file=ROOT / "systemd" / "config.toml")
    assert settings.port == 8090 and settings.log_format == "json"
    defaults = Settings()  # the service serves what was tuned, not an older choice pinned in the example
    for name in ("scorer", "ranker_embedder", "recall_embedder", "recall_theta", "recall_budget", "budget_curve"):
        assert getattr(settings, name) == getattr(defaults, name), name


@pytest.mark.skipif(shutil.which("systemd-analyze") is None, reason="systemd-analyze not installed")
def test_systemd_unit_verifies(tmp_path: Path) -> None:
    unit = (ROOT / "systemd" / "pflash-gateway.service").read_text()
    # Point ExecStart at a binary that exists here; verify checks it.
    unit = unit.replace("/opt/pflash-gateway/.venv/bin/pflash-gateway", sys.executable)
    unit = unit.replace("User=pflash\nGroup=pflash\n", "")
    path = tmp_path / "pflash-gateway.service"
    path.write_text(unit)
    result = subprocess.run(["systemd-analyze", "verify", str(path)], capture_output=True, text=True, timeout=60)
    problems = [line for line in result.stderr.splitlines() if "pflash-gateway.service" in line]
    assert result.returncode == 0 or not problems, result.stderr
