"""The event loop's side of an in-process turn: the worker's raw text becomes reasoning, answer text
and tool calls, and its end one Finished (both llama.cpp engines)."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterable, Iterator

from engine.base import EngineEvent, EngineUnavailable, PrefillDone, PreparedPrompt
from engine.llama_jobs import Job, RawDone, RawError, RawText
from engine.reasoning import ReasoningSplitter, prompt_opens_reasoning
from engine.tool_parsers import ToolCallStream, parser_for
from policies.conversation_types import Finished, ReasoningDelta, TextDelta, ToolCallDelta, Usage


async def relay(job: Job, prompt: PreparedPrompt, tool_format: str) -> AsyncIterator[EngineEvent]:
    """A turn's raw events from the worker as engine events: reasoning split from the answer,
    tool-call markup parsed into calls, and one Finished with the usage."""
    tool_stream = ToolCallStream(parser_for(tool_format)) if prompt.parses_tool_calls else None
    # parallel_tool_calls=false: the grammar already allows one call; this also covers output
    # it cannot shape (Llama 3's bare JSON calls in prose).
    single_call = not prompt.constraint.parallel_tool_calls
    # Reasoning markup comes out first; only the answer text is searched for tool calls.
    reasoning = ReasoningSplitter(prompt_opens_reasoning(prompt.text or ""))

    def allowed(events: Iterable[EngineEvent]) -> Iterator[EngineEvent]:
        return (e for e in events if not (single_call and isinstance(e, ToolCallDelta) and e.index > 0))

    def answer(events: list[ReasoningDelta | TextDelta]) -> Iterator[EngineEvent]:
        for event in events:
            if isinstance(event, ReasoningDelta) or tool_stream is None:
                yield event
            else:
                yield from allowed(tool_stream.feed(event.text))

    cached = 0
    try:
        while True:
            raw = await job.events.get()
            if isinstance(raw, PrefillDone):
                cached = raw.cached_tokens
                yield raw
            elif isinstance(raw, RawText):
                for event in answer(reasoning.feed(raw.text)):
                    yield event
            elif isinstance(raw, RawError):
                raise raw.error
            elif isinstance(raw, RawDone):
                if raw.finish_reason == "cancelled" and job.shutdown:
                    # Cut by a shutdown: an error (busy, Retry-After) the agent retries, not an answer.
                    raise EngineUnavailable("the server is shutting down; retry")
                for event in answer(reasoning.finish()):
                    yield event
                has_calls = False
                if tool_stream:
                    for event in allowed(tool_stream.finish()):
                        yield event
                    has_calls = tool_stream.has_tool_calls
                reason = "tool_calls" if has_calls else ("length" if raw.finish_reason == "length" else "stop")
                usage = Usage(prompt.n_tokens, raw.completion_tokens, cached)
                yield Finished(reason, usage, raw.stop_sequence)  # type: ignore[arg-type]
                return
    finally:
        job.cancelled.set()  # a client that went away stops the worker at the next token
