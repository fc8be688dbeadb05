"""The batched engine (engine/batched_engine.py): several sessions in one llama.cpp context, decoded
together, against the single-sequence engine.
Model: Qwen2.5-Coder-0.5B-Instruct for greedy answers (peaked logits: llama.cpp's CPU kernels give a
row slightly different values depending on the rows beside it in a batch, ~0.2-0.9 in the logits
measured here, so only a clear answer is the same text however it is batched), Gemma 3 270M else.
"""

from __future__ import annotations

import asyncio
import logging
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from engine.base import PrefillDone
from engine.batched_engine import BatchedLlamaEngine
from engine.llama_engine import LlamaEngine, LlamaOptions
from engine.seq_state import restore_sequence, save_sequence
from policies.conversation_types import Finished, Message, SamplingParams, TextDelta

pytestmark = pytest.mark.engine

QUESTIONS = ("Count from 1 to 12, separated by commas.", "Name the days of the week in order.")


def options(path: Path, n_ctx: int = 4096) -> LlamaOptions:
    return LlamaOptions(model_path=path, model_sha256="test", n_ctx=n_ctx, n_threads=2)


async def answer(engine: Any, session: str, question: str, max_tokens: int = 40,
                 first_token: asyncio.Event | None = None) -> tuple[str, Finished | None, float]:
    prompt = await engine.prepare([Message("user", question)], [])
    parts: list[str] = []
    finished = None
    async for event in engine.stream(session, prompt, SamplingParams(max_tokens=max_tokens, temperature=0.0)):
        if isinstance(event, TextDelta):
            parts.append(event.text)
            if first_token is not None:
                first_token.set()
        elif isinstance(event, Finished):
            finished = event
    return "".join(parts), finished, time.monotonic()


@pytest.mark.instruct
def test_two_sessions_at_once_answer_as_each_alone_and_as_the_single_sequence_engine(
        instruct_model_path: Path) -> None:
    async def run() -> tuple[list[str], list[str], list[str], dict[str, float]]:
        single = LlamaEngine(options(instruct_model_path))
        alone_single = [(await answer(single, f"s{i}", q))[0] for i, q in enumerate(QUESTIONS)]
        await single.close()
        batched = BatchedLlamaEngine(options(instruct_model_path), sequences=2)
        alone = [(await answer(batched, f"a{i}", q))[0] for i, q in enumerate(QUESTIONS)]
        steps_before = batched.stats()["batch_steps"]
        together = await asyncio.gather(*(answer(batched, f"t{i}", q) for i, q in enumerate(QUESTIONS)))
        stats = batched.stats()
        stats["steps_together"] = stats["batch_steps"] - steps_before
        await batched.close()
        return alone_single, alone, [t[0] for t in together], stats

    alone_single, alone, together, stats = asyncio.run(run())
    assert all(len(text) > 10 for text in alone)
    assert together == alone == alone_single
    # Decoded together: fewer steps than tokens (one step carries both streams' next tokens).
    assert stats["steps_together"] < stats["completion_tokens"] / 2 + 10


def test_a_cancelled_turn_frees_its_sequence_at_once(model_path: Path) -> None:
    """Both sequences busy with long answers; a third session waits. Cancelling one answer lets the
    third start while the other answer still runs."""
    async def run() -> tuple[float, float, float, int]:
        engine = BatchedLlamaEngine(options(model_path), sequences=2)
        started = [asyncio.Event(), asyncio.Event()]
        long_a = engine.stream("a", await engine.prepare([Message("user", "Tell a long story.")], []),
                               SamplingParams(max_tokens=600, temperature=0.0))
        long_b = asyncio.create_task(answer(engine, "b", "Tell another long story.", 400, started[1]))

        async def drain_a() -> None:
            async for event in long_a:
                if isinstance(event, TextDelta):
                    started[0].set()

        task_a = asyncio.create_task(drain_a())
        await asyncio.wait_for(asyncio.gather(started[0].wait(), started[1].wait()), 120)
        third = asyncio.create_task(answer(engine, "c", "Say hello.", 8))
        await asyncio.sleep(0.5)
        waiting = engine.stats()["sequences_active"]
        task_a.cancel()  # the client went away: the relay stops the turn at its next step
        cancelled_at = time.monotonic()
        _, _, third_done = await asyncio.wait_for(third, 120)
        _, finished_b, b_done = await long_b
        await engine.close()
        assert finished_b is not None
        return cancelled_at, third_done, b_done, int(waiting)

    cancelled_at, third_done, b_done, waiting = asyncio.run(run())
    assert waiting == 2  # the third session was waiting for a sequence
    assert cancelled_at < third_done < b_done


