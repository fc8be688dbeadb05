"""What the event loop and the engine's worker thread pass each other: a turn's job, and the raw
events the worker emits for it (text pieces, the end, an error), relayed on the loop."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from policies.conversation_types import SamplingParams


@dataclass(eq=False)  # hashed by identity: the engine keeps a set of live jobs
class Job:
    session_id: str
    tokens: Sequence[int]
    params: SamplingParams
    max_new: int
    loop: asyncio.AbstractEventLoop
    grammar: str | None = None  # GBNF every sampled token must fit
    marks: tuple[int, ...] = ()  # where the prompt's system prompt and tools end (checkpoint marks)
    events: asyncio.Queue[Any] = field(default_factory=asyncio.Queue)
    cancelled: threading.Event = field(default_factory=threading.Event)
    shutdown: bool = False  # cancelled because the server stops: the client is told to retry

    def emit(self, event: Any) -> None:
        self.loop.call_soon_threadsafe(self.events.put_nowait, event)


@dataclass(frozen=True)
class RawText:
    text: str


@dataclass(frozen=True)
class RawDone:
    finish_reason: str  # "stop" | "length" | "cancelled"
    completion_tokens: int
    stop_sequence: str | None


@dataclass(frozen=True)
class RawError:
    error: BaseException
