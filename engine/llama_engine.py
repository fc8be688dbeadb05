"""The in-process llama.cpp engine: one Llama context, one worker thread, a bounded queue.

llama.cpp contexts are not thread-safe, so every call that touches the context runs on a single
worker thread; the event loop only enqueues jobs and relays events. One context serves one session
at a time: switching sessions stashes the current KV state (sequence-level state API, exact and
small) in the state tier and restores the target's, so a returning session prefills only its new
tokens.
"""

from __future__ import annotations

import asyncio
import codecs
import logging
import os
import time
from collections.abc import AsyncIterator, Iterable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from engine.base import (
    EngineBusy,
    EngineEvent,
    EngineUnavailable,
    PrefillDone,
    PreparedPrompt,
    PromptRejected,
    SavedState,
    StateTier,
)
from engine.chat_templates import ChatTemplate, ChatTemplateError, select_template
from engine.constraints import ConstraintError, Grammar, OutputConstraint, grammar_for
from engine.grammar_sampler import GrammarSampler
from engine.llama_jobs import Job, RawDone, RawError, RawText
from engine.llama_build import AMX_WARNING, amx_crash_risk, cpu_flags, system_info, unsupported_llama_cpp
from engine.loop_guard import LoopGuard
from engine.reasoning import ReasoningSplitter, prompt_opens_reasoning
from engine.seq_state import restore_sequence, save_sequence
from engine.stops import StopMatcher
from engine.tool_parsers import ToolCallStream, parser_for
from policies.conversation_types import Finished, Message, ReasoningDelta, SamplingParams, TextDelta, ToolCallDelta, ToolSpec, Usage
from policies.roles import alternate_roles

log = logging.getLogger("pflash.engine")

_KV_TYPES = {"f16": 1, "q8_0": 8, "q4_0": 2}  # ggml_type ids


@dataclass(frozen=True)
class LlamaOptions:
    model_path: Path
    model_sha256: str
    n_ctx: int = 32768
    n_threads: int | None = None
    n_batch: int = 512
    n_ubatch: int = 512
    n_gpu_layers: int = -1
    main_gpu: int = 0
    flash_attn: bool = False
    swa_full: bool = False
    cache_type_k: str = "f16"
    cache_type_v: str = "f16"
    chat_template: str | None = None
    seed: int = 0
    queue_size: int = 16
    repeated_line_stop: int = 0  # an answer repeating one line this many times ends (0: never)


