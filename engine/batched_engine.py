"""The in-process llama.cpp engine with several sequences in one context, decoded together.

One context holds up to `sequences` sessions' KV, each sequence in its own stream of `n_ctx` cells
(any session may use the whole context; a token reads only its own session's cells). A session stays
bound to its sequence after its turn, so its next turn reuses its prefix; a sequence another session
needs is stashed to the state tier first (least recently used). One scheduler thread owns the
context: each step decodes one llama_batch with the next token of every answering turn and, in the
room left (`n_batch`), prompt chunks of the turns still prefilling, oldest first. A long prefill, or
a state read from disk (a turn is admitted once its state is read), never freezes the other streams;
several answers cost little more per step than one. The single-sequence engine's rollback rules hold.
"""

from __future__ import annotations

import asyncio
import collections
import ctypes
import logging
import threading
import time
from typing import Any

from engine.answer_text import AnswerText
from engine.base import EngineUnavailable, PrefillDone, SavedState, StateTier
from engine.batch_plan import plan_step
from engine.batch_slot import Slot
from engine.grammar_sampler import GrammarSampler
from engine.llama_engine import PERSIST_AFTER_S, LlamaEngine, LlamaOptions
from engine.llama_jobs import Job, RawDone, RawError
from engine.seq_state import restore_sequence, save_sequence

log = logging.getLogger("pflash.engine")


