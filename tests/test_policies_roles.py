"""alternate_roles: the shapes strict templates refuse become ones they accept, losing no text."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from engine.chat_templates import select_template
from policies.conversation_types import Message, ToolCall
from policies.roles import alternate_roles

# Strict user/assistant alternation after an optional leading system message (Gemma's rule).
STRICT = r"""
{%- set offset = 1 if messages[0].role == 'system' else 0 -%}
{%- for message in messages -%}
{%- if loop.index0 >= offset and (message.role == 'user') != ((loop.index0 - offset) % 2 == 0) -%}
{{- raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') -}}
{%- endif -%}
{{- '<|' + message.role + '|>' + message.content + '<|end|>' -}}
{%- endfor -%}
"""


def test_codex_mid_history_developer_text_joins_the_next_user_turn() -> None:
    messages = [
        Message("system", "You are Codex."),
        Message("system", "<permissions/>"),
        Message("user", "Fix it"),
        Message("assistant", "Done."),
        Message("system", "<environment changed/>"),
        Message("user", "Thanks"),
    ]
    assert alternate_roles(messages) == (
        Message("system", "You are Codex.\n\n<permissions/>"),
        Message("user", "Fix it"),
        Message("assistant", "Done."),
        Message("user", "<environment changed/>\n\nThanks"),
    )


def test_consecutive_same_role_turns_merge_and_keep_their_calls() -> None:
    call = ToolCall("c1", "f", "{}")
    messages = [Message("user", "a"), Message("user", "b"), Message("assistant", "x"),
                Message("assistant", "", (call,)), Message("system", "late")]
    assert alternate_roles(messages) == (
        Message("user", "a\n\nb"), Message("assistant", "x", (call,)), Message("user", "late"))


def test_a_strict_template_accepts_the_normalised_conversation() -> None:
    template = select_template({"tokenizer.chat_template": STRICT})
    # An Anthropic assistant turn made only of thinking is dropped by the adapter: user, user.
    text = template.render(alternate_roles([Message("user", "hi"), Message("user", "again")]), [])
    assert text == "<|user|>hi\n\nagain<|end|>"


ROLES = st.sampled_from(["system", "user", "assistant"])
MESSAGES = st.lists(st.builds(Message, ROLES, st.text(alphabet="abc", min_size=1, max_size=4)), max_size=10)


@given(messages=MESSAGES)
def test_normalised_roles_alternate_and_keep_every_text(messages: list[Message]) -> None:
    out = alternate_roles(messages)
    roles = [m.role for m in out]
    assert "system" not in roles[1:]
    assert all(a != b for a, b in zip(roles, roles[1:]))
    joined = "\x00".join(m.content for m in out)
    for message in messages:
        assert message.content in joined
    assert alternate_roles(messages) == out  # deterministic
    assert alternate_roles(out) == out  # idempotent


def test_claude_codes_trailing_system_reminder_stays_where_it_was_sent() -> None:
    """Claude Code 2.1.328 (captures/claude/012 → 013): a role "system" reminder after the last user
    turn, then the answer and a new question. The reminder must not move into the new question:
    the earlier turn would render differently and the cached prefix would be lost."""
    before = [Message("system", "You are Claude."), Message("user", "Read calc.py"),
              Message("system", "<system-reminder>todo list empty</system-reminder>")]
    after = [*before, Message("assistant", "Done."), Message("user", "What is 2+2?")]
    first, second = alternate_roles(before), alternate_roles(after)
    assert first[-1] == Message("user", "Read calc.py\n\n<system-reminder>todo list empty</system-reminder>")
    assert second[: len(first)] == first


@given(messages=MESSAGES, more=MESSAGES)
def test_appending_messages_changes_nothing_before_the_last_merged_turn(
        messages: list[Message], more: list[Message]) -> None:
    """The prefix cache's rule: a later request (the same messages and more) renders every earlier
    turn the same; only the last turn may grow (a turn merged with what follows it)."""
    first, second = alternate_roles(messages), alternate_roles([*messages, *more])
    if not first:
        return
    assert second[: len(first) - 1] == first[:-1]
    grown = second[len(first) - 1]
    assert grown.role == first[-1].role and grown.content.startswith(first[-1].content)
