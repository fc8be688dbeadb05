"""A fake engine for fast tests of HTTP and session logic: no model, the same contract.

Like the in-process engine it holds one context: switching sessions stashes the current state in
the state tier and fetches the target's, and a turn reuses the longest common prefix of tokens.
A "token" is one whitespace-separated word of the rendered prompt; the prompt renders every
message as `<role> content` so tests can read exactly what was served.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Sequence

from engine.base import EngineEvent, PrefillDone, PreparedPrompt, SavedState, StateTier
from engine.constraints import OutputConstraint
from policies.conversation_types import Finished, Message, SamplingParams, TextDelta, ToolSpec, Usage


def render(messages: Sequence[Message], tools: Sequence[ToolSpec]) -> str:
    head = " ".join(f"<tool> {t.name}" for t in tools)
    return "\n".join([head, *(f"<{m.role}> {m.content}" for m in messages), "<assistant>"])


class FakeEngine:
    model_id = "fake"
    fingerprint = "fake-engine"

    def __init__(self, n_ctx: int = 100_000, answer: str = "ok") -> None:
        self.n_ctx = n_ctx
        self.answer = answer
        self.tier: StateTier | None = None
        self.current: str | None = None
        self.context: tuple[str, ...] = ()  # the words the context holds
        self.prompts: list[tuple[str, str]] = []  # (session, prompt text) of every turn, in order
        self.params: list[SamplingParams] = []  # what each turn was asked for
        self.running = 0

    def attach_tier(self, tier: StateTier) -> None:
        self.tier = tier

    def count_tokens(self, text: str) -> int:
        return len(text.split())

    def prefetch(self, session_id: str) -> None:
        return None

    def idle(self) -> bool:
        return self.running == 0

    async def prepare(self, messages: Sequence[Message], tools: Sequence[ToolSpec],
                      constraint: OutputConstraint = OutputConstraint()) -> PreparedPrompt:
        text = render(messages, tools)
        words = tuple(text.split())
        return PreparedPrompt(tuple(messages), tuple(tools), len(words), text, tuple(range(len(words))), constraint)

    def stream(self, session_id: str, prompt: PreparedPrompt, params: SamplingParams) -> AsyncIterator[EngineEvent]:
        self.params.append(params)
        return self._turn(session_id, prompt)

    async def _turn(self, session_id: str, prompt: PreparedPrompt) -> AsyncIterator[EngineEvent]:
        self.running += 1
        try:
            restored = self._switch_to(session_id)
            words = tuple((prompt.text or "").split())
            cached = 0
            while cached < min(len(words), len(self.context)) and words[cached] == self.context[cached]:
                cached += 1
            await asyncio.sleep(0)  # a real turn yields to the loop while it prefills
            self.context = (*words, *self.answer.split())
            self.prompts.append((session_id, prompt.text or ""))
            yield PrefillDone(len(words), cached, restored)
            yield TextDelta(self.answer)
            yield Finished("stop", Usage(len(words), len(self.answer.split()), cached))
        finally:
            self.running -= 1

    def _switch_to(self, session_id: str) -> str:
        if self.current == session_id:
            return "context"
        if self.tier is not None and self.current is not None and self.context:
            self.tier.stash(self.current, SavedState(tuple(range(len(self.context))), " ".join(self.context).encode()))
        self.current, self.context = session_id, ()
        found = self.tier.fetch(session_id) if self.tier is not None else None
        if found is None:
            return "none"
        state, tier = found
        self.context = tuple(bytes(state.blob).decode().split())
        return tier

    async def start(self) -> None:
        return None

    async def close(self) -> None:
        if self.tier is not None and self.current is not None and self.context:
            self.tier.stash(self.current, SavedState(tuple(range(len(self.context))), " ".join(self.context).encode()))
        self.current, self.context = None, ()

    def stats(self) -> dict[str, float]:
        return {"queue_depth": float(self.running)}
