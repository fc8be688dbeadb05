"""The batched engine's scheduler fails one job and never stalls: a turn that cannot start fails
alone, the sequence count is checked against the batch size, and /health notices a dead scheduler.
Model: Gemma 3 270M (the engine); none for the settings and the app.
"""

from __future__ import annotations

import asyncio
import threading
from pathlib import Path
from typing import Any

import pytest
from aiohttp.test_utils import TestClient, TestServer
from pydantic import ValidationError

from engine.batched_engine import BatchedLlamaEngine
from engine.llama_engine import LlamaOptions
from gateway.app import create_app
from gateway.config import Settings
from policies.conversation_types import Finished, Message, SamplingParams
from tests.fake_engine import FakeEngine
from tests.test_batched_engine import MemoryTier


def options(path: Path, n_batch: int = 512) -> LlamaOptions:
    return LlamaOptions(model_path=path, model_sha256="test", n_ctx=1024, n_threads=2, n_batch=n_batch,
                        persist_idle=False)


def test_more_sequences_than_a_batch_holds_are_refused(tmp_path: Path, model_path: Path) -> None:
    with pytest.raises(ValidationError, match="must not exceed n_batch"):
        Settings(store_dir=tmp_path, sequences=16, n_batch=8)
    with pytest.raises(ValueError, match="must not exceed n_batch"):
        BatchedLlamaEngine(options(model_path, n_batch=8), sequences=16)


class BrokenTier(MemoryTier):
    """Fetching the state of session "broken" fails (a disk error, a bug)."""

    def fetch(self, session_id: str) -> Any:
        if session_id == "broken":
            raise OSError("the disk went away")
        return super().fetch(session_id)


@pytest.mark.engine
def test_a_turn_that_cannot_start_fails_alone_and_the_scheduler_goes_on(model_path: Path) -> None:
    async def ask(engine: BatchedLlamaEngine, session: str) -> str:
        prompt = await engine.prepare([Message("user", "Say hello.")], [])
        try:
            async for event in engine.stream(session, prompt, SamplingParams(max_tokens=4, temperature=0.0)):
                if isinstance(event, Finished):
                    return event.finish_reason
        except OSError as exc:
            return f"error: {exc}"
        return "no end"

    async def run() -> list[str]:
        engine = BatchedLlamaEngine(options(model_path), BrokenTier(), sequences=2)
        results = list(await asyncio.wait_for(asyncio.gather(ask(engine, "broken"), ask(engine, "fine")), 120))
        results.append(await asyncio.wait_for(ask(engine, "after"), 120))
        for _ in range(100):  # a turn leaves the count once the loop runs its done-callback
            if engine.stats()["queue_depth"] == 0:
                break
            await asyncio.sleep(0.01)
        assert engine.healthy() and engine.stats()["queue_depth"] == 0
        await engine.close()
        return results

    broken, fine, after = asyncio.run(run())
    assert broken == "error: the disk went away" and fine in ("stop", "length") and after in ("stop", "length")


@pytest.mark.engine
def test_a_dead_scheduler_thread_is_unhealthy(model_path: Path) -> None:
    engine = BatchedLlamaEngine(options(model_path), sequences=2)
    assert engine.healthy()
    alive = engine._thread
    engine._thread = threading.Thread(target=lambda: None)  # as if it had died: never started, not alive
    assert not engine.healthy()
    engine._thread = alive
    asyncio.run(engine.close())


class DeadEngine(FakeEngine):
    def healthy(self) -> bool:
        return False


async def test_health_says_so_when_the_engine_is_not_healthy(tmp_path: Path) -> None:
    settings = Settings(store_dir=tmp_path, scorer="bm25", recall_embedder=False, ranker_embedder=False)
    client = TestClient(TestServer(create_app(settings, lambda _s: DeadEngine())))
    await client.start_server()
    try:
        response = await client.get("/health")
        assert response.status == 503 and (await response.json())["status"] == "engine scheduler stopped"
    finally:
        await client.close()


@pytest.mark.engine
def test_a_deleted_session_leaves_the_engine_too(start_gateway: Any) -> None:
    import httpx

    server = start_gateway()
    body = {"model": "m", "max_tokens": 2, "temperature": 0,
            "messages": [{"role": "user", "content": "Name three rivers of Europe."}]}

    def ask() -> httpx.Response:
        reply = httpx.post(server.url + "/v1/chat/completions", json=body, headers={"X-Session-Id": "gone"},
                           timeout=120)
        assert reply.status_code == 200, reply.text
        return reply

    ask()
    assert ask().headers["X-PFlash-Restored-From"] == "context"  # resident: its sequence holds it
    assert httpx.delete(server.url + "/v1/sessions/gone", timeout=60).status_code == 200
    again = ask()  # the same key, a new session: nothing of the deleted one's KV
    assert again.headers["X-PFlash-Restored-From"] == "none"
    assert again.json()["usage"]["prompt_tokens_details"]["cached_tokens"] == 0
