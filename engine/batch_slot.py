"""One sequence of the batched engine's context: the session whose KV it holds, the turn it serves
(its prompt position, sampler, stops), and what the step planner reads of it (engine/batch_plan.py)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from engine.answer_text import AnswerText
from engine.base import SavedState
from engine.batch_plan import SequenceView
from engine.grammar_sampler import GrammarSampler
from engine.llama_jobs import Job


@dataclass(eq=False)
class Slot:
    """One sequence of the context: the session whose KV it holds and the turn it serves, if any."""

    seq: int
    session_id: str | None = None
    tokens: list[int] = field(default_factory=list)  # exactly what the sequence's KV covers
    job: Job | None = None
    last_used: float = 0.0
    prompt_at: int = 0  # prompt tokens in the KV so far (prefill is done when it reaches the prompt)
    pending: int | None = None  # the sampled token the next step evaluates
    reused: int = 0
    restored_from: str = "none"
    checkpoint_tokens: int = 0  # of `reused`, what a shared prefix checkpoint brought
    marks: list[int] = field(default_factory=list)  # prompt positions this prefill saves checkpoints at
    persisted: int = 0  # tokens of the state last written to disk for crash resume
    previous: SavedState | None = None  # the state restored for this turn, until its prefill succeeds
    sampler: Any = None
    guided: GrammarSampler | None = None
    answer: AnswerText | None = None  # the answer's text, once its prompt is in

    @property
    def prefilling(self) -> bool:
        return self.job is not None and self.prompt_at < len(self.job.tokens)

    def view(self) -> SequenceView:
        if self.job is None:
            return SequenceView(self.seq, False, None)
        mark = next((m for m in self.marks if m > self.prompt_at), None)
        return SequenceView(self.seq, self.pending is not None, self.prompt_at if self.prefilling else None,
                            len(self.job.tokens), mark, self.last_used)
