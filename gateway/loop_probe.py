"""How long the event loop is blocked: a timer asks to wake every 10 ms and records how late it
woke. Anything that runs on the loop instead of awaiting (disk I/O, a lock held by a worker,
a long computation) shows up here, so `/metrics` tells whether keep-alives and `/health` could
have been answered while session state moved."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable

from aiohttp import web

PROBE_INTERVAL_S = 0.010


async def probe(observe: Callable[[float], None], interval: float = PROBE_INTERVAL_S) -> None:
    loop = asyncio.get_running_loop()
    while True:
        asked = loop.time()
        await asyncio.sleep(interval)
        observe(max(0.0, loop.time() - asked - interval))


def lag_probe_ctx(observe: Callable[[float], None]) -> Callable[[web.Application], AsyncIterator[None]]:
    """An aiohttp cleanup context running the probe for the app's lifetime."""

    async def lifetime(_app: web.Application) -> AsyncIterator[None]:
        task = asyncio.create_task(probe(observe))
        yield
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task

    return lifetime
