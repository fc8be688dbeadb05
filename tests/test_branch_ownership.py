"""Kept-line maps belong to their content, not to the branch the router guessed (issue 51): a
follow-up without tools is its conversation's turn, an unrelated conversation under the same key
and tools takes nothing from another, and a conversation that lands on a new branch (its tool list
changed, its branch was dropped) serves its compressed history exactly as before.
Model: none (the fake engine, BM25).
"""

from __future__ import annotations

import asyncio
import tempfile
from collections.abc import Sequence
from pathlib import Path

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gateway.branches import BranchRouter
from policies.branches import choose_branch, continues_conversation
from policies.conversation_types import Conversation, Message, SessionHints, ToolCall, ToolSpec
from sessions.identity import resolve_session
from sessions.registry import DELETED_KEPT
from tests.test_branches import LOG, READ, service, view

HINTS = SessionHints(x_session_id="s")
GREP = ToolSpec("Grep", "Search files.", {"type": "object"})


def test_sharing_only_the_tool_list_is_not_one_conversation() -> None:
    # digest 0 is the tool list: a second conversation of one agent under one key shares it
    assert choose_branch(("T", "q2"), "", False, [view("main", ("T", "q1", "a1"))]).branch_id is None
    assert choose_branch(("T", "s", "q2"), "", False, [view("main", ("T", "s", "q1"))]).branch_id == "main"


def test_a_follow_up_without_tools_continues_its_conversation() -> None:
    main = view("main", ("T", "s", "q", "call", "log"))
    assert continues_conversation(("N", "s", "q", "call", "log", "a", "summarise"), [main])
    assert not continues_conversation(("N", "s", "other"), [main])
    assert not continues_conversation(("N", "s", "q", "call", "log"), [view("t", ("T", "s", "q", "call", "log"),
                                                                            side=True)])
    choice = choose_branch(("N", "s", "q", "call", "log", "a", "summarise"), "", False, [main])
    assert (choice.branch_id, choice.extends) == ("main", False)


def history(system: str, question: str, tools: tuple[ToolSpec, ...] = READ) -> list[Message]:
    """A question, a Read call, the long log as its result, an answer."""
    return [Message("system", system), Message("user", question),
            Message("assistant", "", (ToolCall("c0", "Read", "{}"),)), Message("tool", LOG, tool_call_id="c0"),
            Message("assistant", "The build failed.")]


def served_log(prompt_messages: Sequence[Message]) -> str:
    (log,) = [m.content for m in prompt_messages if m.role == "tool"]
    return log


async def serve(turns, conversations: Sequence[Conversation]) -> list:  # type: ignore[no-untyped-def]
    out = []
    for conv in conversations:
        turn = await turns.prepare(conv, "")
        async for _event in turns.stream(turn):
            pass
        turns.finish(turn)
        out.append(turn)
    return out


def first_turns(system: str = "You are the main agent.", question: str = "Why did the build fail?"):  # type: ignore[no-untyped-def]
    messages = history(system, question)
    return [Conversation(tuple(messages[:2]), READ, hints=HINTS), Conversation(tuple(messages[:4]), READ, hints=HINTS)]


def test_a_follow_up_without_tools_serves_the_history_compressed_and_runs_the_recall_gate() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        turns, _engine, registry = service(Path(tmp))
        follow = Conversation((*history("You are the main agent.", "Why did the build fail?"),
                               Message("user", "Summarise: which module hit the disk quota?")), (), hints=HINTS)
        first, compressed, last = asyncio.run(serve(turns, [*first_turns(), follow]))
        assert compressed.compression is not None and compressed.compression.compressed
        assert last.branch.kind == "main" and last.record is compressed.record  # not a side branch
        assert served_log(last.prompt.messages) == served_log(compressed.prompt.messages) != LOG
        assert last.recall is not None  # the gate ran on the question
        registry.close()


