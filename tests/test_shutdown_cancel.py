"""A shutdown never passes a cut turn off as finished: the turn in flight ends with an error (the
busy error, which agents retry), a queued one gets the busy error without starting, and neither
yields a Finished that the session would remember.
Model: Gemma 3 270M (both engines).
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from engine.base import EngineUnavailable
from engine.batched_engine import BatchedLlamaEngine
from engine.llama_engine import LlamaEngine, LlamaOptions
from policies.conversation_types import Finished, Message, SamplingParams, TextDelta

pytestmark = pytest.mark.engine


async def outcome(engine: Any, session: str, first_text: asyncio.Event | None = None) -> tuple[str, int]:
    prompt = await engine.prepare([Message("user", "Write a long story about a lighthouse keeper.")], [])
    texts = 0
    try:
        async for event in engine.stream(session, prompt, SamplingParams(max_tokens=400, temperature=0.0)):
            if isinstance(event, TextDelta):
                texts += 1
                if first_text is not None:
                    first_text.set()
            elif isinstance(event, Finished):
                return f"finished:{event.finish_reason}", texts
    except EngineUnavailable:
        return "unavailable", texts
    return "no end", texts


@pytest.mark.parametrize("kind", ["single", "batched"])
def test_shutdown_cuts_the_running_turn_with_an_error_and_the_queued_one_never_starts(
        model_path: Path, kind: str) -> None:
    options = LlamaOptions(model_path=model_path, model_sha256="test", n_ctx=2048, n_threads=2, persist_idle=False)

    async def run() -> list[tuple[str, int]]:
        engine = LlamaEngine(options) if kind == "single" else BatchedLlamaEngine(options, sequences=1)
        started = asyncio.Event()
        running = asyncio.create_task(outcome(engine, "a", started))
        await started.wait()
        queued = asyncio.create_task(outcome(engine, "b"))  # one sequence: it waits behind "a"
        await asyncio.sleep(0.2)
        assert engine.cancel_all() == 2
        results = await asyncio.gather(running, queued)
        await engine.close()
        return results

    (cut, cut_texts), (never, never_texts) = asyncio.run(run())
    assert cut == "unavailable" and cut_texts >= 1  # some text came, then the error: not "finished:stop"
    assert never == "unavailable" and never_texts == 0
