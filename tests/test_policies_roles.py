"""alternate_roles: the shapes strict templates refuse become ones they accept, losing no text."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from engine.chat_templates import select_template
from policies.conversation import Message, ToolCall
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
