"""A non-streaming client that leaves is noticed even while events come faster than the poll
interval (the cause of issue 13's flaky disconnect test): a real aiohttp server, a real socket
that hangs up, and an event source standing in for the engine (no model needed)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator

from aiohttp import web

from engine.base import EngineEvent
from gateway.api_handler import DISCONNECT_POLL_SECONDS, _until_client_leaves
from policies.conversation_types import TextDelta

TOKEN_SECONDS = 0.01  # far faster than the poll: the connection is never idle long enough to be polled


def test_client_that_leaves_mid_answer_stops_a_fast_event_source() -> None:
    produced: list[int] = []
    closed = asyncio.Event()
    handler_ended: list[str] = []

    async def tokens() -> AsyncIterator[EngineEvent]:
        try:
            for i in range(2000):  # 20 s of tokens: far longer than the test waits
                await asyncio.sleep(TOKEN_SECONDS)
                produced.append(i)
                yield TextDelta(str(i))
        finally:
            closed.set()

    async def handler(request: web.Request) -> web.Response:
        try:
            async for _event in _until_client_leaves(request, tokens()):
                pass
        except ConnectionResetError:
            handler_ended.append("client gone")
            return web.Response(status=499)  # as the gateway's error middleware answers: nobody reads it
        return web.Response(text="done")

    async def scenario() -> float:
        app = web.Application()
        app.router.add_post("/", handler)
        runner = web.AppRunner(app)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        port = runner.addresses[0][1]
        try:
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            writer.write(b"POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n\r\n{}")
            await writer.drain()
            await asyncio.sleep(0.3)  # the answer is being generated
            writer.close()
            left = time.monotonic()
            await asyncio.wait_for(closed.wait(), timeout=5)
            return time.monotonic() - left
        finally:
            await runner.cleanup()

    stopped_after = asyncio.run(scenario())
    # Generous for a loaded machine; before the fix it ran on for the whole 20 s.
    assert stopped_after < DISCONNECT_POLL_SECONDS + 2, stopped_after
    assert handler_ended == ["client gone"]
    assert len(produced) < 500, len(produced)
