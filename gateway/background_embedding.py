"""Embed a compressed message's units after its turn, while the engine is idle.

The ranker compresses without a model when it ranks by words alone (`ranker_embedder` off), so that
turn's time to first token carries no encoder time. The recall gate, though, matches a later
question better with the sentence encoder's ranks fused with BM25's (policies/recall.py: MTRAG train
+ validation, all gold present at the last turn in 96.6 % of conversations against 94.9 % with BM25
alone, each firing on about a third of follow-ups). So once the turn that compressed a message is
served, its units are embedded here, a few at a time and only while no turn is queued or running (an
agent's next request waits at most one chunk), and the vectors are stored with the session, so a
follow-up, even after a restart, embeds only its question. Until they are ready the gate scores with
BM25 (engine/scoring/embedder.py, EmbeddingGate); a job still queued at shutdown is dropped, and that
message keeps BM25 at the gate. A message the ranker compressed with meaning has its vectors already
(stored with its kept map): its job ends at once.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from engine.scoring.embedder import EmbeddingScorer
from sessions.record import SessionRecord
from sessions.registry import SessionRegistry

log = logging.getLogger("pflash.background")

CHUNK_UNITS = 4  # ≤ 512 word pieces: ~0.1 s on two idle cores, what a new turn may wait for
IDLE_POLL_SECONDS = 0.05
# Jobs waiting at most (each holds a compressed message's unit texts): under a burst of long outputs
# with the engine never idle, the oldest waiting job is dropped; its message keeps BM25 at the gate.
MAX_QUEUED_JOBS = 64


@dataclass(frozen=True)
class EmbeddingJob:
    record: SessionRecord
    units: tuple[str, ...]


class BackgroundEmbedder:
    """One worker task on the event loop; the encoder runs in a thread, one chunk at a time."""

    def __init__(self, dense: EmbeddingScorer, registry: SessionRegistry, idle: Callable[[], bool],
                 chunk_units: int = CHUNK_UNITS, max_queued: int = MAX_QUEUED_JOBS) -> None:
        self.dense = dense
        self.registry = registry
        self.idle = idle
        self.chunk_units = max(1, chunk_units)
        self.counters: dict[str, float] = {"background_jobs": 0, "background_units_embedded": 0,
                                           "background_seconds": 0.0, "background_failures": 0,
                                           "background_dropped": 0}
        self._queue: asyncio.Queue[EmbeddingJob] = asyncio.Queue(maxsize=max(1, max_queued))
        self._task: asyncio.Task[None] | None = None
        self._running = 0  # jobs taken off the queue and not finished

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._work())

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
            self._task = None

    def submit(self, record: SessionRecord, units: Sequence[str]) -> None:
        if self._queue.full():
            self._queue.get_nowait()  # the oldest waiting job: its message keeps BM25 at the gate
            self.counters["background_dropped"] += 1
        self._queue.put_nowait(EmbeddingJob(record, tuple(units)))

    @property
    def pending(self) -> int:
        """Jobs queued or running (/metrics, and what a benchmark waits on)."""
        return self._queue.qsize() + self._running

    async def _work(self) -> None:
        while True:
            job = await self._queue.get()
            self._running += 1
            try:
                await self._embed(job)
            except Exception as exc:  # noqa: BLE001 - the gate keeps BM25 for this message; serving goes on
                self.counters["background_failures"] += 1
                log.warning("background embedding failed (%s): the recall gate keeps BM25 for it", exc)
            finally:
                self._running -= 1

    async def _embed(self, job: EmbeddingJob) -> None:
        started = time.perf_counter()
        # A message the ranker compressed with meaning has its vectors (stored with its kept map).
        if not await asyncio.to_thread(self.dense.has_vectors, job.units):
            for first in range(0, len(job.units), self.chunk_units):
                while not self.idle():
                    await asyncio.sleep(IDLE_POLL_SECONDS)
                read = await asyncio.to_thread(self.dense.embed_units, job.units[first : first + self.chunk_units])
                self.counters["background_units_embedded"] += read
            exported = await asyncio.to_thread(self.dense.export_features, job.units)
            # Only the session's live record: one deleted (or replaced) meanwhile is not written back.
            if await self.registry.find(job.record.session_id, None) is job.record:
                job.record.add_unit_features(exported)
                await self.registry.save_record(job.record)
        self.counters["background_jobs"] += 1
        self.counters["background_seconds"] += time.perf_counter() - started
