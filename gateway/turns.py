"""One turn, independent of the client's API: session → rewrite (kept-line maps, compression,
recall) → engine → record what was served.

Rules enforced here (DESIGN.md): history is re-rendered from the session's kept-line maps, byte
for byte, and never compressed anew; only one NEW message of the new turn that reaches the
threshold is compressed; any failure of the scorer serves the message whole.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field, replace

from engine.base import Engine, EngineEvent, PrefillDone, PreparedPrompt
from engine.scorers import Scorer
from gateway.errors import context_overflow
from policies.admission import admit
from policies.budget import parse_curve, token_budget
from policies.compression import plan_compression
from policies.conversation import Conversation, Finished, Message, TextDelta, ToolCall, ToolCallDelta
from policies.kept_lines import KeptLineMap, apply_kept_map, content_hash
from policies.rendering import split_lines
from policies.request_finding import find_request
from policies.segmentation import segment
from sessions.identity import SessionIdentity, resolve_session
from sessions.record import SessionRecord
from sessions.registry import SessionRegistry

log = logging.getLogger("pflash.turns")


@dataclass(frozen=True)
class CompressionSettings:
    threshold: int
    budget_curve: str
    min_segment: int
    max_segment: int
    request_tokens: int
    fallback_spread: float


@dataclass
class CompressionReport:
    compressed: bool
    reason: str
    scorer: str
    original_tokens: int
    kept_tokens: int
    scorer_seconds: float


@dataclass
class Turn:
    identity: SessionIdentity
    record: SessionRecord
    conversation: Conversation
    prompt: PreparedPrompt
    compression: CompressionReport | None = None
    restored_from: str | None = None  # known once prefill is done (non-stream headers carry it)
    started: float = field(default_factory=time.perf_counter)

    def headers(self) -> dict[str, str]:
        out = {"X-PFlash-Session": self.identity.session_id[:16]}
        if self.restored_from is not None:
            out["X-PFlash-Restored-From"] = self.restored_from
        if self.compression is not None:
            c = self.compression
            out.update({
                "X-PFlash-Compressed": "true" if c.compressed else "false",
                "X-PFlash-Compression-Reason": c.reason,
                "X-PFlash-Original-Tokens": str(c.original_tokens),
                "X-PFlash-Kept-Tokens": str(c.kept_tokens),
                "X-PFlash-Scorer": c.scorer,
                "X-PFlash-Scorer-Ms": f"{c.scorer_seconds * 1000:.1f}",
            })
        return out


class TurnService:
    def __init__(
        self, engine: Engine, registry: SessionRegistry, scorer: Scorer, settings: CompressionSettings
    ) -> None:
        self.engine = engine
        self.registry = registry
        self.scorer = scorer
        self.settings = settings
        self._curve = parse_curve(settings.budget_curve)
        self.counters: dict[str, float] = {}

    def _count(self, name: str, amount: float = 1) -> None:
        self.counters[name] = self.counters.get(name, 0) + amount

    async def prepare(self, conv: Conversation, tenant: str) -> Turn:
        identity = resolve_session(conv, tenant)
        record = self.registry.get_or_create(identity.session_id, tenant, identity.source)
        messages, report = await self.rewrite(conv.messages, record)
        prompt = await self.engine.prepare(messages, conv.tools)
        if prompt.n_tokens >= self.engine.n_ctx:
            raise context_overflow(prompt.n_tokens, self.engine.n_ctx)
        return Turn(identity, record, conv, prompt, report)

    async def rewrite(
        self, messages: Sequence[Message], record: SessionRecord
    ) -> tuple[tuple[Message, ...], CompressionReport | None]:
        """History from the kept-line maps; at most one new long message of this turn compressed."""
        served = [self._as_served(m, record) for m in messages]
        candidate = self._compression_candidate(messages, record)
        report = None
        if candidate is not None:
            index, tokens = candidate
            rewritten, report = await self._compress(messages, index, tokens, record)
            if rewritten is not None:
                served[index] = rewritten
        return tuple(served), report

    def _as_served(self, message: Message, record: SessionRecord) -> Message:
        kept = record.kept_maps.get(content_hash(message.content)) if message.role in ("tool", "user") else None
        if kept is None:
            return message
        try:
            return replace(message, content=apply_kept_map(message.content, kept))
        except ValueError as exc:  # cannot happen unless the map is corrupt; whole is always safe
            log.warning("kept-line map did not re-apply (%s): serving whole", exc)
            self._count("kept_map_failures")
            return message

    def _compression_candidate(self, messages: Sequence[Message], record: SessionRecord) -> tuple[int, int] | None:
        """The largest new message of the new turn (after the last assistant message), if admitted."""
        start = max((i for i, m in enumerate(messages) if m.role == "assistant"), default=-1) + 1
        seen = set(record.served_hashes) | set(record.kept_maps)
        best: tuple[int, int] | None = None
        for index in range(start, len(messages)):
            message = messages[index]
            if message.role not in ("tool", "user") or len(message.content) < self.settings.threshold:
                continue  # a token is at least one character: too short to ever reach the threshold
            tokens = self.engine.count_tokens(message.content)
            decision = admit(tokens, self.settings.threshold, content_hash(message.content) not in seen, message.role)
            if decision.compress and (best is None or tokens > best[1]):
                best = (index, tokens)
        return best

    async def _compress(
        self, messages: Sequence[Message], index: int, tokens: int, record: SessionRecord
    ) -> tuple[Message | None, CompressionReport]:
        message = messages[index]
        text = message.content
        lines = split_lines(text)
        count = self.engine.count_tokens
        line_tokens = [count(line) + 1 for line in lines]
        units = segment(lines, line_tokens, self.settings.min_segment, self.settings.max_segment)
        request = find_request(messages, index, count, self.settings.request_tokens)
        unit_texts = ["\n".join(lines[u.first : u.last + 1]) for u in units]
        started = time.perf_counter()
        scores: list[float] | None
        try:
            scores = await asyncio.to_thread(self.scorer.score, unit_texts, request.scored)
        except Exception as exc:  # a failing scorer never fails the request
            log.warning("scorer %s failed (%s): serving the message whole", self.scorer.name, exc)
            self._count("scorer_failures")
            scores = None
        elapsed = time.perf_counter() - started
        self._count("scorer_seconds", elapsed)
        plan = plan_compression(
            text, line_tokens, scores, units, token_budget(tokens, self._curve),
            request.pinned_lines, self.settings.fallback_spread,
        )
        report = CompressionReport(plan.compressed, plan.reason, self.scorer.name, tokens,
                                   count(plan.text) if plan.compressed else tokens, elapsed)
        self._count("compressions" if plan.compressed else "compression_fallbacks")
        if not plan.compressed:
            return None, report
        key = content_hash(text)
        record.kept_maps[key] = KeptLineMap(key, plan.kept_ranges, plan.total_tokens, plan.kept_tokens,
                                            content_hash(plan.text))
        record.map_labels[key] = _source_label(messages, index)
        return replace(message, content=plan.text), report

    def stream(self, turn: Turn) -> AsyncIterator[EngineEvent]:
        params = turn.conversation.params
        events = self.engine.stream(turn.identity.session_id, turn.prompt, params)
        return self._record_after(turn, events)

    async def _record_after(self, turn: Turn, events: AsyncIterator[EngineEvent]) -> AsyncIterator[EngineEvent]:
        text: list[str] = []
        calls: list[ToolCall] = []
        async for event in events:
            if isinstance(event, TextDelta):
                text.append(event.text)
            elif isinstance(event, ToolCallDelta):
                calls.append(event.call)
            elif isinstance(event, PrefillDone):
                turn.restored_from = event.restored_from
                self._count("prefill_tokens_reused", event.cached_tokens)
                self._count("prefill_tokens_evaluated", event.prompt_tokens - event.cached_tokens)
            elif isinstance(event, Finished):
                self._remember(turn, "".join(text), tuple(calls), event)
            yield event

    def _remember(self, turn: Turn, text: str, calls: tuple[ToolCall, ...], finished: Finished) -> None:
        record = turn.record
        served = [*turn.prompt.messages, Message("assistant", text, calls)]
        record.served_hashes = [content_hash(m.content) for m in served]
        record.transcript = [{"role": m.role, "content": m.content} for m in turn.prompt.messages]
        record.last_used = time.time()
        record.count("turns")
        record.count("prompt_tokens", finished.usage.prompt_tokens)
        record.count("cached_tokens", finished.usage.cached_tokens)
        record.count("completion_tokens", finished.usage.completion_tokens)
        self.registry.note_context(record.session_id, finished.usage.prompt_tokens + finished.usage.completion_tokens)


def _source_label(messages: Sequence[Message], index: int) -> str:
    """How recalled excerpts name their source: the tool call that produced it, else the index."""
    message = messages[index]
    if message.role == "tool" and message.tool_call_id:
        for earlier in messages[:index]:
            for call in earlier.tool_calls:
                if call.id == message.tool_call_id:
                    return f"the output of {call.name}({call.id})"
        return f"the output of {message.name or 'a tool'}({message.tool_call_id})"
    return f"earlier message {index + 1}"