def test_a_sequence_state_restored_into_another_sequence_gives_the_same_next_token(model_path: Path) -> None:
    engine = BatchedLlamaEngine(options(model_path), sequences=3)
    lib, ctx, nv = engine._lib, engine._context.ctx, engine._llm.n_vocab()
    tokens = engine.tokenize("def reverse(s):\n    return s[::-1]\n\nprint(reverse(")

    def decode(seq: int, chunk: list[int], pos: int) -> np.ndarray:
        batch = engine._batch.batch
        batch.n_tokens = engine._put(batch, 0, seq, chunk, pos, True)
        assert lib.llama_decode(ctx, batch) == 0
        return np.ctypeslib.as_array(lib.llama_get_logits_ith(ctx, len(chunk) - 1), shape=(nv,)).copy()

    decode(0, tokens[:-1], 0)
    state = save_sequence(lib, ctx, 0, tokens[:-1], None)
    assert restore_sequence(lib, ctx, 2, state, engine.n_ctx)
    from_origin = decode(0, tokens[-1:], len(tokens) - 1)
    from_copy = decode(2, tokens[-1:], len(tokens) - 1)
    asyncio.run(engine.close())
    assert int(from_origin.argmax()) == int(from_copy.argmax())
    assert np.array_equal(from_origin, from_copy)  # one row alone in each batch: bit for bit


class MemoryTier:
    """A state tier in a dict: what the engine stashes comes back once (copies, as the real tier's)."""

    def __init__(self) -> None:
        self.stashed: dict[str, Any] = {}

    def stash(self, session_id: str, state: Any) -> None:
        self.stashed[session_id] = type(state)(state.tokens, bytes(state.blob))

    def fetch(self, session_id: str) -> Any:
        state = self.stashed.pop(session_id, None)
        return (state, "ram") if state is not None else None

    def holding(self, session_id: str | None, tokens: int) -> None: ...
    def holding_many(self, sessions: dict[str, int]) -> None: ...
    def prefetch(self, session_id: str) -> None: ...
    def persist(self, session_id: str, state: Any) -> None: ...

    def buffer(self, n: int) -> Any:
        return np.empty(n, dtype=np.uint8)


