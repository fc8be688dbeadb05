"""The event-loop lag probe: a loop blocked for 200 ms is seen as ~200 ms late, a free one as
nearly on time, and a live gateway exports what it saw on /metrics."""

from __future__ import annotations

import asyncio
import time

import pytest

from gateway.loop_probe import probe
from tests.conftest import Gateway
from tests.metrics_util import scrape, value


@pytest.mark.asyncio
async def test_a_blocked_loop_is_seen_late_and_a_free_one_on_time() -> None:
    seen: list[float] = []
    task = asyncio.create_task(probe(seen.append, interval=0.01))
    await asyncio.sleep(0.1)  # free: the timer fires on time
    free = list(seen)
    time.sleep(0.2)  # blocks the loop, as disk I/O on it would
    await asyncio.sleep(0.05)
    task.cancel()
    assert free and max(free) < 0.05
    assert max(seen) >= 0.15


@pytest.mark.engine
def test_the_gateway_exports_its_loop_lag(gateway: Gateway) -> None:
    first = value(scrape(gateway.url), "pflash_event_loop_lag_seconds_count")
    time.sleep(0.3)
    samples = scrape(gateway.url)
    assert value(samples, "pflash_event_loop_lag_seconds_count") > first + 5  # ~30 timers in 0.3 s
    assert value(samples, "pflash_event_loop_lag_seconds_bucket", le="+Inf") == value(
        samples, "pflash_event_loop_lag_seconds_count")
