from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from policies.conversation_types import Message, ToolCall
from policies.rendering import split_lines
from policies.request_finding import DEFAULT_SCORED_TOKENS, find_request


def words(text: str) -> int:
    return len(text.split())


SYSTEM = Message("system", "You are a careful coding agent.")


def conversation(big: str = "x\n" * 100) -> list[Message]:
    return [
        SYSTEM,
        Message("user", "Why does the session restore fail after a restart?"),
        Message(
            "assistant",
            "Let me read the store and grep for the loader.",
            tool_calls=(
                ToolCall("call_a", "read_file", '{"path": "sessions/store.py"}'),
                ToolCall("call_b", "grep", '{"pattern": "load_state"}'),
            ),
        ),
        Message("tool", "short result", tool_call_id="call_a", name="read_file"),
        Message("tool", big, tool_call_id="call_b", name="grep"),
    ]


def test_tool_request_uses_the_matching_call_user_text_assistant_and_system() -> None:
    msgs = conversation()
    r = find_request(msgs, 4, words)
    assert r.pinned_lines is None
    assert 'grep {"pattern": "load_state"}' in r.scored
    assert "read_file" not in r.scored  # the other call is not the one that produced it
    assert "session restore fail" in r.scored
    assert "grep for the loader" in r.scored
    assert "careful coding agent" in r.scored
    # Chronological order: system, user, assistant words, then the call.
    order = [r.scored.index(s) for s in ("careful", "restore", "grep for", '{"pattern"')]
    assert order == sorted(order)


def test_only_an_output_whose_call_was_found_answers_a_call() -> None:
    """The ranker picks its weight set by this: the call's words, or only the text around the output."""
    msgs = conversation()
    assert find_request(msgs, 4, words).answers_call
    orphan = [*msgs[:2], Message("tool", "x\n" * 100, tool_call_id="call_gone", name="bash")]
    assert not find_request(orphan, 2, words).answers_call
    paste = [SYSTEM, Message("user", "x\n" * 100 + "Why does it fail?\n")]
    assert not find_request(paste, 1, words).answers_call


def test_tool_request_trims_low_priority_parts_first() -> None:
    msgs = conversation()
    r = find_request(msgs, 4, words, max_scored_tokens=12)
    assert words(r.scored) <= 12
    assert 'grep {"pattern": "load_state"}' in r.scored  # the call survives
    assert "and grep for the loader." in r.scored  # then the agent's words, keeping their end
    assert "restart?" not in r.scored  # the task comes after them
    assert "careful" not in r.scored  # the system prompt goes first
    r = find_request(msgs, 4, words, max_scored_tokens=20)
    assert "Let me read the store" in r.scored and "restart?" in r.scored  # room for the task's end
    r = find_request(msgs, 4, words, max_scored_tokens=3)
    assert r.scored == 'grep {"pattern": "load_state"}'


def test_a_long_task_does_not_crowd_out_the_agents_words() -> None:
    msgs = conversation()
    msgs[1] = Message("user", "The session store loses state. " * 60)
    r = find_request(msgs, 4, words, max_scored_tokens=40)
    assert "Let me read the store and grep for the loader." in r.scored
    assert "session store" in r.scored  # the task fills what is left
    assert words(r.scored) <= 40


def test_an_issue_of_a_few_hundred_words_reaches_the_scorer_whole() -> None:
    """BM25 gains from every word of a task (tuning splits); only far longer ones are cut."""
    msgs = conversation()
    issue = " ".join(f"detail{i}" for i in range(300))
    msgs[1] = Message("user", issue)
    scored = find_request(msgs, 4, words).scored
    assert issue in scored and "Let me read the store and grep for the loader." in scored
    msgs[1] = Message("user", issue + " " + issue)
    assert words(find_request(msgs, 4, words).scored) <= DEFAULT_SCORED_TOKENS


def follow_up_search(question: str) -> list[Message]:
    """A RAG agent's second search: the subject is in the question before this one."""
    return [
        Message("user", "What is a Roth IRA?"),
        Message("assistant", "A retirement account funded with taxed income."),
        Message("user", question),
        Message("assistant", "", (ToolCall("call_s", "search", f'{{"query": "{question}"}}'),)),
        Message("tool", "passage\n" * 100, tool_call_id="call_s", name="search"),
    ]


def test_a_follow_up_search_is_ranked_with_the_question_before_it() -> None:
    r = find_request(follow_up_search("How can I open one?"), 4, words)
    assert "Roth IRA" in r.scored and "How can I open one?" in r.scored
    assert "retirement account" not in r.scored  # the assistant's answer is not the subject
    assert r.scored.index("How can I open one?") < r.scored.index("Roth IRA")  # an encoder reads the head
    # Only the one question before: a third question leaves the first out.
    msgs = follow_up_search("How can I open one?")
    msgs[2:2] = [Message("user", "Who can contribute?"), Message("assistant", "Anyone with earned income.")]
    scored = find_request(msgs, 6, words).scored
    assert "Who can contribute?" in scored and "Roth IRA" not in scored


def test_the_question_before_only_fills_what_is_left() -> None:
    msgs = follow_up_search("How can I open one?")
    r = find_request(msgs, 4, words, max_scored_tokens=10)
    assert "How can I open one?" in r.scored and "Roth" not in r.scored
    assert words(r.scored) <= 10