def test_a_follow_up_reuses_its_sequence_and_a_fourth_session_stashes_the_oldest(
        model_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """Three sessions on two sequences: the third stashes the least recently used session's KV to
    the tier; that session's next turn restores it and prefills only its new tokens."""
    async def run() -> list[PrefillDone]:
        engine = BatchedLlamaEngine(options(model_path), MemoryTier(), sequences=2)
        done: list[PrefillDone] = []

        async def turn(session: str, messages: list[Message]) -> str:
            prompt = await engine.prepare(messages, [])
            text = []
            async for event in engine.stream(session, prompt, SamplingParams(max_tokens=8, temperature=0.0)):
                if isinstance(event, PrefillDone):
                    done.append(event)
                elif isinstance(event, TextDelta):
                    text.append(event.text)
            return "".join(text)

        first = [Message("user", "The code word is harbour. Remember it.")]
        reply = await turn("one", first)
        await turn("two", [Message("user", "Something else entirely.")])
        await turn("three", [Message("user", "A third conversation.")])  # stashes "one"
        await turn("one", [*first, Message("assistant", reply), Message("user", "What was the code word?")])
        await engine.close()
        return done

    with caplog.at_level(logging.INFO, logger="pflash.engine"):
        done = asyncio.run(run())
    follow_up = done[-1]
    assert "KV restored from ram" in caplog.text  # the line the load and resume benchmarks read
    assert follow_up.restored_from == "ram"
    assert follow_up.cached_tokens > 10


def test_a_state_restores_into_another_sequence_after_a_restart_and_not_across_sequence_counts(
        model_path: Path) -> None:
    """A state the batched engine saved restores into another instance (a restart) in another
    sequence and gives the same next token; a context with another sequence count refuses it (the
    stream count is part of llama.cpp's format), which the fingerprint keeps any store from offering."""
    first = BatchedLlamaEngine(options(model_path), sequences=2)
    lib, nv = first._lib, first._llm.n_vocab()
    tokens = first.tokenize("def reverse(s):\n    return s[::-1]\n\nprint(reverse(")

    def decode(engine: BatchedLlamaEngine, seq: int, chunk: list[int], pos: int) -> np.ndarray:
        batch = engine._batch.batch
        batch.n_tokens = engine._put(batch, 0, seq, chunk, pos, True)
        assert lib.llama_decode(engine._context.ctx, batch) == 0
        return np.ctypeslib.as_array(lib.llama_get_logits_ith(engine._context.ctx, len(chunk) - 1),
                                     shape=(nv,)).copy()

    decode(first, 0, tokens[:-1], 0)
    state = save_sequence(lib, first._context.ctx, 0, tokens[:-1], None)
    state = type(state)(state.tokens, bytes(state.blob))  # as the disk tier hands it back
    expected = decode(first, 0, tokens[-1:], len(tokens) - 1)
    fingerprint = first.fingerprint
    asyncio.run(first.close())

    again = BatchedLlamaEngine(options(model_path), sequences=2)
    assert again.fingerprint == fingerprint
    assert restore_sequence(lib, again._context.ctx, 1, state, again.n_ctx)
    got = decode(again, 1, tokens[-1:], len(tokens) - 1)
    asyncio.run(again.close())
    assert np.array_equal(got, expected)

    other = BatchedLlamaEngine(options(model_path), sequences=3)
    single = LlamaEngine(options(model_path))
    assert len({fingerprint, other.fingerprint, single.fingerprint}) == 3
    assert not restore_sequence(lib, other._context.ctx, 0, state, other.n_ctx)
    asyncio.run(other.close())
    asyncio.run(single.close())


def test_a_state_read_from_disk_does_not_stall_the_other_streams(model_path: Path, tmp_path: Path) -> None:
    """Issue 51, item 6: a turn whose state is on disk is admitted once the tier's I/O thread has
    read it; meanwhile the running answer keeps streaming (the read is slowed to 1.5 s here)."""
    from sessions.registry import SessionRegistry
    from sessions.store import SessionStore

    a, b, c, d = (ch * 64 for ch in "abcd")

    async def run() -> tuple[float, str]:
        probe = BatchedLlamaEngine(options(model_path), sequences=2)
        fingerprint = probe.fingerprint
        await probe.close()
        registry = SessionRegistry(SessionStore(tmp_path, fingerprint, 1, 1 << 30), 0, "off")  # RAM: none
        engine = BatchedLlamaEngine(options(model_path), registry, sequences=2)
        records = [await registry.get_or_create(sid, "", "test") for sid in (a, b, c, d)]  # held: their states persist
        await answer(engine, b, "Say hi.", 4)
        await asyncio.gather(answer(engine, c, "Say yes.", 4), answer(engine, d, "Say no.", 4))  # b leaves: to disk
        await asyncio.to_thread(registry.settle)
        assert registry.store.has_kv(b)
        load = registry.store.load_state

        def slow_load(session_id: str) -> Any:
            time.sleep(1.5)
            return load(session_id)

        registry.store.load_state = slow_load  # type: ignore[method-assign]
        prompt = await engine.prepare([Message("user", "Tell a long story about a lighthouse.")], [])
        stamps: list[float] = []
        resumed = asyncio.Event()

        async def long_answer() -> None:
            async for event in engine.stream(a, prompt, SamplingParams(max_tokens=120, temperature=0.0)):
                if isinstance(event, TextDelta):
                    stamps.append(time.monotonic())
                    if len(stamps) == 5:
                        resumed.set()

        async def resume_b() -> str:
            await resumed.wait()
            restored = ""
            p = await engine.prepare([Message("user", "Say hi.")], [])
            async for event in engine.stream(b, p, SamplingParams(max_tokens=4, temperature=0.0)):
                if isinstance(event, PrefillDone):
                    restored = event.restored_from
            return restored

        _, restored = await asyncio.gather(long_answer(), resume_b())
        await engine.close()
        registry.close()
        assert len(records) == 4
        return max(later - earlier for earlier, later in zip(stamps, stamps[1:])), restored

    longest_gap, restored = asyncio.run(run())
    assert restored == "disk"
    assert longest_gap < 1.0  # on the scheduler thread the read froze this stream for 1.5 s
