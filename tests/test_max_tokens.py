"""How long an answer may be: the request's max_tokens, the default when it gives none, and the
server's limit above both (Claude Code asks for 32,000 tokens on every turn)."""

from __future__ import annotations

from pathlib import Path

from aiohttp.test_utils import TestClient, TestServer

from gateway.app import create_app
from gateway.config import Settings
from tests.fake_engine import FakeEngine


async def asked(store: Path, limit: int | None, *bodies: dict) -> list[int | None]:
    engine = FakeEngine()
    settings = Settings(store_dir=store, scorer="bm25", recall_embedder=False, ranker_embedder=False,
                        default_max_tokens=100, max_tokens_limit=limit)
    client = TestClient(TestServer(create_app(settings, lambda _s: engine)))
    await client.start_server()
    try:
        for body in bodies:
            path = "/v1/messages" if "max_tokens" in body else "/v1/chat/completions"
            assert (await client.post(path, json={"model": "m", "messages": [{"role": "user", "content": "hi"}],
                                                   **body})).status == 200
    finally:
        await client.close()
    return [p.max_tokens for p in engine.params]


async def test_the_server_limit_caps_what_a_request_asks(tmp_path: Path) -> None:
    assert await asked(tmp_path / "a", 256, {"max_tokens": 32000}, {"max_tokens": 8}, {}) == [256, 8, 100]
    assert await asked(tmp_path / "b", None, {"max_tokens": 32000}, {}) == [32000, 100]
