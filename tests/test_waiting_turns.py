"""A turn that waits before it can run (another turn holds its conversation's branch): a stream
gets keep-alives meanwhile, and a client that leaves takes its turn with it (issue 51, item 11).
Model: none (the fake engine)."""

from __future__ import annotations

import asyncio
import tempfile
from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
from aiohttp import web

from engine.base import EngineEvent, PreparedPrompt
from gateway.app import create_app
from gateway.state import APP_STATE
from tests.conftest import free_port
from tests.fake_engine import FakeEngine
from tests.test_branches import CLAUDE, anthropic_body, app_settings, start_app


class HeldEngine(FakeEngine):
    """The first turn holds until `release` is set: its branch stays busy."""

    def __init__(self) -> None:
        super().__init__()
        self.release = asyncio.Event()
        self.turns = 0

    async def _turn(self, session_id: str, prompt: PreparedPrompt) -> AsyncIterator[EngineEvent]:
        self.turns += 1
        if self.turns == 1:
            await self.release.wait()
        async for event in super()._turn(session_id, prompt):
            yield event


def test_a_stream_waiting_for_its_branch_gets_keepalives_then_its_answer() -> None:
    async def run() -> None:
        with tempfile.TemporaryDirectory() as tmp:
            engine = HeldEngine()
            client = await start_app(Path(tmp), engine)
            body = {**anthropic_body("You are terse.", "hi"), "stream": True}
            first = asyncio.create_task(client.post("/v1/messages", json=body, headers=CLAUDE))
            await asyncio.sleep(0.3)
            second = await asyncio.wait_for(client.post("/v1/messages", json=body, headers=CLAUDE), 5)
            assert second.status == 200 and second.headers["Content-Type"] == "text/event-stream"
            waited = await asyncio.wait_for(second.content.readuntil(b"\n\n"), 5)
            assert waited == b": keep-alive\n\n" and engine.turns == 1  # nothing of it ran yet
            engine.release.set()
            rest = (await asyncio.wait_for(second.read(), 5)).decode()
            assert "event: message_start" in rest and '"text":"ok"' in rest.replace(' ', '') and "event: message_stop" in rest
            assert (await (await first).read()).count(b"event: message_stop") == 1
            await client.close()

    asyncio.run(run())


def test_a_client_that_leaves_while_its_turn_waits_takes_the_turn_with_it() -> None:
    """Served as `pflash-gateway serve` serves (web.run_app: a handler is not cancelled when its
    client leaves), not by the test server, which cancels it."""
    async def run() -> None:
        with tempfile.TemporaryDirectory() as tmp:
            engine = HeldEngine()
            app = create_app(app_settings(Path(tmp)), lambda _s: engine)
            runner = web.AppRunner(app)
            await runner.setup()
            port = free_port()
            await web.TCPSite(runner, "127.0.0.1", port).start()
            url = f"http://127.0.0.1:{port}/v1/messages"
            body = anthropic_body("You are terse.", "hi")
            async with aiohttp.ClientSession() as client:
                first = asyncio.create_task(client.post(url, json=body, headers=CLAUDE))
                await asyncio.sleep(0.3)
                leaving = asyncio.create_task(client.post(url, json=body, headers=CLAUDE))
                await asyncio.sleep(0.3)
                leaving.cancel()  # the client hangs up while its turn waits for the branch
                await asyncio.gather(leaving, return_exceptions=True)
                await asyncio.sleep(1.0)  # the server notices within its poll
                waiting = [users for _lock, users in app[APP_STATE].turns.branches._locks.values()]
                assert waiting == [1]  # the first turn alone: the abandoned one no longer waits for the branch
                engine.release.set()
                assert (await first).status == 200
                await asyncio.sleep(0.5)
                assert engine.turns == 1 and len(engine.prompts) == 1  # the abandoned turn never ran
                third = await client.post(url, json=body, headers=CLAUDE)  # the branch is free again
                assert third.status == 200 and engine.turns == 2
            await runner.cleanup()

    asyncio.run(run())
