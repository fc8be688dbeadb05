"""policies.volatile: per-request values removed from system prompts, nothing else touched.
Model: none (no model is loaded).
"""

from __future__ import annotations

import pytest

from gateway.api import messages as messages_api
from policies.volatile import strip_volatile_system

HEADER = "x-anthropic-billing-header: cc_version=2.1.177.01c; cc_entrypoint=cli; cch={};"
STABLE = "x-anthropic-billing-header: cc_version=2.1.177.01c; cc_entrypoint=cli;"
SYSTEM = "{}\nYou are Claude Code, Anthropic's official CLI for Claude.\nToday's date is 2025-06-01."


def test_cch_removed_and_rest_kept() -> None:
    assert strip_volatile_system(HEADER.format("36ee5")) == STABLE
    text = SYSTEM.format(HEADER.format("0aaa9"))
    assert strip_volatile_system(text) == SYSTEM.format(STABLE)


def test_two_requests_differing_only_in_cch_become_identical() -> None:
    a = strip_volatile_system(SYSTEM.format(HEADER.format("36ee5")))
    b = strip_volatile_system(SYSTEM.format(HEADER.format("0aaa9")))
    assert a == b


@pytest.mark.parametrize("header", [
    "x-anthropic-billing-header: cch=abc12; cc_version=2.1.1.aaa;",  # field order may change
    "x-anthropic-billing-header: cc_version=2.1.1.aaa; cch=abc12",  # no trailing semicolon
    "X-Anthropic-Billing-Header: cc_version=2.1.1.aaa; cch=abc12;",  # header names are case-blind
])
def test_field_position_and_case(header: str) -> None:
    out = strip_volatile_system(header)
    assert "cch" not in out and "cc_version=2.1.1.aaa;" in out


def test_idempotent_and_identity_without_header() -> None:
    text = SYSTEM.format(HEADER.format("12345"))
    once = strip_volatile_system(text)
    assert strip_volatile_system(once) == once
    plain = "You are a helpful assistant. cch=12345; stays here."
    assert strip_volatile_system(plain) is plain


@pytest.mark.parametrize("text", [
    # The header quoted inside a line (e.g. a pasted log) is not the header: left alone.
    "Here is a log line: x-anthropic-billing-header: cc_version=1; cch=99999;",
    # Meaningful per-day or per-repo text is kept even though it changes.
    "Today's date is 2025-06-02.\nWorking directory: /home/me/repo\ncch=1 is a variable name",
    # A word that merely ends in cch (e.g. "xcch=") is not the field.
    "x-anthropic-billing-header: cc_version=1; xcch=7;",
])
def test_meaningful_text_untouched(text: str) -> None:
    assert strip_volatile_system(text) == text


def test_anthropic_adapter_strips_first_system_block() -> None:
    def body(cch: str) -> dict[str, object]:
        return {
            "model": "m", "max_tokens": 8,
            "system": [
                {"type": "text", "text": HEADER.format(cch)},
                {"type": "text", "text": "You are Claude Code.", "cache_control": {"type": "ephemeral"}},
            ],
            "messages": [{"role": "user", "content": "hi"}],
        }

    a = messages_api.parse_request(body("36ee5"), {})
    b = messages_api.parse_request(body("0aaa9"), {})
    assert a.messages == b.messages
    assert a.messages[0].role == "system" and "cch=" not in a.messages[0].content
    assert a.messages[0].content.startswith(STABLE)
    # count_tokens parses through the same path, so its count matches what create serves.
    counted = messages_api.parse_count_tokens_request(body("ffff0"), {})
    assert counted.messages == a.messages