def test_an_unrelated_conversation_under_the_same_key_and_tools_takes_nothing_from_another() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        turns, _engine, registry = service(Path(tmp))
        a = first_turns()
        b = [Conversation((Message("system", "You are the main agent."), Message("user", "Count the files.")),
                          READ, hints=HINTS)]
        again = Conversation((*history("You are the main agent.", "Why did the build fail?"),
                              Message("user", "Which module?")), READ, hints=HINTS)
        served = asyncio.run(serve(turns, [*a, *b, again]))
        assert served_log(served[-1].prompt.messages) == served_log(served[1].prompt.messages) != LOG
        registry.close()


def test_a_tool_list_that_changes_mid_session_keeps_the_history_as_served() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        turns, _engine, registry = service(Path(tmp))
        late = Conversation((*history("You are the main agent.", "Why did the build fail?"),
                             Message("user", "Which module?")), (*READ, GREP), hints=HINTS)  # an MCP tool connected
        served = asyncio.run(serve(turns, [*first_turns(), late]))
        assert served_log(served[-1].prompt.messages) == served_log(served[1].prompt.messages) != LOG
        registry.close()


def test_a_dropped_branch_that_comes_back_serves_its_history_compressed() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        turns, _engine, registry = service(Path(tmp))
        turns.branches.max_branches = 2
        others = [Conversation((Message("system", f"You are helper {i}."), Message("user", "hi")), READ,
                               hints=SessionHints(x_session_id="s", agent_id=f"agent{i}")) for i in range(3)]
        back = Conversation((*history("You are the main agent.", "Why did the build fail?"),
                             Message("user", "Which module?")), READ, hints=SessionHints(x_session_id="s", agent_id="m"))
        start = [Conversation(c.messages, READ, hints=SessionHints(x_session_id="s", agent_id="m")) for c in first_turns()]
        served = asyncio.run(serve(turns, [*start, *others, back]))
        assert turns.branches.counters.get("branches_dropped", 0) >= 1
        assert served[-1].record is not served[1].record  # a new branch record ...
        assert served_log(served[-1].prompt.messages) == served_log(served[1].prompt.messages) != LOG  # ... same bytes
        assert turns.stats().get("shared_maps_adopted", 0) >= 1
        registry.close()


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(order=st.permutations(["b", "late", "follow", "crowd", "again"]))
def test_whatever_comes_between_the_history_is_served_as_it_was(order: list[str]) -> None:
    """The property of tests/test_branches.py, extended: two unhinted conversations with the same
    tools, a tool list that changes mid-session, a follow-up without tools, a crowd of sub-agents
    that gets branches dropped (the limit is 2 here) and the changed-tools conversation resumed
    (its branch perhaps dropped), in any order after the first conversation's compressed turn: its
    log is served with the same bytes every time."""
    main = history("You are the main agent.", "Why did the build fail?")
    crowd = [Conversation((Message("system", f"You are helper {i}."), Message("user", "hi")), READ,
                          hints=SessionHints(x_session_id="s", agent_id=f"agent{i}")) for i in range(3)]
    later = {
        "b": [Conversation((Message("system", "You are the main agent."), Message("user", "Count the files.")), READ,
                           hints=HINTS)],
        "late": [Conversation((*main, Message("user", "Which module?")), (*READ, GREP), hints=HINTS)],
        "follow": [Conversation((*main, Message("user", "Summarise it.")), (), hints=HINTS)],
        "crowd": crowd,
        # the changed-tools conversation once more: its branch may have been dropped meanwhile
        "again": [Conversation((*main, Message("user", "Which module?"), Message("assistant", "billing."),
                                Message("user", "Which line?")), (*READ, GREP), hints=HINTS)],
    }
    with tempfile.TemporaryDirectory() as tmp:
        turns, _engine, registry = service(Path(tmp))
        turns.branches.max_branches = 2
        served = asyncio.run(serve(turns, [*first_turns(), *(c for n in order for c in later[n])]))
        reference = served_log(served[1].prompt.messages)
        assert reference != LOG
        assert turns.branches.counters.get("branches_dropped", 0) >= 1
        names = [n for n in order for _ in later[n]]
        for name, turn in zip(names, served[2:]):
            if name in ("late", "follow", "again"):
                assert served_log(turn.prompt.messages) == reference, name
        registry.close()


