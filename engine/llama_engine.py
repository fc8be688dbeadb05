"""The in-process llama.cpp engine: one Llama context, one worker thread, a bounded queue.

llama.cpp contexts are not thread-safe, so every call that touches the context runs on a single
worker thread; the event loop only enqueues jobs and relays events. One context serves one session
at a time: switching sessions stashes the current KV state (sequence-level state API, exact and
small) in the state tier and restores the target's, so a returning session prefills only its new
tokens.
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from collections.abc import AsyncIterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from engine.answer_text import AnswerText
from engine.base import (
    EngineBusy,
    EngineEvent,
    EngineUnavailable,
    PrefillDone,
    PreparedPrompt,
    PromptRejected,
    CheckpointTier,
    SavedState,
    StateTier,
)
from engine.chat_templates import ChatTemplate, ChatTemplateError, select_template
from engine.constraints import Grammar, OutputConstraint
from engine.grammar_cache import GrammarCache
from engine.grammar_sampler import GrammarSampler
from engine.llama_build import AMX_WARNING, amx_crash_risk, cpu_flags, system_info, unsupported_llama_cpp
from engine.llama_jobs import Job, RawDone, RawError
from engine.llama_relay import relay
from engine.loop_guard import LoopGuard
from engine.prefix_checkpoints import CheckpointOptions, PrefixCheckpoints, StartPoint, SystemMarks
from engine.seq_state import rollback_limits, restore_sequence, save_sequence
from policies.conversation_types import Message, SamplingParams, ToolSpec
from policies.roles import alternate_roles

log = logging.getLogger("pflash.engine")

_KV_TYPES = {"f16": 1, "q8_0": 8, "q4_0": 2}  # ggml_type ids
PERSIST_AFTER_S = 1.0  # idle this long after a turn, the session's state is written to disk


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
    checkpoints: CheckpointOptions = CheckpointOptions()
    persist_idle: bool = True  # when idle after a turn, its session's state goes to disk (crash resume)


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
        self._grammars = GrammarCache(llama_cpp, self._vocab, self.template.tool_format)
        arch = self._llm.metadata.get("general.architecture", "")
        window = int(self._llm.metadata.get(f"{arch}.attention.sliding_window", "0") or 0)
        self._max_rollback, self._restored_rollback = rollback_limits(window, options.n_ctx, options.n_ubatch,
                                                                      options.swa_full)
        self.fingerprint = "|".join(
            [options.model_sha256, str(options.n_ctx), options.cache_type_k, options.cache_type_v,
             f"swa_full={options.swa_full}", self.template.sha256]
        )
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="llama-worker")
        self._pending = 0
        self._jobs: set[Job] = set()  # queued or running: what a shutdown cancels
        self._closing = False
        self._current: str | None = None  # session whose KV the context holds
        self._persisted: tuple[str | None, int] = (None, 0)  # the context's state last written to disk
        self._counters: dict[str, float] = {
            "prefill_tokens_evaluated": 0, "prefill_tokens_reused": 0, "restore_failures": 0,
            "restores_ram": 0, "restores_disk": 0, "completion_tokens": 0, "prefix_reuse_refused": 0,
            "prefills_cancelled": 0, "states_kept_after_failure": 0, "repetition_stops": 0, "states_persisted": 0,
        }
        self._prefix = PrefixCheckpoints(llama_cpp, options.checkpoints, self._counters, self._restored_rollback)
        self._marks = SystemMarks(lambda head, tools: self.template.render(head, tools, add_generation_prompt=False),
                                  self.tokenize)
        log.info("chat template: %s (tools as %s, sha256 %s)", self.template.name, self.template.tool_format,
                 self.template.sha256[:12])

    def _llama_n_ctx(self, options: LlamaOptions) -> int:
        """The size of the context the high-level Llama opens (this engine decodes in it)."""
        return options.n_ctx

    def attach_tier(self, tier: StateTier) -> None:
        """The session registry needs our fingerprint to open its store, so it arrives late."""
        self._tier = tier

    def attach_checkpoints(self, tier: CheckpointTier) -> None:
        self._prefix.tier = tier

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
        marks = await asyncio.to_thread(self._marks.marks, messages, tools, tokens)
        return PreparedPrompt(tuple(messages), tuple(tools), len(tokens), text, tuple(tokens), constraint, grammar,
                              marks)

    def _grammar(self, constraint: OutputConstraint, tools: Sequence[ToolSpec]) -> Grammar | None:
        return self._grammars.get(constraint, tools)

    # --- lifecycle -------------------------------------------------------------------------------
    async def start(self) -> None:
        return None

    def cancel_all(self) -> int:
        """Shutdown: stop every queued or running turn at its next token (or prefill batch); their
        clients get the busy error or an error event, never a finished answer. How many."""
        self._closing = True
        jobs = list(self._jobs)
        for job in jobs:
            job.shutdown = True  # set first: the worker reads it once it sees the cancel
            job.cancelled.set()
        return len(jobs)

    async def close(self) -> None:
        """Let the job in flight end, then stash the live session's state in the tier."""
        self._closing = True
        await asyncio.get_running_loop().run_in_executor(self._executor, self._stash_current)
        self._executor.shutdown(wait=True)

    async def forget(self, session_id: str) -> None:
        """A deleted session: drop the KV the context holds for it (after its turn in flight)."""
        await asyncio.get_running_loop().run_in_executor(self._executor, self._forget, session_id)

    def _forget(self, session_id: str) -> None:
        if self._current == session_id:
            self._reset_context()

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
        job = Job(session_id, prompt.tokens, params, max_new, asyncio.get_running_loop(), grammar,
                  prompt.checkpoint_marks)
        self._pending += 1
        self._jobs.add(job)
        self._submit(job)
        return relay(job, prompt, self.template.tool_format)

    def _submit(self, job: Job) -> None:
        future = job.loop.run_in_executor(self._executor, self._run, job)
        future.add_done_callback(lambda _f: self._job_done(job))

    def _job_done(self, job: Job) -> None:
        self._pending -= 1
        self._jobs.discard(job)
        if self._pending == 0 and self._opts.persist_idle and not self._closing:
            job.loop.call_later(PERSIST_AFTER_S, self._persist_if_idle)

    def _persist_if_idle(self) -> None:
        """Still idle a while after a turn: the session's state goes to disk (crash resume)."""
        if self._pending == 0 and not self._closing:
            try:
                self._executor.submit(self._persist_current)
            except RuntimeError:  # shut down meanwhile: close() hands the state over itself
                pass

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
        tokens = list(job.tokens)
        start = self._start_point(tokens, self._switch_to(job.session_id, previous))
        reuse = start.reuse
        llm.n_tokens = reuse
        marks = self._prefix.positions(tokens, reuse, job.marks)
        started = time.perf_counter()
        at = reuse
        while at < len(tokens):
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
            end = min(at + self._opts.n_batch, next((m for m in marks if m > at), len(tokens)))
            llm.eval(tokens[at:end])
            at = end
            if at in marks:
                self._prefix.save(llm._ctx.ctx, 0, tokens[:at], job.marks, len(tokens), job.session_id)
        previous.clear()
        self._counters["prefill_tokens_evaluated"] += len(tokens) - reuse
        self._counters["prefill_tokens_reused"] += reuse
        log.debug("prefill %d tokens (%d reused) in %.3fs", len(tokens) - reuse, reuse, time.perf_counter() - started)
        job.emit(PrefillDone(len(tokens), reuse, start.restored_from, start.checkpoint_tokens))

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
        answer = AnswerText(job, self._opts.repeated_line_stop, llm.detokenize, self._ends_repeating)
        finish = "length"
        while answer.produced < job.max_new:
            if job.cancelled.is_set():
                finish = "cancelled"
                break
            token = guided.sample(llm._ctx.ctx) if guided else sampler.sample(llm._ctx, -1)
            if self._is_end(token):
                finish = "stop"
                break
            if (ended := answer.feed(token)) is not None:
                finish = ended
                break
            if answer.produced < job.max_new:
                llm.eval([token])  # keep the KV covering everything the client will send back
        self._counters["completion_tokens"] += answer.produced
        answer.finish(finish)

    def _start_point(self, tokens: list[int], restored_from: str) -> StartPoint:
        """The session's own state, or a longer shared checkpoint of the prompt's prefix."""
        llm = self._llm
        reuse = min(self._reusable_prefix(llm.input_ids[: llm.n_tokens], tokens, restored_from), len(tokens) - 1)
        return self._prefix.start(tokens, reuse, restored_from, self._restore)

    def _persist_current(self) -> None:
        current = (self._current, self._llm.n_tokens)
        if self._tier is not None and current[0] is not None and current[1] > 0 and current != self._persisted:
            self._persisted = current
            if (state := self._save_state()) is not None:
                self._tier.persist(current[0], state)
                self._counters["states_persisted"] += 1

    def _reusable_prefix(self, cached: Sequence[int], tokens: Sequence[int], restored_from: str) -> int:
        """How much of `cached` (what a sequence's KV covers, live or restored) the prompt `tokens` may keep."""
        limit = min(len(cached), len(tokens))
        common = 0
        while common < limit and cached[common] == tokens[common]:
            common += 1
        if len(cached) - common > (self._max_rollback if restored_from == "context" else self._restored_rollback):
            # Counted: after a restore this is a restore that did not save the prefill.
            self._counters["prefix_reuse_refused"] += 1
            log.info("prefix diverges %d tokens before the cache end: full prefill", len(cached) - common)
            return 0
        return common

    def _is_end(self, token: int) -> bool:
        return bool(self._lib.llama_vocab_is_eog(self._vocab, token) or self._lib.llama_vocab_is_control(self._vocab, token))

    def _ends_repeating(self, guard: LoopGuard, text: str, session_id: str) -> bool:
        """A loop (engine/loop_guard.py): the answer is done; counted by rule and logged."""
        if not guard.feed(text):
            return False
        self._counters["repetition_stops"] += 1
        self._counters[f"repetition_stops_{guard.reason}"] = self._counters.get(f"repetition_stops_{guard.reason}", 0) + 1
        log.info("session %s: answer ended in a loop (%s rule, %d repeats)", session_id[:12], guard.reason, guard.limit)
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
            if (state := self._save_state()) is not None:  # a failed copy: the next turn prefills
                self._tier.stash(self._current, state)
        self._reset_context()

    def _reset_context(self) -> None:
        self._llm._ctx.kv_cache_clear()
        self._llm.n_tokens = 0
        self._current = None

    def _save_state(self) -> SavedState | None:
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
