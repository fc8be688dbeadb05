"""Shared fixtures: the embedded model files and real gateway processes on 127.0.0.1.

Two models, each named by its fixture: `model_path` is Gemma 3 270M Q4_K_M, the fast base model
that almost every engine test serves (and the drafter everywhere); `instruct_model_path` is
Qwen2.5-Coder-0.5B-Instruct Q4_K_M (about 2x the prefill cost), only for the few tests that need a
real answer or a tool call the model itself produced (marked `instruct`).
"""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from gateway.process import ROOT, GatewayProcess, free_port

__all__ = ["ROOT", "Gateway", "free_port"]


@pytest.fixture(scope="session")
def models_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("models")


@pytest.fixture(scope="session")
def model_path(models_dir: Path) -> Path:
    """Gemma 3 270M Q4_K_M (base model, no chat tuning): the suite's fast model and drafter."""
    from engine.models.parts import GEMMA_3_270M, assemble

    return assemble(GEMMA_3_270M, models_dir)


@pytest.fixture(scope="session")
def instruct_model_path(models_dir: Path) -> Path:
    """Qwen2.5-Coder-0.5B-Instruct Q4_K_M, the served default: real chat answers and tool calls."""
    from engine.models.parts import QWEN_CODER_05B, assemble

    return assemble(QWEN_CODER_05B, models_dir)


