"""The batched engine's step plan (engine/batch_plan.py), without llama.cpp: every answering
sequence gets its token, chunks fill the room oldest first, never past a checkpoint mark or the
prompt, and the batch never holds more than n_batch tokens (issue 51, item 4).
Model: none."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from engine.batch_plan import SequenceView, plan_step


@st.composite
def sequences(draw: st.DrawFn) -> list[SequenceView]:
    out = []
    for seq in range(draw(st.integers(0, 8))):
        kind = draw(st.sampled_from(["idle", "answering", "prefilling"]))
        if kind == "prefilling":
            length = draw(st.integers(1, 5000))
            at = draw(st.integers(0, length - 1))
            mark = draw(st.one_of(st.none(), st.integers(at + 1, length)))
            out.append(SequenceView(seq, False, at, length, mark, draw(st.floats(0, 100))))
        else:
            out.append(SequenceView(seq, kind == "answering", None))
    return out


@given(sequences(), st.integers(1, 600))
def test_a_step_holds_every_answer_token_then_fills_the_room_oldest_first(views: list[SequenceView], n_batch: int) -> None:
    plan = plan_step(views, n_batch)
    answering = [v.seq for v in views if v.answering]
    assert sum(p.count for p in plan) <= n_batch
    assert [p.seq for p in plan if p.answer] == answering[:n_batch]
    assert all(p.count == 1 and p.logits for p in plan if p.answer)
    chunks = [p for p in plan if not p.answer]
    by_seq = {v.seq: v for v in views}
    for p in chunks:
        v = by_seq[p.seq]
        assert v.prompt_at is not None and p.start == v.prompt_at and p.count > 0
        assert p.start + p.count <= (v.next_mark if v.next_mark is not None else v.prompt_len) <= v.prompt_len
        assert p.logits == (p.start + p.count == v.prompt_len)  # logits only where the prompt ends
    waiting = sorted((v for v in views if v.prompt_at is not None), key=lambda v: v.last_used)
    assert [p.seq for p in chunks] == [v.seq for v in waiting[: len(chunks)]]  # oldest first, none skipped
    if len(chunks) < len(waiting):  # one was left out: only because the batch is full
        assert sum(p.count for p in plan) == n_batch


def test_more_answering_sequences_than_the_batch_holds_never_overflow_it() -> None:
    views = [SequenceView(seq, True, None) for seq in range(12)]
    assert [p.seq for p in plan_step(views, 8)] == list(range(8))
