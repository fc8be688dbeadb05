"""policies.volatile: Claude Code's billing line removed from system prompts, nothing else touched.
Model: none (no model is loaded).
"""

from __future__ import annotations

import pytest

from gateway.api import messages as messages_api
from policies.volatile import strip_volatile_system

# The three hex digits after the version hash part of the session's first user message; `cch`
# changes on every request.
HEADER = "x-anthropic-billing-header: cc_version=2.1.328.{}; cc_entrypoint=cli; cch={};"
REST = "You are Claude Code, Anthropic's official CLI for Claude.\nToday's date is 2025-06-01."


def test_billing_line_removed_with_its_line_breaks() -> None:
    assert strip_volatile_system(HEADER.format("01c", "36ee5")) == ""
    assert strip_volatile_system(HEADER.format("01c", "36ee5") + "\n" + REST) == REST
    # Blocks joined with a blank line between them (how the adapter joins system blocks).
    assert strip_volatile_system(HEADER.format("01c", "36ee5") + "\n\n" + REST) == REST


def test_other_requests_and_other_sessions_become_identical() -> None:
    seen = {strip_volatile_system(HEADER.format(suffix, cch) + "\n\n" + REST)
            for suffix, cch in [("01c", "36ee5"), ("01c", "0aaa9"), ("7f2", "36ee5"), ("a90", "12345")]}
    assert seen == {REST}


@pytest.mark.parametrize("header", [
    "x-anthropic-billing-header: cch=abc12; cc_version=2.1.1.aaa;",  # field order may change
    "x-anthropic-billing-header: cc_version=2.1.1.aaa; cch=abc12",  # no trailing semicolon
    "X-Anthropic-Billing-Header: cc_version=2.1.1.aaa; cch=abc12;",  # header names are case-blind
])
def test_field_position_and_case(header: str) -> None:
    assert strip_volatile_system(header + "\n" + REST) == REST


def test_idempotent_and_identity_without_header() -> None:
    once = strip_volatile_system(HEADER.format("01c", "12345") + "\n" + REST)
    assert strip_volatile_system(once) == once
    plain = "You are a helpful assistant. cch=12345; stays here."
    assert strip_volatile_system(plain) is plain


@pytest.mark.parametrize("text", [
    # The header quoted inside a line (e.g. a pasted log) is not the header: left alone.
    "Here is a log line: x-anthropic-billing-header: cc_version=1; cch=99999;",
    # Meaningful per-day or per-repo text is kept even though it changes.
    "Today's date is 2025-06-02.\nWorking directory: /home/me/repo\ncch=1 is a variable name",
    # Another header whose name merely starts the same is not this one.
    "x-anthropic-billing-headers: cc_version=1; cch=7;",
])
def test_meaningful_text_untouched(text: str) -> None:
    assert strip_volatile_system(text) == text


def test_anthropic_adapter_strips_first_system_block() -> None:
    def body(suffix: str, cch: str) -> dict[str, object]:
        return {
            "model": "m", "max_tokens": 8,
            "system": [
                {"type": "text", "text": HEADER.format(suffix, cch)},
                {"type": "text", "text": "You are Claude Code.", "cache_control": {"type": "ephemeral"}},
            ],
            "messages": [{"role": "user", "content": "hi"}],
        }

    a = messages_api.parse_request(body("01c", "36ee5"), {})
    b = messages_api.parse_request(body("7f2", "0aaa9"), {})
    assert a.messages == b.messages
    assert a.messages[0].role == "system" and a.messages[0].content == "You are Claude Code."
    # count_tokens parses through the same path, so its count matches what create serves.
    counted = messages_api.parse_count_tokens_request(body("a90", "ffff0"), {})
    assert counted.messages == a.messages
