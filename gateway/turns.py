"""One turn, independent of the client's API: session → rewrite (kept-line maps, compression,
recall) → engine → record what was served.

Rules enforced here (README.md, "What it is"): history is re-rendered from the session's kept-line maps, byte
for byte, and never compressed anew; only one NEW message of the new turn that reaches the
threshold is compressed; any failure of the scorer serves the message whole.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from engine.base import Engine, EngineEvent, PrefillDone, PreparedPrompt, PromptRejected
from engine.constraints import ConstraintError, output_constraint
from engine.scoring.bundle import ScorerBundle
from gateway.background_embedding import BackgroundEmbedder
from gateway.branches import BranchRouter, BranchTurn, Forget
from gateway.compressor import CompressionReport, CompressionSettings, MessageCompressor
from gateway.errors import context_overflow, invalid
from gateway.recall import RecallGate, RecallReport, recalled_turn, turn_key
from policies.admission import COMPRESSIBLE_ROLES, ONE_SHOT_ROLES, admit
from policies.conversation_types import Conversation, Finished, Message, TextDelta, ToolCall, ToolCallDelta
from policies.kept_lines import KeptLineMap, apply_kept_map, content_hash
from policies.observations import is_tool_output, is_user_words
from sessions.identity import SessionIdentity, resolve_session
from sessions.record import SessionRecord
from sessions.registry import SessionRegistry

log = logging.getLogger("pflash.turns")


@dataclass
class Turn:
    identity: SessionIdentity
    branch: BranchTurn
    conversation: Conversation
    prompt: PreparedPrompt
    compression: CompressionReport | None = None
    recall: RecallReport | None = None
    restored_from: str | None = None  # known once prefill is done (non-stream headers carry it)
    checkpoint_tokens: int = 0  # of the cached tokens, those a shared prefix checkpoint brought
    started: float = field(default_factory=time.perf_counter)  # from prepare(): compression time counts
    first_output: float | None = None  # when the first text or tool-call event came

    @property
    def record(self) -> SessionRecord:
        """The branch's record: its kept-line maps, recall log and turn log."""
        return self.branch.record

    def headers(self) -> dict[str, str]:
        out = {"X-PFlash-Session": self.identity.session_id[:16], "X-PFlash-Branch": self.branch.label}
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
        if self.recall is not None:
            out["X-PFlash-Recall"] = "true" if self.recall.fired else "false"
            out["X-PFlash-Recall-Tokens"] = str(self.recall.added_tokens)
            out["X-PFlash-Recall-Share"] = f"{self.recall.peak_share:.4f}"
        return out