def test_tool_without_id_matches_by_name() -> None:
    msgs = conversation()
    msgs[4] = Message("tool", "big", tool_call_id=None, name="read_file")
    assert "sessions/store.py" in find_request(msgs, 4, words).scored


def test_long_system_prompt_is_left_out() -> None:
    msgs = conversation()
    msgs[0] = Message("system", "rule " * 500)
    assert "rule" not in find_request(msgs, 4, words, max_scored_tokens=128).scored
    msgs[0] = Message("system", "You are a coding agent. " * 30)  # fits the budget, yet standing instructions
    assert "coding agent" not in find_request(msgs, 4, words).scored
    assert "careful coding agent" in find_request(conversation(), 4, words).scored  # a role line stays


LOG = "".join(f"2024-05-01 12:00:{i % 60:02d} INFO worker {i}: processed batch\n" for i in range(200))


def test_user_paste_with_trailing_question_is_pinned() -> None:
    content = LOG + "\nWhy does worker 17 never finish its batch?\n"
    msgs = [SYSTEM, Message("user", content)]
    r = find_request(msgs, 1, words)
    lines = split_lines(content)
    assert r.pinned_lines == (len(lines) - 1, len(lines) - 1)
    assert r.scored == "Why does worker 17 never finish its batch?"


def test_user_paste_with_leading_ask_is_pinned() -> None:
    content = "Here is the output of the failing job.\nPlease explain the failures:\n```\n" + LOG + "```\n"
    r = find_request([Message("user", content)], 0, words)
    assert r.pinned_lines == (0, 1)
    assert "Please explain the failures" in r.scored


def test_user_paste_question_both_ends_pins_the_one_that_asks() -> None:
    content = "Some context for you:\n" + LOG + "What went wrong at the end?\n"
    r = find_request([Message("user", content)], 0, words)
    n = len(split_lines(content))
    assert r.pinned_lines == (n - 1, n - 1)
    assert "What went wrong" in r.scored and "Some context" in r.scored


def test_user_paste_without_question_ranks_against_earlier_context() -> None:
    msgs = [
        Message("user", "I will paste the crash log next, look for the OOM."),
        Message("assistant", "Sure, paste it."),
        Message("user", LOG),
    ]
    r = find_request(msgs, 2, words)
    assert r.pinned_lines is None
    assert "OOM" in r.scored
    alone = find_request([Message("user", LOG)], 0, words)
    assert alone.pinned_lines is None and alone.scored.startswith("2024-05-01")


def test_prose_paste_is_not_mistaken_for_a_question_block() -> None:
    essay = "".join(f"This is sentence number {i} of a long essay about caching.\n\n" for i in range(100))
    r = find_request([Message("user", essay)], 0, words)
    assert r.pinned_lines is None


def test_bad_targets() -> None:
    msgs = conversation()
    with pytest.raises(ValueError):
        find_request(msgs, 9, words)
    with pytest.raises(ValueError):
        find_request(msgs, 2, words)  # an assistant message


@settings(max_examples=200)
@given(
    st.text(alphabet=st.sampled_from("ab ?\n:{}"), max_size=200),
    st.text(alphabet=st.sampled_from("cd ?\n"), max_size=80),
    st.integers(1, 40),
)
def test_scored_text_fits_and_pin_is_in_bounds(paste: str, ask: str, limit: int) -> None:
    msgs = [Message("user", ask), Message("assistant", "ok", (ToolCall("i", "t", "{}"),)), Message("user", paste)]
    r = find_request(msgs, 2, words, max_scored_tokens=limit)
    assert words(r.scored) <= limit
    if r.pinned_lines is not None:
        a, b = r.pinned_lines
        assert 0 <= a <= b < len(split_lines(paste))
    t = find_request(msgs + [Message("tool", paste, tool_call_id="i")], 3, words, max_scored_tokens=limit)
    assert words(t.scored) <= limit and t.pinned_lines is None
    assert find_request(msgs, 2, words, max_scored_tokens=limit) == r


def test_long_task_keeps_its_subject_and_its_last_words() -> None:
    issue = "QuerySet.union breaks ordering on annotated fields\n" + "filler words here " * 200 + "\nPlease fix compile_union."
    messages = [Message("user", issue), Message("assistant", "", (ToolCall("c1", "bash", '{"cmd": "ls"}'),)),
                Message("tool", "out\n" * 50, tool_call_id="c1")]
    scored = find_request(messages, 2, words, 64).scored
    assert "QuerySet.union breaks ordering" in scored  # the title, which a tail-only cut loses
    assert "Please fix compile_union." in scored  # ... and its ask (the tool call follows it)
    assert words(scored) <= 64


def test_a_system_prompt_cut_to_fit_is_ranked_against_the_user_text_after_it() -> None:
    """Claude Code's safety classifier: a ~141K-character system prompt of rules, then the
    transcript to judge. Only a one-shot request that cannot fit whole has its system text cut;
    the rules that matter are those about what follows."""
    rules = "\n".join(f"Rule {i}: never run command number {i}." for i in range(50))
    msgs = [Message("system", rules), Message("user", "The agent wants to run `rm -rf build`. Block it?")]
    r = find_request(msgs, 0, words)
    assert r.scored == msgs[1].content and r.pinned_lines is None
    assert find_request([Message("system", rules)], 0, words).scored.startswith("Rule 0:")  # nothing after it
    with pytest.raises(ValueError, match="tool, user or system"):
        find_request([Message("assistant", "x")], 0, words)
