"""The MTRAG retention benchmark's own rules: a passage counts only when kept whole, and the search
output is asked for by the question its gold passages answer."""

from __future__ import annotations

import json

from benchmarks.bench_rag_retention import kept_share, retrieval_turn
from benchmarks.mtrag_replays import Replay
from policies.conversation_types import Message, ToolCall


def test_a_passage_cut_anywhere_counts_as_lost() -> None:
    spans = [(1, 3), (6, 8)]
    assert kept_share(spans, [(0, 9)]) == 1.0
    assert kept_share(spans, [(1, 3)]) == 0.5
    assert kept_share(spans, [(1, 2), (6, 8)]) == 0.5  # line 3 of the first passage is missing
    assert kept_share(spans, [(0, 2), (3, 5), (6, 7)]) == 0.5
    assert kept_share(spans, []) == 0.0


def replay(later: list[Message]) -> Replay:
    msgs = [Message("user", "first question"),
            Message("assistant", "", (ToolCall("call_search", "search", json.dumps({"query": "first question"})),)),
            Message("tool", "[1] document d\ntext\n\n", tool_call_id="call_search", name="search"), *later]
    return Replay("t1", "c", msgs, 2, [], [(1, 1)], 7, [])


def test_the_search_is_made_for_the_gold_turns_question() -> None:
    turn = retrieval_turn(replay([Message("assistant", "an answer"), Message("user", "and the second one?")]), [3, 1, 0])
    assert turn is not None
    roles = [m.role for m in turn.messages]
    assert roles == ["user", "assistant", "user", "assistant", "tool"]
    call = turn.messages[-2].tool_calls[0]
    assert json.loads(call.arguments) == {"query": "and the second one?"}
    assert turn.messages[-1].content == "[1] document d\ntext\n\n"
    assert turn.messages[-1].tool_call_id == call.id


def test_a_one_question_conversation_searches_for_that_question() -> None:
    turn = retrieval_turn(replay([]), [3, 1, 0])
    assert turn is not None
    assert [m.role for m in turn.messages] == ["user", "assistant", "tool"]
    assert json.loads(turn.messages[1].tool_calls[0].arguments) == {"query": "first question"}
    assert retrieval_turn(replay([Message("user", "q2"), Message("assistant", "a2")]), [3, 1, 0]) is None