class TurnService:
    def __init__(
        self, engine: Engine, registry: SessionRegistry, scorers: ScorerBundle, settings: CompressionSettings,
        background: BackgroundEmbedder | None = None, forget: Forget | None = None,
    ) -> None:
        self.engine = engine
        self.registry = registry
        self.settings = settings
        self.background = background  # embeds a compressed message's units once its turn is served
        self.compressor = MessageCompressor(engine.count_tokens, scorers, settings)
        self.recall = RecallGate(self.compressor, settings.recall_theta, settings.recall_budget,
                                 settings.recall_context)
        self.branches = BranchRouter(registry, forget=forget)
        self.counters: dict[str, float] = {}

    def stats(self) -> dict[str, float]:
        """The turn counters with the branches', the recall gate's, the ranker's and the background
        encoder's (/metrics)."""
        out = {**self.counters, **self.branches.counters, **self.compressor.scorers.counters()}
        if self.background is not None:
            out.update(self.background.counters)
            out["background_pending"] = self.background.pending
        return out

    def _count(self, name: str, amount: float = 1) -> None:
        self.counters[name] = self.counters.get(name, 0) + amount

    async def prepare(self, conv: Conversation, tenant: str) -> Turn:
        """The turn's branch (held until `finish`), its rewritten history and its prompt."""
        started = time.perf_counter()
        identity = resolve_session(conv, tenant)
        branch = await self.branches.enter(conv, identity, tenant)
        try:
            record = branch.record
            self.engine.prefetch(record.session_id)  # a resume's disk read overlaps tokenizing below
            # Kept-line maps and recalls belong to their content: history that another branch of the
            # session served compressed (this conversation before its tools changed, before its branch
            # was dropped) is served the same here. A new message is cut for this turn's own request.
            history = conv.messages[: new_turn_start(conv.messages)]
            adopted = record.adopt(branch.root, {content_hash(m.content) for m in history},
                                   {turn_key(i, m.content) for i, m in enumerate(history)})
            if adopted:
                self._count("shared_maps_adopted", adopted)
            served = self._served_history(conv.messages, record)
            sizes = await asyncio.to_thread(self._new_long_messages, conv.messages, COMPRESSIBLE_ROLES)  # once, off the loop
            candidate = self._compression_candidate(conv.messages, record, sizes)
            # The prompt with the new messages whole, prepared once: a side request checks whether
            # it fits, a long new message whether any budget can make it fit; it is the turn's
            # prompt when nothing is compressed or recalled.
            whole = await self._prepare_prompt(served, conv) if branch.side or candidate is not None else None
            must_fit = branch.side and whole is not None and whole.n_tokens >= self.engine.n_ctx
            if not must_fit and whole is not None and candidate is not None:
                self._refuse_hopeless_overflow(whole, candidate[1])
            messages, report, recall = await self.rewrite(conv.messages, record, must_fit, served, sizes)
            prompt = whole if whole is not None and messages == served else await self._prepare_prompt(messages, conv)
            if prompt.n_tokens >= self.engine.n_ctx:
                raise context_overflow(prompt.n_tokens, self.engine.n_ctx)
        except BaseException:
            self.branches.release(branch)
            raise
        if branch.side:
            self._count("side_requests")
        return Turn(identity, branch, conv, prompt, report, recall, started=started)

    def finish(self, turn: Turn) -> None:
        """The turn is over (answered, failed or abandoned): the next turn of its branch may start."""
        self.branches.release(turn.branch)

    async def count(self, conv: Conversation, tenant: str) -> int:
        """The prompt's size as the model would read it, for count_tokens: history as served,
        new messages whole (an upper bound: no compression or recall is run). Changes no state:
        no session record is created, nothing is compressed, nothing is logged for recall."""
        record = await self.branches.find(conv, resolve_session(conv, tenant), tenant)
        messages = conv.messages if record is None else self._served_history(conv.messages, record)
        return (await self._prepare_prompt(messages, conv)).n_tokens

    async def _prepare_prompt(self, messages: Sequence[Message], conv: Conversation) -> PreparedPrompt:
        try:
            constraint = output_constraint(conv.tool_choice, conv.parallel_tool_calls, conv.response_format, conv.tools)
            return await self.engine.prepare(messages, conv.tools, constraint)
        except ConstraintError as exc:
            raise invalid(str(exc), exc.param) from None
        except PromptRejected as exc:
            raise invalid(f"the model's chat template refused this conversation: {exc}", "messages") from None

    def _served_history(self, messages: Sequence[Message], record: SessionRecord) -> tuple[Message, ...]:
        return tuple(recalled_turn(m, i, record) or self._as_served(m, record) for i, m in enumerate(messages))

    def _refuse_hopeless_overflow(self, whole: PreparedPrompt, tokens: int) -> None:
        """The overflow 400 before compression when even the smallest budget cannot make the
        prompt fit: no scorer time is spent and no kept-line map is stored for a refused turn."""
        floor = whole.n_tokens - tokens + math.ceil(tokens * self.compressor.smallest_keep_fraction)
        if floor >= self.engine.n_ctx:
            raise context_overflow(whole.n_tokens, self.engine.n_ctx)

    async def rewrite(
        self, messages: Sequence[Message], record: SessionRecord, must_fit: bool = False,
        served_history: Sequence[Message] | None = None, sizes: dict[int, int] | None = None,
    ) -> tuple[tuple[Message, ...], CompressionReport | None, RecallReport | None]:
        """History from the kept-line maps and recall log; at most one new long message of this
        turn compressed; a new question checked by the recall gate. `must_fit`: a one-shot side
        request that does not fit the context whole (Claude Code's safety classifier sends a
        ~141K-character system prompt): its system text may be cut too, and flat relevance is no
        reason to serve it whole, since whole cannot be served."""
        served = list(served_history if served_history is not None else self._served_history(messages, record))
        if sizes is None:
            sizes = await asyncio.to_thread(self._new_long_messages, messages, COMPRESSIBLE_ROLES)
        if must_fit:  # the system text may be cut too
            sizes = sizes | await asyncio.to_thread(self._new_long_messages, messages, ONE_SHOT_ROLES - COMPRESSIBLE_ROLES)
        candidate = self._compression_candidate(messages, record, sizes,
                                                ONE_SHOT_ROLES if must_fit else COMPRESSIBLE_ROLES)
        report = None
        if candidate is not None:
            index, tokens = candidate
            try:
                rewritten, report = await self._compress(messages, index, tokens, record, step_aside=not must_fit)
            except Exception as exc:  # like a scorer failure: compression never fails the request
                log.exception("compression failed (%s): message served whole", exc)
                self._count("compression_fallbacks:error")
                rewritten = None
            if rewritten is not None:
                served[index] = rewritten
        recall = None
        last = len(messages) - 1
        if self._is_new_question(messages, last, record) and (candidate is None or candidate[0] != last):
            try:
                result = await asyncio.to_thread(self.recall.rewrite, messages, last, record)
            except Exception as exc:  # like compression: a scorer failure never fails the request
                log.exception("recall gate failed (%s): question served as sent", exc)
                self._count("recall_failures")
                result = None
            if result is not None:
                served[last], recall = result
                self._count("recalls" if recall.fired else "recall_checks")
                self._count("recall_seconds", recall.seconds)  # /metrics: drafter time of the recall gate
        return tuple(served), report, recall

    @staticmethod
    def _is_new_question(messages: Sequence[Message], index: int, record: SessionRecord) -> bool:
        # A tool output sent as a user message asks nothing (policies/observations.py).
        if index < 0 or not is_user_words(messages[index]) or not record.kept_maps:
            return False
        return (content_hash(messages[index].content) not in record.served_hashes
                and recalled_turn(messages[index], index, record) is None)

    def _as_served(self, message: Message, record: SessionRecord) -> Message:
        kept = record.kept_maps.get(content_hash(message.content)) if message.role in ONE_SHOT_ROLES else None
        if kept is None:
            return message
        try:
            return replace(message, content=apply_kept_map(message.content, kept))
        except ValueError as exc:  # cannot happen unless the map is corrupt; whole is always safe
            log.warning("kept-line map did not re-apply (%s): serving whole", exc)
            self._count("kept_map_failures")
            return message

    def _new_long_messages(self, messages: Sequence[Message], roles: frozenset[str]) -> dict[int, int]:
        """Tokens of each message of `roles` in the new turn (after the last assistant message) long
        enough to reach the threshold. Runs in a worker thread: counting a long paste is the costly
        part of choosing what to compress."""
        start = new_turn_start(messages)
        return {index: self.engine.count_tokens(messages[index].content) for index in range(start, len(messages))
                # a token is at least one character: a shorter message never reaches the threshold
                if messages[index].role in roles and len(messages[index].content) >= self.settings.threshold}

    def _compression_candidate(self, messages: Sequence[Message], record: SessionRecord, sizes: dict[int, int],
                               roles: frozenset[str] = COMPRESSIBLE_ROLES) -> tuple[int, int] | None:
        """The largest new long message (`sizes`, from _new_long_messages) of `roles`, if admitted."""
        seen = record.seen_hashes()
        best: tuple[int, int] | None = None
        for index, tokens in sizes.items():
            message = messages[index]
            decision = admit(tokens, self.settings.threshold, content_hash(message.content) not in seen, message.role,
                             roles)
            if decision.compress and (best is None or tokens > best[1]):
                best = (index, tokens)
        return best

    async def _compress(
        self, messages: Sequence[Message], index: int, tokens: int, record: SessionRecord, step_aside: bool = True
    ) -> tuple[Message | None, CompressionReport]:
        plan, report = await asyncio.to_thread(self.compressor.compress, messages, index, tokens, None, step_aside)
        self._count("scorer_seconds", report.scorer_seconds)
        self._count("compression_tokens_in", report.original_tokens)  # /metrics: tokens in vs as served
        self._count("compression_tokens_out", report.kept_tokens)
        self._count("compressions" if plan.compressed else f"compression_fallbacks:{plan.reason.split(':')[0]}")
        log.info("compression %s: %s (%d -> %d tokens, scorer %s %.3fs)", "applied" if plan.compressed else "skipped",
                 plan.reason, report.original_tokens, report.kept_tokens, report.scorer, report.scorer_seconds)
        if not plan.compressed:
            return None, report
        message = messages[index]
        key = content_hash(message.content)
        features = self.compressor.scorers.features
        # Keep the model's reading with the session (recall, restarts); a background encoder has
        # read nothing yet, and stores its vectors once the turn is served.
        exported = features.export_features(report.unit_texts) if features is not None else {}
        kept = KeptLineMap(key, plan.kept_ranges, plan.total_tokens, plan.kept_tokens, content_hash(plan.text))
        record.add_kept_map(kept, _source_label(messages, index), exported)
        return replace(message, content=plan.text), report

    def stream(self, turn: Turn) -> AsyncIterator[EngineEvent]:
        params = turn.conversation.params
        events = self.engine.stream(turn.record.session_id, turn.prompt, params)
        return self._record_after(turn, events)

    async def _record_after(self, turn: Turn, events: AsyncIterator[EngineEvent]) -> AsyncIterator[EngineEvent]:
        text: list[str] = []
        calls: list[ToolCall] = []
        try:
            async for event in events:
                if isinstance(event, (TextDelta, ToolCallDelta)) and turn.first_output is None:
                    turn.first_output = time.perf_counter()
                if isinstance(event, TextDelta):
                    text.append(event.text)
                elif isinstance(event, ToolCallDelta):
                    calls.append(event.call)
                elif isinstance(event, PrefillDone):
                    turn.restored_from, turn.checkpoint_tokens = event.restored_from, event.checkpoint_tokens
                    self._count("prefill_tokens_reused", event.cached_tokens)
                    self._count("prefill_tokens_evaluated", event.prompt_tokens - event.cached_tokens)
                    self._check_reuse(turn, event)
                elif isinstance(event, Finished):
                    self._remember(turn, "".join(text), tuple(calls), event)
                    # Written ahead: the next turn renders its history from this record, so it is in
                    # the store before the client sees the end of this answer (and the session's
                    # list of branches with it).
                    await self.registry.save_record(turn.record)
                    if turn.branch.root is not turn.record:
                        await self.registry.save_record(turn.branch.root)
                yield event
        finally:
            # Closing this turn closes the engine's turn now (it stops at its next token), not
            # whenever the garbage collector finalizes the engine's generator. A turn that ends
            # early leaves the record as it was: only a Finished turn is remembered.
            aclose = getattr(events, "aclose", None)
            if aclose is not None:
                await aclose()
            self.finish(turn)  # then the branch's next turn may start
            if self.background is not None:
                if turn.compression is not None and turn.compression.compressed:
                    self.background.submit(turn.record, turn.compression.unit_texts)
                if turn.recall is not None and turn.recall.unembedded:
                    self.background.submit(turn.record, turn.recall.unembedded)

    def _check_reuse(self, turn: Turn, prefill: PrefillDone) -> None:
        """A turn that carries its branch's whole last request should find that prompt cached: one
        that does not was re-prefilled (its state lost, or pushed out by another conversation)."""
        lost = turn.branch.previous_prompt_tokens - prefill.cached_tokens
        if turn.branch.extends and lost > 0:
            self._count(f"branch_prefix_lost:{turn.branch.kind}")
            log.warning("session %s: %s branch re-prefilled %d tokens of its last prompt (restored from %s)",
                        turn.identity.session_id[:12], turn.branch.kind, lost, prefill.restored_from)

    def _remember(self, turn: Turn, text: str, calls: tuple[ToolCall, ...], finished: Finished) -> None:
        self.branches.served(turn.branch, finished.usage.prompt_tokens)
        sent = turn.conversation.messages  # kept maps go by content, recalled turns by position and content
        turn.record.forget_all_but({content_hash(m.content) for m in sent}
                                   | {turn_key(i, m.content) for i, m in enumerate(sent)})
        turn.branch.root.publish(turn.record)  # for every conversation of the session
        served = [*turn.prompt.messages, Message("assistant", text, calls)]
        usage = finished.usage
        turn.record.note_served(
            [content_hash(m.content) for m in served],
            [{"role": m.role, "content": m.content} for m in turn.prompt.messages],
            [("turns", 1), ("prompt_tokens", usage.prompt_tokens), ("cached_tokens", usage.cached_tokens),
             ("completion_tokens", usage.completion_tokens)],
            turn_log_entry(turn, finished),
            turn.identity.key if turn.identity.source != "prefix" else None,
        )