@pytest.fixture(scope="session")
def embedder_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The sentence encoder, converted once by `pflash-gateway make-embedder` (which also runs the
    reference check: cosine with the numpy implementation)."""
    import re

    from engine.models.embedder_convert import MIN_COSINE

    store = tmp_path_factory.mktemp("embedder-store")
    out = store / "minilm.gguf"
    proc = subprocess.run([sys.executable, "-m", "gateway.cli", "make-embedder", "--out", str(out),
                           "--store-dir", str(store)], cwd=ROOT, capture_output=True, text=True, timeout=300,
                          check=False)
    assert proc.returncode == 0, proc.stderr
    found = re.search(r"cosine with the reference implementation: min ([0-9.]+)", proc.stdout)
    assert found and float(found.group(1)) >= MIN_COSINE, proc.stdout
    return out


@pytest.fixture
def sentence_encoder(embedder_path: Path) -> Iterator[Any]:
    """A fresh EmbeddingScorer on the converted encoder (empty unit cache), two threads."""
    from engine.scoring.embedder import EmbeddingScorer

    scorer = EmbeddingScorer(embedder_path, n_threads=2)
    yield scorer
    scorer.close()


class Gateway(GatewayProcess):
    """A live gateway with the test defaults: small context, compression threshold lowered to 300,
    the drafter given as a file (default: the served model's own file; Gemma in most tests), the
    ranker on its lexical weights unless `--ranker-embedder` is passed, and the recall gate on BM25
    unless `--recall-embedder` is."""

    def __init__(self, store: Path, model: Path, *extra: str, env: dict[str, str] | None = None,
                 drafter: Path | None = None) -> None:
        self.engine = extra[extra.index("--engine") + 1] if "--engine" in extra else "llama"
        self.proxy: RecordingProxy | None = None  # set when the upstream is behind a recording proxy
        super().__init__(
            store, "--model", str(model), "--drafter", str(drafter or model), "--n-ctx", "4096",
            "--threshold", "300", "--min-segment", "8",
            "--max-segment", "64", "--budget-curve", "300:0.3 100000:0.3", "--keepalive-seconds", "0.5",
            # The gate's background encoder makes recall depend on timing (BM25 until the units are
            # embedded), and the tests' short outputs pin lines the lexical ranker keeps: the
            # encoder is off here, on in the tests of it (test_background_embedding.py,
            # test_ranker_meaning.py).
            *(() if "--recall-embedder" in extra else ("--no-recall-embedder",)),
            *(() if "--ranker-embedder" in extra else ("--no-ranker-embedder",)),
            *extra, env=env,
        )


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


def serve_in_thread(app: Any, port: int) -> None:
    """Serve an aiohttp app on 127.0.0.1:`port` from a daemon thread with its own event loop."""
    import asyncio
    import threading

    from aiohttp import web

    loop = asyncio.new_event_loop()
    ready = threading.Event()

    async def serve() -> None:
        runner = web.AppRunner(app)
        await runner.setup()
        await web.TCPSite(runner, "127.0.0.1", port).start()
        ready.set()

    def run() -> None:
        asyncio.set_event_loop(loop)
        loop.run_until_complete(serve())
        loop.run_forever()

    threading.Thread(target=run, daemon=True).start()
    ready.wait(10)


class RecordingProxy:
    """A pass-through HTTP proxy on 127.0.0.1 that records every JSON body sent upstream, so a
    test can see exactly what the upstream received."""

    def __init__(self, target: str) -> None:
        from aiohttp import ClientSession, web

        self.target = target.rstrip("/")
        self.bodies: list[dict] = []
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"

        async def forward(request: web.Request) -> web.StreamResponse:
            raw = await request.read()
            if raw:
                try:
                    self.bodies.append(__import__("json").loads(raw))
                except ValueError:
                    pass
            async with ClientSession() as session:
                async with session.request(request.method, self.target + request.path_qs, data=raw,
                                           headers={"Content-Type": "application/json"}) as upstream:
                    response = web.StreamResponse(status=upstream.status,
                                                  headers={"Content-Type": upstream.headers.get("Content-Type", "")})
                    await response.prepare(request)
                    try:
                        async for chunk in upstream.content.iter_any():
                            await response.write(chunk)
                        await response.write_eof()
                    except ConnectionError:
                        pass  # the gateway hung up early (a cancelled turn): nothing to relay
                    return response

        app = web.Application()
        app.router.add_route("*", "/{tail:.*}", forward)
        serve_in_thread(app, self.port)

    def chat_bodies(self) -> list[dict]:
        return [b for b in self.bodies if "messages" in b]


@pytest.fixture(scope="session")
def llama_server(model_path: Path) -> Iterator[str]:
    """llama-cpp-python's own OpenAI-compatible server on the small model: an upstream we did not write."""
    port = free_port()
    log_path = model_path.parent / f"llama-server-{port}.log"
    with log_path.open("wb") as log:
        proc = subprocess.Popen(
            [sys.executable, "-m", "llama_cpp.server", "--model", str(model_path), "--port", str(port),
             "--chat_format", "gemma", "--n_ctx", "4096", "--verbose", "False"],
            cwd=ROOT, stdout=log, stderr=subprocess.STDOUT,
        )
        url = f"http://127.0.0.1:{port}"
        deadline = time.time() + 90
        while time.time() < deadline:
            try:
                if httpx.get(url + "/v1/models", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                time.sleep(0.3)
        else:
            proc.kill()
            raise RuntimeError(log_path.read_text(errors="replace"))
        yield url
        proc.terminate()
        proc.wait(30)


@pytest.fixture(scope="session")
def recording_proxy(llama_server: str) -> RecordingProxy:
    return RecordingProxy(llama_server)


@pytest.fixture(scope="session")
def upstream_gateway(tmp_path_factory: pytest.TempPathFactory, model_path: Path,
                     recording_proxy: RecordingProxy) -> Iterator[Gateway]:
    server = Gateway(tmp_path_factory.mktemp("upstream-store"), model_path, "--engine", "upstream",
                     "--upstream-url", recording_proxy.url + "/v1", "--tokenizer", str(model_path),
                     "--upstream-n-ctx", "4096")
    server.proxy = recording_proxy
    yield server
    server.stop()


@pytest.fixture(params=["llama", "upstream"])
def any_gateway(request: pytest.FixtureRequest) -> Gateway:
    """The same compression and recall tests run against both engines."""
    return request.getfixturevalue("gateway" if request.param == "llama" else "upstream_gateway")
