"""The engine interface the gateway talks to; the llama.cpp and upstream engines implement it."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from engine.constraints import Grammar, OutputConstraint
from policies.conversation_types import Finished, Message, ReasoningDelta, SamplingParams, TextDelta, ToolCallDelta, ToolSpec


class EngineBusy(Exception):
    """The request queue is full; the client should retry later."""

    def __init__(self, retry_after: int = 1) -> None:
        super().__init__("the engine queue is full")
        self.retry_after = retry_after


class EngineUnavailable(Exception):
    """The engine (e.g. an upstream server) cannot be reached."""


class PromptRejected(Exception):
    """The model's chat template refused the conversation (its raise_exception), even after the
    roles were normalised: a client error, not a server one."""


class EngineRejected(Exception):
    """The engine refused the request (an upstream's 4xx/5xx), with the status to pass on."""

    def __init__(self, status: int, message: str, code: str | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.code = code


@dataclass(frozen=True)
class PreparedPrompt:
    """A conversation rendered for one engine: what it will actually read."""

    messages: tuple[Message, ...]
    tools: tuple[ToolSpec, ...]
    n_tokens: int
    text: str | None = None
    tokens: tuple[int, ...] | None = field(default=None, repr=False)
    # What the answer must look like (tool_choice, parallel calls, response_format), and how this
    # engine enforces it: the grammar the in-process engine samples under. None with a
    # constraint set means the engine passes the constraint on (an upstream) or nothing is needed.
    constraint: OutputConstraint = OutputConstraint()
    grammar: Grammar | None = field(default=None, repr=False)
    # Token positions worth a prefix checkpoint: where the system prompt and tools end (what
    # every session, sub-agent spawn and side request of one agent shares).
    checkpoint_marks: tuple[int, ...] = ()

    @property
    def parses_tool_calls(self) -> bool:
        """Whether tool-call markup in the output becomes calls ("none" keeps any text as text)."""
        return bool(self.tools) and self.constraint.tool_choice != "none"


@dataclass(frozen=True)
class PrefillDone:
    """Prefill finished: the prompt's size and how much of it came from the cache."""

    prompt_tokens: int
    cached_tokens: int
    restored_from: str  # "context" | "ram" | "disk" | "checkpoint" | "none"
    checkpoint_tokens: int = 0  # of cached_tokens, those a shared prefix checkpoint brought


EngineEvent = PrefillDone | ReasoningDelta | TextDelta | ToolCallDelta | Finished


@dataclass(frozen=True)
class SavedState:
    """A session's KV state as the engine saved it: token ids it covers + opaque state bytes."""

    tokens: tuple[int, ...]
    blob: bytes | memoryview  # a writable memoryview (from the store) reaches llama.cpp without a copy


class StateTier(Protocol):
    """Where the engine puts a session's KV state when it switches to another session."""

    def stash(self, session_id: str, state: SavedState) -> None: ...

    def fetch(self, session_id: str) -> tuple[SavedState, str] | None:
        """The saved state and the tier it came from ("ram" | "disk"), or None."""
        ...

    def holding(self, session_id: str | None, tokens: int) -> None:
        """What the context holds now, told by the engine's worker after each turn (tier reporting)."""
        ...

    def holding_many(self, sessions: dict[str, int]) -> None:
        """The same for a context with several sequences: every session it holds, with its tokens."""
        ...

    def prefetch(self, session_id: str) -> None:
        """A turn for this session is coming: start reading its state from disk (a hint)."""
        ...

    def state_ready(self, session_id: str, wake: Callable[[], None]) -> bool:
        """Whether fetch() would return without waiting for a disk read; if not, the read starts
        and `wake` is called once it is done."""
        ...

    def buffer(self, n: int) -> Any:
        """A writable uint8 numpy array of `n` bytes to save a state into (memory the tier reuses)."""
        ...

    def persist(self, session_id: str, state: SavedState) -> None:
        """Write a copy of a state the context keeps to disk, in the background (crash resume)."""
        ...


class CheckpointTier(Protocol):
    """Prefix checkpoints shared by every session (sessions/checkpoints.py)."""

    def longest(self, tokens: Sequence[int], above: int = 0) -> int:
        """The longest checkpoint over `above` tokens that is a prefix of `tokens` (0: none)."""
        ...

    def longest_common(self, tokens: Sequence[int], rollback: int, above: int = 0) -> tuple[tuple[int, ...], int]:
        """The checkpoint (its tokens) sharing the longest prefix with `tokens`, cut back by at
        most `rollback`, and that prefix's length (((), 0): none over `above`)."""
        ...

    def has(self, tokens: Sequence[int]) -> bool: ...

    def load(self, tokens: Sequence[int]) -> tuple[SavedState, str] | None: ...

    def add(self, state: SavedState, origin: str, owner: str) -> None: ...


class Engine(Protocol):
    model_id: str
    n_ctx: int
    fingerprint: str

    def count_tokens(self, text: str) -> int: ...

    def prefetch(self, session_id: str) -> None:
        """A turn for this session is coming: start fetching its saved KV state, if any (a hint)."""
        ...

    def idle(self) -> bool:
        """No turn queued or running on this machine's cores (a scorer may use them all)."""
        ...

    async def prepare(
        self, messages: Sequence[Message], tools: Sequence[ToolSpec], constraint: OutputConstraint = OutputConstraint()
    ) -> PreparedPrompt:
        """Render the prompt; raises ConstraintError when `constraint` cannot be enforced."""
        ...

    def stream(self, session_id: str, prompt: PreparedPrompt, params: SamplingParams) -> AsyncIterator[EngineEvent]:
        """Yields PrefillDone once, then reasoning/text/tool-call deltas, then exactly one Finished."""
        ...

    async def start(self) -> None: ...

    async def close(self) -> None:
        """Finish or cancel the request in flight and hand every live state to the state tier."""
        ...

    def stats(self) -> dict[str, float]: ...
