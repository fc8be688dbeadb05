"""The answer text both engines build token by token (engine/answer_text.py): a character split
across tokens, a stop sequence held back and cut, a loop ended, and the end reported once.
Model: none (tokens are byte strings)."""

from __future__ import annotations

import asyncio
from typing import Any

from engine.answer_text import AnswerText
from engine.llama_jobs import Job, RawDone, RawText
from engine.loop_guard import LoopGuard
from policies.conversation_types import SamplingParams

PIECES = {1: "caf".encode(), 2: "é".encode()[:1], 3: "é".encode()[1:], 4: b" END", 5: b"ok\n"}


def run(tokens: list[int], stop: tuple[str, ...] = (), repeated_line_stop: int = 0) -> tuple[str, RawDone, list[str]]:
    async def go() -> tuple[list[Any], list[str]]:
        job = Job("s", [], SamplingParams(stop=stop), 100, asyncio.get_running_loop())
        loops: list[str] = []

        def check(guard: LoopGuard, text: str, session: str) -> bool:
            if guard.feed(text):
                loops.append(session)
                return True
            return False

        answer = AnswerText(job, repeated_line_stop, lambda ts: b"".join(PIECES[t] for t in ts), check)
        reason = "length"
        for token in tokens:
            if (ended := answer.feed(token)) is not None:
                reason = ended
                break
        answer.finish(reason)
        await asyncio.sleep(0)
        events = []
        while not job.events.empty():
            events.append(job.events.get_nowait())
        return events, loops

    events, loops = asyncio.run(go())
    text = "".join(e.text for e in events if isinstance(e, RawText))
    (done,) = [e for e in events if isinstance(e, RawDone)]
    assert isinstance(events[-1], RawDone)
    return text, done, loops


def test_a_character_split_across_tokens_comes_out_whole() -> None:
    text, done, _ = run([1, 2, 3])
    assert text == "café" and done == RawDone("length", 3, None)


def test_a_stop_sequence_is_held_back_and_cut() -> None:
    text, done, _ = run([1, 2, 3, 4, 1], stop=(" END",))
    assert text == "café" and done == RawDone("stop", 4, " END")


def test_a_loop_ends_the_answer_as_a_stop() -> None:
    text, done, loops = run([5] * 40, repeated_line_stop=4)
    assert done.finish_reason == "stop" and done.completion_tokens < 40 and loops == ["s"]
    assert text.startswith("ok\nok\n")
