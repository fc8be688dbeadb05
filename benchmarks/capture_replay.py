"""The captured Claude Code traffic (`../shared/captures/claude`: several sessions, their
sub-agents and side requests, in the order sent) replayed against one server, request by request:
the tokens it prefilled (read from its own /metrics) and the total wait. The gateway and llama.cpp's
llama-server (its host-memory prompt cache on by default) answer the same requests.
"""

from __future__ import annotations

import json
import os
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from benchmarks.timing import wait_until_up
from gateway.process import free_port

DROPPED_HEADERS = {"authorization", "host", "content-length", "accept-encoding", "connection"}


def captured_requests(folder: Path) -> list[tuple[str, dict[str, Any], dict[str, str]]]:
    """Every Messages request of the capture, in order: (name, body asking for 4 tokens, headers)."""
    out = []
    for path in sorted(folder.glob("*.json")):
        data = json.loads(path.read_text(encoding="utf-8"))
        if data.get("path") != "/v1/messages" or not isinstance(data.get("body"), dict):
            continue
        body = {**data["body"], "max_tokens": 4, "stream": False, "temperature": 0}
        headers = {k: v for k, v in data["headers"].items() if k.lower() not in DROPPED_HEADERS}
        out.append((path.stem, body, headers))
    return out


def metric_total(url: str, names: tuple[str, ...]) -> float:
    """The sum of the /metrics samples named (with their labels) in `names`."""
    text = httpx.get(url + "/metrics", timeout=60).text
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
               if not line.startswith("#") and line.rsplit(" ", 1)[0] in names)


@dataclass(frozen=True)
class ReplayResult:
    server: str
    requests: int
    prefilled: float  # prompt tokens the server evaluated (not taken from a cache)
    prompt_tokens: int  # the prompts' size as the server counted them (its usage: fresh + cached)
    wait_s: float  # the sum of the requests' wall times
    failures: int


def replay(url: str, server: str, requests: list[tuple[str, dict[str, Any], dict[str, str]]],
           prefilled_metric: tuple[str, ...]) -> ReplayResult:
    before = metric_total(url, prefilled_metric)
    wait, failures, prompt = 0.0, 0, 0
    for _name, body, headers in requests:
        started = time.perf_counter()
        response = httpx.post(url + "/v1/messages", json=body, headers=headers, timeout=3600)
        wait += time.perf_counter() - started
        failures += response.status_code != 200
        if response.status_code == 200:
            usage = response.json().get("usage") or {}
            prompt += int(usage.get("input_tokens", 0)) + int(usage.get("cache_read_input_tokens", 0))
    return ReplayResult(server, len(requests), metric_total(url, prefilled_metric) - before, prompt, wait, failures)


GATEWAY_PREFILLED = ('pflash_prefill_tokens_total{kind="evaluated"}',)
LLAMA_SERVER_PREFILLED = ("llamacpp:prompt_tokens_total",)


class LlamaServer:
    """llama.cpp's own server with its defaults (4 slots, unified KV, host-memory prompt cache),
    `--metrics` on so its prefilled tokens can be read."""

    def __init__(self, binary: Path, model: Path, n_ctx: int, log: Path) -> None:
        port = free_port()
        self.url = f"http://127.0.0.1:{port}"
        self._log = log.open("ab")  # a restart appends
        self._proc = subprocess.Popen([str(binary), "-m", str(model), "--port", str(port), "--host", "127.0.0.1",
                                       "-c", str(n_ctx), "-t", str(os.cpu_count() or 1), "--metrics", "--jinja"],
                                      stdout=self._log, stderr=subprocess.STDOUT)
        wait_until_up(self._proc, self.url + "/health", "llama-server", log)

    def stop(self) -> None:
        self._proc.terminate()
        try:
            self._proc.wait(60)
        except subprocess.TimeoutExpired:
            self._proc.kill()
        self._log.close()


def llama_server_binary(root: Path, build: bool = True) -> Path | None:
    """Build (once) and return llama-server, or None when it cannot be built here (or, with `build`
    off, was not built before)."""
    env = {**os.environ, **({} if build else {"PFLASH_NO_BUILD": "1"})}
    try:
        out = subprocess.run(["bash", "scripts/build_llama_server.sh"], cwd=root, capture_output=True, text=True,
                             check=True, timeout=3600, env=env)
    except (OSError, subprocess.SubprocessError):
        return None
    path = Path(out.stdout.strip().splitlines()[-1])
    return path if path.is_file() else None