def test_a_root_made_anew_never_hands_out_an_old_branch_id() -> None:
    from sessions.record import SessionRecord

    first, again = SessionRecord("r" * 64, ""), SessionRecord("r" * 64, "")  # the same root, its record lost
    first.open_branch("main", "", True)
    again.open_branch("main", "", True)
    ids = {first.open_branch("agent", "a", True).branch_id, again.open_branch("agent", "a", True).branch_id}
    assert len(ids) == 2


def test_a_dropped_branch_is_forgotten_off_the_entering_turns_path_even_when_that_turn_is_cancelled() -> None:
    """Issue 51, item 10: the branch limit's victims are forgotten (KV, record, files) in the
    background, not by the turn that dropped them: that turn may wait long for its own branch, or
    be cancelled while it waits, and the victim is forgotten all the same."""
    with tempfile.TemporaryDirectory() as tmp:
        turns, _engine, registry = service(Path(tmp))
        forgotten: list[str] = []

        async def forget(session_id: str) -> None:
            forgotten.append(session_id)
            await registry.delete(session_id)

        turns.branches = BranchRouter(registry, max_branches=2, forget=forget)
        helpers = [Conversation((Message("system", f"You are helper {i}."), Message("user", "hi")), READ,
                                hints=SessionHints(x_session_id="s", agent_id=f"agent{i}")) for i in range(2)]

        async def run() -> None:
            await serve(turns, helpers)
            identity = resolve_session(helpers[0], "")
            busy = await turns.branches.enter(helpers[0], identity, "")  # agent0's branch is held
            victim = next(e.branch_id for e in busy.root.branch_entries() if e.hint.endswith("agent1"))
            assert await registry.find(victim, None) is not None
            turns.branches.max_branches = 1
            waiting = asyncio.create_task(turns.branches.enter(helpers[0], identity, ""))  # drops agent1, then waits
            await asyncio.sleep(0.05)
            assert victim not in {e.branch_id for e in busy.root.branch_entries()}
            waiting.cancel()
            await asyncio.gather(waiting, return_exceptions=True)
            await turns.branches.settle()
            turns.branches.release(busy)
            assert forgotten == [victim] and await registry.find(victim, None) is None

        asyncio.run(run())
        registry.close()


def test_deleted_ids_are_remembered_within_a_bound() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        _turns, _engine, registry = service(Path(tmp))

        async def run() -> None:
            for i in range(DELETED_KEPT + 50):
                await registry.delete(f"{i:064x}")

        asyncio.run(run())
        assert len(registry._deleted) == DELETED_KEPT and f"{0:064x}" not in registry._deleted
        registry.close()


def test_a_recall_gate_failure_serves_the_question_and_logs_its_traceback(caplog) -> None:  # type: ignore[no-untyped-def]
    """Issue 51, item 11: the question is served as sent, and the log says where the gate failed."""
    with tempfile.TemporaryDirectory() as tmp:
        turns, _engine, registry = service(Path(tmp))

        def broken(*_args: object) -> None:
            raise KeyError("a unit the gate expected")

        follow = Conversation((*history("You are the main agent.", "Why did the build fail?"),
                               Message("user", "Which module hit the disk quota?")), READ, hints=HINTS)
        with caplog.at_level("WARNING", logger="pflash.turns"):
            asyncio.run(serve(turns, first_turns()))
            turns.recall.rewrite = broken  # type: ignore[method-assign]
            (last,) = asyncio.run(serve(turns, [follow]))
        assert last.prompt.messages[-1].content == "Which module hit the disk quota?"
        failures = [r for r in caplog.records if "recall gate failed" in r.getMessage()]
        assert failures and failures[0].exc_info is not None and failures[0].exc_info[0] is KeyError
        assert turns.stats()["recall_failures"] == 1
        registry.close()
