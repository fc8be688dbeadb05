"""What one step of the batched engine decodes, decided without touching llama.cpp: the next token
of every answering sequence, then prompt chunks of the sequences still prefilling, least recently
served first, in the room `n_batch` leaves. A chunk stops at the sequence's next checkpoint mark (the
sequence then covers exactly that prefix, to be saved). The engine executes the plan
(engine/batched_engine.py); this module only counts.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class SequenceView:
    """What the plan reads of one sequence."""

    seq: int
    answering: bool  # it holds a sampled token the step must evaluate
    prompt_at: int | None  # prompt tokens in its KV so far, while it prefills (None: not prefilling)
    prompt_len: int = 0
    next_mark: int | None = None  # the first checkpoint mark past prompt_at, if any
    last_used: float = 0.0


@dataclass(frozen=True)
class Piece:
    seq: int
    start: int  # the prompt position of its first token (for an answer token: unused)
    count: int
    answer: bool  # the sequence's sampled token (count 1)
    logits: bool  # its last token yields logits (an answer token, or a chunk that ends the prompt)


def plan_step(sequences: Sequence[SequenceView], n_batch: int) -> list[Piece]:
    """The pieces of one llama_batch, in order; their counts add up to at most n_batch (the
    engine refuses more answering sequences than n_batch, so every answer token fits)."""
    pieces = [Piece(s.seq, 0, 1, True, True) for s in sequences if s.answering][:n_batch]
    room = n_batch - len(pieces)
    for s in sorted((s for s in sequences if s.prompt_at is not None and s.prompt_at < s.prompt_len),
                    key=lambda s: s.last_used):
        if room <= 0:
            break
        assert s.prompt_at is not None
        end = min(s.prompt_at + room, s.next_mark if s.next_mark is not None else s.prompt_len, s.prompt_len)
        pieces.append(Piece(s.seq, s.prompt_at, end - s.prompt_at, False, end == s.prompt_len))
        room -= end - s.prompt_at
    return pieces