class LlamaEngine:
    def __init__(self, options: LlamaOptions, tier: StateTier | None = None) -> None:
        import llama_cpp  # imported here so the rest of the gateway works without it

        problem = unsupported_llama_cpp(str(getattr(llama_cpp, "__version__", "?")))
        if problem is not None:
            raise RuntimeError(problem)
        self._lib = llama_cpp
        self._opts = options
        self._tier = tier
        self.n_ctx = options.n_ctx
        self.model_id = options.model_path.name
        self._llm = llama_cpp.Llama(
            model_path=str(options.model_path),
            n_ctx=self._llama_n_ctx(options),
            n_threads=options.n_threads or os.cpu_count() or 1,
            n_threads_batch=options.n_threads or os.cpu_count() or 1,
            n_batch=options.n_batch,
            n_ubatch=options.n_ubatch,
            n_gpu_layers=options.n_gpu_layers,
            main_gpu=options.main_gpu,
            flash_attn=options.flash_attn,
            swa_full=options.swa_full,
            type_k=_KV_TYPES[options.cache_type_k],
            type_v=_KV_TYPES[options.cache_type_v],
            seed=options.seed,
            verbose=False,
        )
        if amx_crash_risk(cpu_flags(), system_info()):
            log.warning(AMX_WARNING)
        self._vocab = llama_cpp.llama_model_get_vocab(self._llm.model)
        self.template: ChatTemplate = select_template(self._llm.metadata, options.chat_template)
        arch = self._llm.metadata.get("general.architecture", "")
        window = int(self._llm.metadata.get(f"{arch}.attention.sliding_window", "0") or 0)
        # With a small sliding-window cache, rolling the cache back further than the retained
        # window silently corrupts the SWA layers (tests/test_agent_errors_e2e.py depends on it): reuse only short rollbacks.
        self._max_rollback = (
            options.n_ctx if options.swa_full or window == 0 else max(0, min(window, options.n_ubatch) // 2)
        )
        self.fingerprint = "|".join(
            [options.model_sha256, str(options.n_ctx), options.cache_type_k, options.cache_type_v,
             f"swa_full={options.swa_full}", self.template.sha256]
        )
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="llama-worker")
        self._pending = 0
        self._jobs: set[Job] = set()  # queued or running: what a shutdown cancels
        self._closing = False
        self._current: str | None = None  # session whose KV the context holds
        self._counters: dict[str, float] = {
            "prefill_tokens_evaluated": 0, "prefill_tokens_reused": 0, "restore_failures": 0,
            "restores_ram": 0, "restores_disk": 0, "completion_tokens": 0, "prefix_reuse_refused": 0,
            "prefills_cancelled": 0, "states_kept_after_failure": 0, "repetition_stops": 0,
        }
        log.info("chat template: %s (tools as %s, sha256 %s)", self.template.name, self.template.tool_format,
                 self.template.sha256[:12])

    def _llama_n_ctx(self, options: LlamaOptions) -> int:
        """The size of the context the high-level Llama opens (this engine decodes in it)."""
        return options.n_ctx

    def attach_tier(self, tier: StateTier) -> None:
        """The session registry needs our fingerprint to open its store, so it arrives late."""
        self._tier = tier

    def prefetch(self, session_id: str) -> None:
        # Read off the worker thread without its lock: a stale `_current` costs at worst one
        # unneeded read ahead, never a wrong state (the worker still decides what to restore).
        if self._tier is not None and not self._resident(session_id):
            self._tier.prefetch(session_id)

    def _resident(self, session_id: str) -> bool:
        return self._current == session_id

    # --- tokens ----------------------------------------------------------------------------------
    def tokenize(self, text: str, add_bos: bool = True) -> list[int]:
        return self._llm.tokenize(text.encode("utf-8"), add_bos=add_bos, special=True)

    def count_tokens(self, text: str) -> int:
        return len(self._llm.tokenize(text.encode("utf-8"), add_bos=False, special=False))

    def render(self, messages: Sequence[Message], tools: Sequence[ToolSpec]) -> str:
        """The prompt text; a template that refuses the conversation as sent (roles must
        alternate, ...) gets it with normalised roles, and a second refusal is PromptRejected."""
        try:
            return self.template.render(messages, tools, add_generation_prompt=True)
        except ChatTemplateError:
            pass
        try:
            return self.template.render(alternate_roles(messages), tools, add_generation_prompt=True)
        except ChatTemplateError as exc:
            raise PromptRejected(str(exc)) from exc

    async def prepare(
        self, messages: Sequence[Message], tools: Sequence[ToolSpec], constraint: OutputConstraint = OutputConstraint()
    ) -> PreparedPrompt:
        # The tools stay in the prompt even under tool_choice "none": the rendered system text, and
        # so the KV prefix the session has cached, must not depend on one turn's choice. The
        # grammar forbids the call markup instead (engine.constraints).
        # Rendering (Jinja) and tokenizing a long prompt take milliseconds to seconds: off the loop.
        text = await asyncio.to_thread(self.render, messages, tools)
        grammar = await asyncio.to_thread(self._grammar, constraint, tools)
        tokens = await asyncio.to_thread(self.tokenize, text)
        return PreparedPrompt(tuple(messages), tuple(tools), len(tokens), text, tuple(tokens), constraint, grammar)

    def _grammar(self, constraint: OutputConstraint, tools: Sequence[ToolSpec]) -> Grammar | None:
        """The constraint's grammar, checked by llama.cpp's own parser (a failure is the client's 400)."""
        grammar = grammar_for(constraint, tools, self.template.tool_format)
        if grammar is None:
            return None
        sampler = self._lib.llama_sampler_init_grammar(self._vocab, grammar.text.encode("utf-8"), b"root")
        if not sampler:  # NULL: llama.cpp could not parse it (e.g. a schema pattern it cannot express)
            param = "response_format" if constraint.response_format else "tools"
            raise ConstraintError("llama.cpp cannot compile the grammar for this output constraint", param)
        self._lib.llama_sampler_free(sampler)
        return grammar

    # --- lifecycle -------------------------------------------------------------------------------
    async def start(self) -> None:
        return None

    def cancel_all(self) -> int:
        """Shutdown: refuse new turns and stop every queued or running one at its next token (or
        prefill batch); their clients get what was generated so far. Returns how many."""
        self._closing = True
        jobs = list(self._jobs)
        for job in jobs:
            job.cancelled.set()
        return len(jobs)

    async def close(self) -> None:
        """Let the job in flight end, then stash the live session's state in the tier."""
        self._closing = True
        await asyncio.get_running_loop().run_in_executor(self._executor, self._stash_current)
        self._executor.shutdown(wait=True)

    def stats(self) -> dict[str, float]:
        return {**self._counters, "queue_depth": self._pending}

    def idle(self) -> bool:
        return self._pending == 0

    # --- generation ------------------------------------------------------------------------------
    def stream(self, session_id: str, prompt: PreparedPrompt, params: SamplingParams) -> AsyncIterator[EngineEvent]:
        """Queue a turn (EngineBusy at once if the queue is full) and return its events."""
        if self._closing:
            raise EngineBusy(retry_after=5)
        if self._pending >= self._opts.queue_size:
            raise EngineBusy(retry_after=max(1, self._pending // 2))
        assert prompt.tokens is not None
        room = self.n_ctx - prompt.n_tokens
        max_new = min(params.max_tokens or room, room)
        grammar = prompt.grammar.text if prompt.grammar else None
        if prompt.grammar:
            log.info("session %s: output constrained to %s", session_id[:12], prompt.grammar.enforces)
        job = Job(session_id, prompt.tokens, params, max_new, asyncio.get_running_loop(), grammar)
        self._pending += 1
        self._jobs.add(job)
        self._submit(job)
        return self._relay(job, prompt)

    def _submit(self, job: Job) -> None:
        future = job.loop.run_in_executor(self._executor, self._run, job)
        future.add_done_callback(lambda _f: self._job_done(job))

    async def _relay(self, job: Job, prompt: PreparedPrompt) -> AsyncIterator[EngineEvent]:
        tool_stream = ToolCallStream(parser_for(self.template.tool_format)) if prompt.parses_tool_calls else None
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

    def _job_done(self, job: Job) -> None:
        self._pending -= 1
        self._jobs.discard(job)

    # --- worker thread ---------------------------------------------------------------------------
    def _run(self, job: Job) -> None:
        if job.cancelled.is_set():
            job.emit(RawDone("cancelled", 0, None))
            return
        if self._closing:  # queued turns are not started once shutdown begins; the client may retry
            job.emit(RawError(EngineUnavailable("the server is shutting down")))
            return
        previous: list[SavedState] = []  # the state restored for this job, until its prefill succeeds
        try:
            self._generate(job, previous)
        except Exception as exc:  # the context may be inconsistent: drop it, keep serving
            log.exception("engine failure for session %s", job.session_id[:12])
            self._reset_context()
            if previous and self._tier is not None:
                # What the session had before this turn is still exact: back to the tier, so a
                # retry prefills only its new tokens instead of everything.
                self._tier.stash(job.session_id, previous[0])
                self._counters["states_kept_after_failure"] += 1
            job.emit(RawError(exc))
        finally:
            if self._tier is not None:
                self._tier.holding(self._current, self._llm.n_tokens if self._current else 0)

    def _generate(self, job: Job, previous: list[SavedState]) -> None:
        llm = self._llm
        restored_from = self._switch_to(job.session_id, previous)
        tokens = list(job.tokens)
        reuse = min(self._reusable_prefix(llm.input_ids[: llm.n_tokens], tokens), len(tokens) - 1)  # the last token yields logits
        llm.n_tokens = reuse
        started = time.perf_counter()
        for at in range(reuse, len(tokens), self._opts.n_batch):
            if job.cancelled.is_set():
                # The context holds the restored state plus whole batches of this prompt: exact,
                # so it stays, and a retry of the turn prefills only what was not reached.
                llm._ctx.kv_cache_seq_rm(-1, llm.n_tokens, -1)  # nothing past it: a later save stays exact
                self._counters["prefills_cancelled"] += 1
                self._counters["prefill_tokens_evaluated"] += at - reuse
                log.info("session %s: prefill cancelled at %d of %d tokens; the context keeps them",
                         job.session_id[:12], at, len(tokens))
                job.emit(RawDone("cancelled", 0, None))
                return
            llm.eval(tokens[at : at + self._opts.n_batch])
        previous.clear()
        self._counters["prefill_tokens_evaluated"] += len(tokens) - reuse
        self._counters["prefill_tokens_reused"] += reuse
        log.debug("prefill %d tokens (%d reused) in %.3fs", len(tokens) - reuse, reuse, time.perf_counter() - started)
        job.emit(PrefillDone(len(tokens), reuse, restored_from))

        llm.set_seed(job.params.seed if job.params.seed is not None else self._opts.seed)
        sampler = llm._init_sampler(temp=job.params.temperature, top_p=job.params.top_p)
        guided = GrammarSampler(self._lib, self._vocab, llm.n_vocab(), sampler.sampler, job.grammar) if job.grammar else None
        try:
            self._sample_loop(job, sampler, guided)
        finally:
            if guided is not None:
                guided.close()

    def _sample_loop(self, job: Job, sampler: Any, guided: GrammarSampler | None) -> None:
        llm = self._llm
        decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        stops = StopMatcher(job.params.stop)
        loop = LoopGuard(self._opts.repeated_line_stop)
        produced = 0
        finish = "length"
        while produced < job.max_new:
            if job.cancelled.is_set():
                finish = "cancelled"
                break
            token = guided.sample(llm._ctx.ctx) if guided else sampler.sample(llm._ctx, -1)
            if self._is_end(token):
                finish = "stop"
                break
            produced += 1
            text = stops.feed(decoder.decode(llm.detokenize([token])))
            if text:
                job.emit(RawText(text))
            if stops.hit is not None:
                finish = "stop"
                break
            if self._ends_repeating(loop, text, job.session_id):
                finish = "stop"
                break
            if produced < job.max_new:
                llm.eval([token])  # keep the KV covering everything the client will send back
        tail = stops.feed(decoder.decode(b"", final=True)) + stops.flush()
        if tail:
            job.emit(RawText(tail))
        self._counters["completion_tokens"] += produced
        job.emit(RawDone(finish, produced, stops.hit))

    def _reusable_prefix(self, cached: Sequence[int], tokens: Sequence[int]) -> int:
        """How much of `cached` (what a sequence's KV covers) the prompt `tokens` may keep."""
        limit = min(len(cached), len(tokens))
        common = 0
        while common < limit and cached[common] == tokens[common]:
            common += 1
        if len(cached) - common > self._max_rollback:
            # Counted: after a restore this is a restore that did not save the prefill.
            self._counters["prefix_reuse_refused"] += 1
            log.info("prefix diverges %d tokens before the cache end: full prefill", len(cached) - common)
            return 0
        return common

    def _is_end(self, token: int) -> bool:
        return bool(self._lib.llama_vocab_is_eog(self._vocab, token) or self._lib.llama_vocab_is_control(self._vocab, token))

    def _ends_repeating(self, guard: LoopGuard, text: str, session_id: str) -> bool:
        """One line over and over: the answer is done (engine/loop_guard.py); counted and logged."""
        if not guard.feed(text):
            return False
        self._counters["repetition_stops"] += 1
        log.info("session %s: answer ended after one line repeated %d times", session_id[:12], guard.limit)
        return True

    def _switch_to(self, session_id: str, previous: list[SavedState]) -> str:
        if self._current == session_id:
            return "context"
        self._stash_current()
        self._current = session_id
        started = time.perf_counter()  # fetch (disk read, zstd) + restore: what a resume costs
        found = self._tier.fetch(session_id) if self._tier else None
        if found is None:
            return "none"
        state, tier_name = found
        fetched = time.perf_counter()
        if self._restore(state):
            previous.append(state)
            self._restored(session_id, state, tier_name, started, fetched)
            return tier_name
        self._counters["restore_failures"] += 1
        log.warning("KV restore for session %s failed: full prefill", session_id[:12])
        self._reset_context()
        self._current = session_id
        return "none"

    def _restored(self, session_id: str, state: SavedState, tier_name: str, started: float, fetched: float) -> None:
        """Counted and logged in one format (the benchmarks read the line)."""
        self._counters[f"restores_{tier_name}"] += 1
        now = time.perf_counter()
        log.info("session %s: KV restored from %s (%d tokens, %.1f MB) in %.3f s (fetch %.3f s, restore %.3f s)",
                 session_id[:12], tier_name, len(state.tokens), len(state.blob) / 1e6, now - started,
                 fetched - started, now - fetched)

    def _stash_current(self) -> None:
        if self._tier and self._current is not None and self._llm.n_tokens > 0:
            self._tier.stash(self._current, self._save_state())
        self._reset_context()

    def _reset_context(self) -> None:
        self._llm._ctx.kv_cache_clear()
        self._llm.n_tokens = 0
        self._current = None

    def _save_state(self) -> SavedState:
        return save_sequence(self._lib, self._llm._ctx.ctx, 0, self._llm.input_ids[: self._llm.n_tokens], self._tier)

    def _restore(self, state: SavedState) -> bool:
        llm = self._llm
        llm._ctx.kv_cache_clear()
        if not restore_sequence(self._lib, llm._ctx.ctx, 0, state, self.n_ctx):
            return False
        n = len(state.tokens)
        llm.input_ids[:n] = state.tokens
        llm.n_tokens = n
        return True
