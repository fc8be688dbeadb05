"""Shared fixtures: the embedded model file and real gateway processes on 127.0.0.1."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

ROOT = Path(__file__).resolve().parents[1]


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@pytest.fixture(scope="session")
def model_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from engine.model_files import default_model_path

    return default_model_path(tmp_path_factory.mktemp("models"))


class Gateway:
    """A `pflash-gateway serve` child process; stop() sends a real signal."""

    def __init__(self, store: Path, model: Path, *extra: str, env: dict[str, str] | None = None) -> None:
        self.store = store
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log_path = store.parent / f"gateway-{self.port}.log"
        args = [
            sys.executable, "-m", "gateway.cli", "serve",
            "--port", str(self.port), "--model", str(model), "--store-dir", str(store),
            "--n-ctx", "4096", "--threshold", "300", "--min-segment", "8", "--max-segment", "64",
            "--budget-curve", "300:0.3 100000:0.3", "--keepalive-seconds", "0.5", *extra,
        ]
        full_env = {**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})}
        self._log = self.log_path.open("wb")
        self.proc = subprocess.Popen(args, cwd=ROOT, stdout=self._log, stderr=subprocess.STDOUT, env=full_env)
        self._wait_ready()

    def _wait_ready(self, timeout: float = 90) -> None:
        deadline = time.time() + timeout
        while time.time() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"gateway exited with {self.proc.returncode}:\n{self.log()}")
            try:
                if httpx.get(self.url + "/health", timeout=1).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.2)
        self.stop()
        raise RuntimeError(f"gateway not ready in {timeout}s:\n{self.log()}")

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 60) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self._log.close()
        return int(self.proc.returncode)


@pytest.fixture(scope="session")
def gateway(tmp_path_factory: pytest.TempPathFactory, model_path: Path) -> Iterator[Gateway]:
    """One shared live gateway on the real model (threshold lowered to 300 tokens)."""
    server = Gateway(tmp_path_factory.mktemp("store"), model_path, "--max-body-mb", "1")
    yield server
    server.stop()


@pytest.fixture
def start_gateway(tmp_path: Path, model_path: Path) -> Iterator[type[Gateway]]:
    """Start extra gateways for a test (restart, faults); all are stopped afterwards."""
    started: list[Gateway] = []

    def start(*extra: str, store: Path | None = None, env: dict[str, str] | None = None) -> Gateway:
        server = Gateway(store or tmp_path / "store", model_path, *extra, env=env)
        started.append(server)
        return server

    yield start  # type: ignore[misc]
    for server in started:
        server.stop()