class BatchedLlamaEngine(LlamaEngine):
    def __init__(self, options: LlamaOptions, tier: StateTier | None = None, sequences: int = 4) -> None:
        self.sequences = max(1, sequences)
        if self.sequences > options.n_batch:  # a step holds one token of every answering sequence
            raise ValueError(f"sequences ({self.sequences}) must not exceed n_batch ({options.n_batch})")
        super().__init__(options, tier)
        lib = self._lib
        params = lib.llama_context_default_params()
        ctypes.memmove(ctypes.byref(params), ctypes.byref(self._llm.context_params), ctypes.sizeof(params))
        params.n_ctx = options.n_ctx * self.sequences  # llama.cpp gives each stream n_ctx / n_seq_max
        params.n_seq_max = self.sequences
        params.kv_unified = False
        from llama_cpp import _internals

        self._context = _internals.LlamaContext(model=self._llm._model, params=params, verbose=False)
        self._batch = _internals.LlamaBatch(n_tokens=options.n_batch, embd=0, n_seq_max=1, verbose=False)
        self._memory = lib.llama_get_memory(self._context.ctx)
        # A sequence's saved state records the context's stream count: it restores only where that matches.
        self.fingerprint += f"|sequences={self.sequences}"
        self._slots = [Slot(seq) for seq in range(self.sequences)]
        self._waiting: collections.deque[Job] = collections.deque()
        self._forgetting: list[tuple[str, asyncio.Future[None]]] = []  # deleted sessions to drop
        self._wake = threading.Condition()
        self._stopping = False
        self._counters.update({"batch_steps": 0, "batch_tokens": 0, "sequence_stashes": 0})
        self._thread = threading.Thread(target=self._schedule, name="llama-batch", daemon=True)
        self._thread.start()

    def _llama_n_ctx(self, options: LlamaOptions) -> int:
        # The high-level Llama only tokenizes here; the batched context is opened beside it.
        return min(options.n_ctx, options.n_batch)

    def _resident(self, session_id: str) -> bool:
        return any(s.session_id == session_id for s in self._slots)

    def healthy(self) -> bool:
        """The scheduler thread runs (a dead one would leave every turn waiting)."""
        return self._thread.is_alive() or self._stopping

    def _submit(self, job: Job) -> None:
        with self._wake:
            self._waiting.append(job)
            self._wake.notify()

    async def forget(self, session_id: str) -> None:
        """A deleted session: its sequence is emptied on the scheduler thread, once its turn ended."""
        done = asyncio.get_running_loop().create_future()
        with self._wake:
            self._forgetting.append((session_id, done))
            self._wake.notify()
        await done

    def _forget_pending(self) -> None:
        with self._wake:
            asked, self._forgetting = self._forgetting, []
        for session_id, done in asked:
            for slot in self._slots:
                if slot.session_id == session_id and slot.job is None:
                    self._lib.llama_memory_seq_rm(self._memory, slot.seq, -1, -1)
                    slot.session_id, slot.tokens, slot.persisted = None, [], 0
                elif slot.session_id == session_id:  # its turn still runs: try again after a step
                    with self._wake:
                        self._forgetting.append((session_id, done))
                    break
            else:
                done.get_loop().call_soon_threadsafe(lambda d=done: d.done() or d.set_result(None))
        self._report_holding()

    def stats(self) -> dict[str, float]:
        active = sum(1 for s in self._slots if s.job is not None)
        return {**super().stats(), "sequences": self.sequences, "sequences_active": active}

    async def close(self) -> None:
        """Let the turns in flight end, then stash every resident session's state in the tier."""
        self._closing = True
        with self._wake:
            self._stopping = True
            self._wake.notify()
        await asyncio.to_thread(self._thread.join)
        for _session, done in self._forgetting:  # nothing is held any more
            done.get_loop().call_soon_threadsafe(lambda d=done: d.done() or d.set_result(None))
        for slot in self._slots:  # copying a state out of llama.cpp takes a while: off the loop
            await asyncio.to_thread(self._stash, slot)
        self._executor.shutdown(wait=True)

    # --- the scheduler thread -------------------------------------------------------------------
    def _schedule(self) -> None:
        while True:
            with self._wake:
                idle = not self._waiting and not self._busy() and not self._stopping
                if idle and self._opts.persist_idle and self._unpersisted():
                    # An agent's next turn often comes within a second (a quick tool): it must
                    # not wait behind a state copy, nor share the cores with its compression.
                    self._wake.wait(PERSIST_AFTER_S)
                    idle = not self._waiting and not self._busy() and not self._stopping
            if idle and self._opts.persist_idle and self._persist_one():
                continue  # one state written: look for work again before the next
            with self._wake:
                while not self._waiting and not self._busy() and not self._stopping and not self._forgetting:
                    self._wake.wait()
                if self._stopping and not self._busy():
                    waiting, self._waiting = list(self._waiting), collections.deque()
                    break
            try:
                if self._forgetting:
                    self._forget_pending()
                self._admit()
                if self._busy():
                    self._step()
                elif self._waiting:  # a waiting turn's state is being read (_state_ready wakes us)
                    with self._wake:
                        self._wake.wait(0.05)
            except Exception as exc:  # a bug or a broken context: fail the turns, keep serving
                log.exception("batched engine step failed")
                try:
                    self._fail_all(exc)
                except Exception:  # never let the scheduler die silently: /health reads it
                    log.exception("failing the turns of a broken step failed too")
        for job in waiting:  # never started: the client retries
            job.emit(RawError(EngineUnavailable("the server is shutting down")))
            job.loop.call_soon_threadsafe(self._job_done, job)

    def _unpersisted(self) -> bool:
        return any(s.session_id is not None and len(s.tokens) > s.persisted for s in self._slots)

    def _persist_one(self) -> bool:
        """Idle: copy one session whose state grew since its last write to disk (crash resume; the
        write runs on the tier's I/O thread). False when every resident state is on disk."""
        for slot in sorted(self._slots, key=lambda s: -s.last_used):
            if slot.session_id is not None and self._tier is not None and len(slot.tokens) > slot.persisted:
                slot.persisted = len(slot.tokens)
                state = save_sequence(self._lib, self._context.ctx, slot.seq, slot.tokens, self._tier)
                if state is not None:
                    self._tier.persist(slot.session_id, state)
                    self._counters["states_persisted"] += 1
                return True
        return False

    def _busy(self) -> bool:
        return any(s.job is not None for s in self._slots)

    def _admit(self) -> None:
        """Bind waiting turns to sequences, oldest first, while their reservation fits."""
        while True:
            with self._wake:
                if not self._waiting:
                    return
                job = self._waiting[0]
            if job.cancelled.is_set() or self._closing:
                self._pop_waiting()
                if self._closing and not job.cancelled.is_set():
                    job.emit(RawError(EngineUnavailable("the server is shutting down")))
                else:
                    job.emit(RawDone("cancelled", 0, None))
                job.loop.call_soon_threadsafe(self._job_done, job)
                continue
            if not self._state_ready(job):
                return  # its state is being read from disk: the running turns go on meanwhile
            slot = self._slot_for(job)
            if slot is None:
                return
            self._pop_waiting()
            try:
                self._start(slot, job)
            except Exception as exc:  # this job alone fails (its restore, its prompt); the others go on
                log.exception("session %s: turn could not start", job.session_id[:12])
                self._lib.llama_memory_seq_rm(self._memory, slot.seq, -1, -1)
                slot.session_id, slot.tokens, slot.persisted, slot.job = None, [], 0, None
                job.emit(RawError(exc))
                job.loop.call_soon_threadsafe(self._job_done, job)

    def _state_ready(self, job: Job) -> bool:
        """Whether the turn's state needs no disk read here (it would stall every stream); if it
        does, the read runs on the tier's I/O thread and wakes the scheduler when done."""
        ready = getattr(self._tier, "state_ready", None)
        return self._resident(job.session_id) or ready is None or ready(job.session_id, self._notify)

    def _notify(self) -> None:
        with self._wake:
            self._wake.notify()

    def _pop_waiting(self) -> None:
        with self._wake:
            self._waiting.popleft()

    def _slot_for(self, job: Job) -> Slot | None:
        """The sequence holding the session, else a free or the least recently used idle one (its
        session stashed to the tier); None while every sequence is busy."""
        idle = sorted((s for s in self._slots if s.job is None), key=lambda s: s.last_used)
        if not idle or any(s.job is not None and s.session_id == job.session_id for s in self._slots):
            return None  # a session's turns run one at a time, in its one sequence
        own = next((s for s in idle if s.session_id == job.session_id), None)
        slot = own or next((s for s in idle if s.session_id is None), None) or idle[0]
        if slot.session_id != job.session_id:
            self._stash(slot)
        return slot

    def _stash(self, slot: Slot) -> None:
        if slot.session_id is not None and slot.tokens and self._tier is not None:
            state = save_sequence(self._lib, self._context.ctx, slot.seq, slot.tokens, self._tier)
            if state is not None:  # a failed copy: the session's next turn prefills
                self._tier.stash(slot.session_id, state)
                self._counters["sequence_stashes"] += 1
        self._lib.llama_memory_seq_rm(self._memory, slot.seq, -1, -1)
        slot.session_id, slot.tokens, slot.persisted = None, [], 0
        self._report_holding()

    def _start(self, slot: Slot, job: Job) -> None:
        restored_from = "context" if slot.session_id == job.session_id else self._restore_into(slot, job)
        reuse = min(self._reusable_prefix(slot.tokens, job.tokens, restored_from), len(job.tokens) - 1)  # the last token yields logits

        def restore(state: SavedState) -> bool:
            ok = restore_sequence(self._lib, self._context.ctx, slot.seq, state, self.n_ctx)
            slot.tokens = list(state.tokens) if ok else []
            return ok

        start = self._prefix.start(job.tokens, reuse, restored_from, restore)
        reuse = start.reuse
        self._lib.llama_memory_seq_rm(self._memory, slot.seq, reuse, -1)
        del slot.tokens[reuse:]
        slot.restored_from, slot.checkpoint_tokens = start.restored_from, start.checkpoint_tokens
        slot.marks = self._prefix.positions(job.tokens, reuse, job.marks)
        slot.persisted = min(slot.persisted, reuse)
        slot.job, slot.prompt_at, slot.reused = job, reuse, reuse
        slot.pending = None
        slot.last_used = time.monotonic()

    def _restore_into(self, slot: Slot, job: Job) -> str:
        slot.session_id, slot.tokens, slot.previous, slot.persisted = job.session_id, [], None, 0
        started = time.perf_counter()  # fetch (disk read, zstd) + restore: what a resume costs
        found = self._tier.fetch(job.session_id) if self._tier is not None else None
        if found is None:
            return "none"
        state, tier_name = found
        fetched = time.perf_counter()
        if restore_sequence(self._lib, self._context.ctx, slot.seq, state, self.n_ctx):
            slot.tokens, slot.previous = list(state.tokens), state
            slot.persisted = len(state.tokens) if tier_name == "disk" else 0
            self._restored(job.session_id, state, tier_name, started, fetched)
            return tier_name
        self._counters["restore_failures"] += 1
        log.warning("KV restore for session %s failed: full prefill", job.session_id[:12])
        self._lib.llama_memory_seq_rm(self._memory, slot.seq, -1, -1)
        return "none"

    def _step(self) -> None:
        """One llama_decode of what engine/batch_plan.py plans: every answering turn's next token,
        then prompt chunks, least recently served first."""
        for slot in self._slots:
            if slot.job is not None and slot.job.cancelled.is_set():
                self._end(slot, "cancelled")
        plan = plan_step([slot.view() for slot in self._slots], self._opts.n_batch)
        if not plan:
            return
        batch = self._batch.batch
        entries: list[tuple[Slot, int]] = []  # (slot, batch index of its logits)
        fed: list[Slot] = []
        n = 0
        for piece in plan:
            slot = self._slots[piece.seq]
            if piece.answer:
                assert slot.pending is not None
                tokens, pos, slot.pending = [slot.pending], len(slot.tokens), None
            else:
                assert slot.job is not None
                tokens, pos = list(slot.job.tokens[piece.start : piece.start + piece.count]), piece.start
                slot.prompt_at += piece.count
                fed.append(slot)
            n = self._put(batch, n, slot.seq, tokens, pos, piece.logits)
            slot.tokens.extend(tokens)
            if piece.logits:
                entries.append((slot, n - 1))
        batch.n_tokens = n
        rc = self._lib.llama_decode(self._context.ctx, batch)
        self._counters["batch_steps"] += 1
        self._counters["batch_tokens"] += n
        if rc != 0:
            raise RuntimeError(f"llama_decode failed ({rc}) on a batch of {n} tokens")
        for slot in fed:  # a checkpoint where a chunk ended on a mark: the sequence covers exactly that
            if slot.job is not None and slot.prompt_at in slot.marks:
                self._prefix.save(self._context.ctx, slot.seq, slot.tokens, slot.job.marks, len(slot.job.tokens),
                                  slot.job.session_id)
        for slot, index in entries:
            if slot.sampler is None:  # its prompt is in: the answer starts
                self._prefilled(slot)
            self._sample(slot, index)

    @staticmethod
    def _put(batch: Any, n: int, seq: int, tokens: list[int], pos: int, logits_last: bool) -> int:
        for i, token in enumerate(tokens):
            batch.token[n + i] = token
            batch.pos[n + i] = pos + i
            batch.n_seq_id[n + i] = 1
            batch.seq_id[n + i][0] = seq
            batch.logits[n + i] = logits_last and i == len(tokens) - 1
        return n + len(tokens)

    def _prefilled(self, slot: Slot) -> None:
        job = slot.job
        assert job is not None
        slot.previous = None
        self._counters["prefill_tokens_evaluated"] += len(job.tokens) - slot.reused
        self._counters["prefill_tokens_reused"] += slot.reused
        job.emit(PrefillDone(len(job.tokens), slot.reused, slot.restored_from, slot.checkpoint_tokens))
        self._llm.set_seed(job.params.seed if job.params.seed is not None else self._opts.seed)
        slot.sampler = self._llm._init_sampler(temp=job.params.temperature, top_p=job.params.top_p)
        slot.guided = (GrammarSampler(self._lib, self._vocab, self._llm.n_vocab(), slot.sampler.sampler, job.grammar)
                       if job.grammar else None)
        slot.answer = AnswerText(job, self._opts.repeated_line_stop, self._llm.detokenize, self._ends_repeating)

    def _sample(self, slot: Slot, index: int) -> None:
        job, answer = slot.job, slot.answer
        assert job is not None and answer is not None
        if answer.produced >= job.max_new:
            self._end(slot, "length")
            return
        ctx = self._context.ctx
        token = slot.guided.sample(ctx, index) if slot.guided else slot.sampler.sample(self._context, index)
        if self._is_end(token):
            self._end(slot, "stop")
        elif (ended := answer.feed(token)) is not None:
            self._end(slot, ended)
        elif answer.produced >= job.max_new:
            self._end(slot, "length")
        else:
            slot.pending = token  # evaluated next step: the KV covers everything the client sends back

    def _end(self, slot: Slot, finish: str) -> None:
        job = slot.job
        assert job is not None
        if slot.prefilling:  # cancelled mid-prompt: the whole chunks evaluated stay, exact
            self._counters["prefills_cancelled"] += 1
            self._counters["prefill_tokens_evaluated"] += slot.prompt_at - slot.reused
            log.info("session %s: prefill cancelled at %d of %d tokens; the context keeps them",
                     job.session_id[:12], slot.prompt_at, len(job.tokens))
            job.emit(RawDone("cancelled", 0, None))
        elif slot.answer is not None:
            self._counters["completion_tokens"] += slot.answer.produced
            slot.answer.finish(finish)
        else:
            job.emit(RawDone(finish, 0, None))
        self._release(slot)
        job.loop.call_soon_threadsafe(self._job_done, job)

    def _release(self, slot: Slot) -> None:
        if slot.guided is not None:
            slot.guided.close()
        slot.job, slot.pending, slot.sampler, slot.guided, slot.answer = None, None, None, None, None
        slot.previous = None
        slot.last_used = time.monotonic()
        self._report_holding()

    def _fail_all(self, exc: Exception) -> None:
        for slot in self._slots:
            job, previous = slot.job, slot.previous
            self._lib.llama_memory_seq_rm(self._memory, slot.seq, -1, -1)
            session = slot.session_id
            slot.session_id, slot.tokens, slot.persisted = None, [], 0
            if job is None:
                continue
            if previous is not None and self._tier is not None and session is not None:
                self._tier.stash(session, previous)  # still exact: a retry prefills only its new tokens
                self._counters["states_kept_after_failure"] += 1
            self._release(slot)
            job.emit(RawError(exc))
            job.loop.call_soon_threadsafe(self._job_done, job)

    def _report_holding(self) -> None:
        if self._tier is not None:
            self._tier.holding_many({s.session_id: len(s.tokens) for s in self._slots if s.session_id})
