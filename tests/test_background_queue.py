"""The background encoder's queue is bounded: under a burst of compressed outputs while the engine
never idles, the oldest waiting job goes first (its message keeps BM25 at the recall gate)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from gateway.background_embedding import BackgroundEmbedder
from sessions.record import SessionRecord


def test_the_oldest_waiting_job_is_dropped_when_the_queue_is_full(tmp_path: Path) -> None:
    encoder: Any = None  # never reached: nothing runs the queue here
    background = BackgroundEmbedder(encoder, registry=None, idle=lambda: False, max_queued=2)  # type: ignore[arg-type]
    records = [SessionRecord(session_id=c * 64, tenant="") for c in "abc"]
    for record in records:
        background.submit(record, ["unit"])
    assert background.pending == 2 and background.counters["background_dropped"] == 1
    waiting = [background._queue.get_nowait().record for _ in range(2)]
    assert waiting == records[1:]