def new_turn_start(messages: Sequence[Message]) -> int:
    """Where this turn's new messages begin: after the last assistant message (before it: history)."""
    return max((i for i, m in enumerate(messages) if m.role == "assistant"), default=-1) + 1


def turn_log_entry(turn: Turn, finished: Finished) -> dict[str, Any]:
    """What the status page shows of one turn: plain types only (persisted with the record).
    Kept ranges and recalled lines are not copied: the kept-line map and recall log hold them."""
    usage = finished.usage
    first = turn.first_output if turn.first_output is not None else time.perf_counter()
    entry: dict[str, Any] = {
        "at": time.time(),
        "prompt_tokens": usage.prompt_tokens,
        "cached_tokens": usage.cached_tokens,
        "evaluated_tokens": usage.prompt_tokens - usage.cached_tokens,
        "completion_tokens": usage.completion_tokens,
        "ttft_ms": round((first - turn.started) * 1000, 1),
        "restored_from": turn.restored_from,
        "checkpoint_tokens": turn.checkpoint_tokens,
        "finish": finished.finish_reason,
    }
    if turn.compression is not None:
        c = turn.compression
        entry["compression"] = {"compressed": c.compressed, "reason": c.reason, "scorer": c.scorer,
                                "original_tokens": c.original_tokens, "kept_tokens": c.kept_tokens,
                                "scorer_ms": round(c.scorer_seconds * 1000, 1), "message": c.source_hash,
                                "lines": c.lines}
    if turn.recall is not None:
        r = turn.recall
        entry["recall"] = {"fired": r.fired, "reason": r.reason, "added_tokens": r.added_tokens,
                           "ms": round(r.seconds * 1000, 1), "turn": r.turn_hash}
    return entry


def _source_label(messages: Sequence[Message], index: int) -> str:
    """How recalled excerpts name their source: the tool call that produced it, else the index."""
    message = messages[index]
    if message.role == "tool" and message.tool_call_id:
        for earlier in messages[:index]:
            for call in earlier.tool_calls:
                if call.id == message.tool_call_id:
                    return f"the output of {call.name}({call.id})"
        return f"the output of {message.name or 'a tool'}({message.tool_call_id})"
    if is_tool_output(message):
        return f"the command output in earlier message {index + 1}"
    return f"earlier message {index + 1}"
