"""Fuzz: mixed block types in every API never make an adapter fail with anything but a 4xx.

Each request is built from the block and item types the three APIs define (valid, malformed and
unknown ones mixed), parsed, rendered through a strict chat template (with the role
normalisation the engine falls back to) and answered through the output encoders. Pure: no model.
"""

from __future__ import annotations

from collections.abc import Sequence
from types import SimpleNamespace
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from engine.base import PromptRejected
from engine.chat_templates import ChatTemplateError, builtin_template, select_template
from gateway.api import chat as chat_api
from gateway.api import chat_output, messages_output, responses_output
from gateway.api import messages as messages_api
from gateway.api import responses as responses_api
from gateway.errors import ApiError
from policies.conversation_types import (
    Conversation,
    Finished,
    Message,
    ReasoningDelta,
    TextDelta,
    ToolCall,
    ToolCallDelta,
    Usage,
)
from policies.roles import alternate_roles

PNG = "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mNgAAIAAAUAAen63NgAAAAASUVORK5CYII="
TEXT = st.text(max_size=12)
IDS = st.sampled_from(["t1", "t2", "call_1", "ghost"])
JUNK = st.one_of(st.none(), st.integers(), TEXT, st.just([]), st.just({}))

IMAGE_SOURCES = st.sampled_from([
    {"type": "base64", "media_type": "image/png", "data": PNG},
    {"type": "url", "url": "https://example.com/a.png"},
    {"type": "file", "file_id": "file_1"},
    {"type": "base64"},
    {},
])
ANTHROPIC_BLOCK = st.one_of(
    st.builds(lambda t: {"type": "text", "text": t, "cache_control": {"type": "ephemeral"}}, TEXT),
    st.builds(lambda s: {"type": "image", "source": s}, IMAGE_SOURCES),
    st.builds(lambda s: {"type": "document", "source": s, "title": "d"}, st.sampled_from([
        {"type": "base64", "media_type": "application/pdf", "data": PNG},
        {"type": "text", "media_type": "text/plain", "data": "plain"}, {"type": "content", "content": []}])),
    st.builds(lambda i, n: {"type": "tool_use", "id": i, "name": n, "input": {}}, IDS, st.sampled_from(["Read", "Bash"])),
    st.builds(lambda i, c, e: {"type": "tool_result", "tool_use_id": i, "content": c, "is_error": e}, IDS,
              st.one_of(TEXT, st.lists(st.sampled_from([{"type": "text", "text": "x"},
                                                        {"type": "image", "source": {"type": "url", "url": "u"}},
                                                        {"type": "search_result"}]), max_size=3)), st.booleans()),
    st.builds(lambda t: {"type": "thinking", "thinking": t, "signature": "s"}, TEXT),
    st.just({"type": "redacted_thinking", "data": "x"}),
    st.builds(lambda k: {"type": k}, st.sampled_from(["server_tool_use", "web_search_tool_result", "container_upload"])),
    JUNK,
)
OPENAI_PART = st.one_of(
    st.builds(lambda t: {"type": "text", "text": t}, TEXT),
    st.builds(lambda t: {"type": "input_text", "text": t}, TEXT),
    st.builds(lambda t: {"type": "output_text", "text": t}, TEXT),
    st.just({"type": "image_url", "image_url": {"url": f"data:image/png;base64,{PNG}"}}),
    st.just({"type": "image_url", "image_url": "https://example.com/a.png"}),
    st.just({"type": "input_image", "image_url": f"data:image/png;base64,{PNG}", "detail": "auto"}),
    st.just({"type": "input_image", "file_id": "f"}),
    st.just({"type": "input_file", "file_data": "data:application/pdf;base64,JVBE", "filename": "a.pdf"}),
    st.just({"type": "input_audio", "input_audio": {"data": PNG, "format": "mp3"}}),
    st.just({"type": "file", "file": {"file_id": "f"}}),
    st.just({"type": "refusal", "refusal": "no"}),
    JUNK,
)
CONTENT = st.one_of(TEXT, st.lists(OPENAI_PART, max_size=4), JUNK)


def anthropic_body(draw: st.DrawFn) -> dict[str, Any]:
    messages = draw(st.lists(st.fixed_dictionaries({
        "role": st.sampled_from(["user", "assistant", "user", "system"]),
        "content": st.one_of(TEXT, st.lists(ANTHROPIC_BLOCK, max_size=4)),
    }), min_size=1, max_size=5))
    return {"model": "m", "max_tokens": 16, "messages": messages,
            "system": draw(st.one_of(st.none(), TEXT, st.just([{"type": "text", "text": "s", "cache_control": {}}]))),
            "tool_choice": draw(st.one_of(st.none(), st.sampled_from([
                {"type": "any", "disable_parallel_tool_use": True}, {"type": "auto"}, {"type": "none"}]))),
            "tools": [{"name": "Read", "input_schema": {"type": "object"}}, {"type": "bash_20250124", "name": "bash"}]}


def chat_body(draw: st.DrawFn) -> dict[str, Any]:
    messages = draw(st.lists(st.one_of(
        st.fixed_dictionaries({"role": st.sampled_from(["system", "developer", "user", "assistant"]), "content": CONTENT}),
        st.fixed_dictionaries({"role": st.just("assistant"), "content": st.none(), "tool_calls": st.just([
            {"id": "call_1", "type": "function", "function": {"name": "f", "arguments": "{}"}}])}),
        st.fixed_dictionaries({"role": st.just("tool"), "tool_call_id": IDS, "content": CONTENT}),
    ), min_size=1, max_size=5))
    return {"model": "m", "messages": messages, "max_tokens": 16,
            "parallel_tool_calls": draw(st.one_of(st.none(), st.booleans())),
            "response_format": draw(st.one_of(st.none(), st.sampled_from([
                {"type": "json_object"}, {"type": "text"}, {"type": "json_schema", "json_schema": {"name": "n", "schema": {}}},
                {"type": "json_schema", "json_schema": {"schema": 3}}, {"type": "yaml"}]))),
            "tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}]}


def responses_body(draw: st.DrawFn) -> dict[str, Any]:
    item = st.one_of(
        st.fixed_dictionaries({"type": st.just("message"), "role": st.sampled_from(["user", "developer", "assistant", "system"]),
                               "content": CONTENT}),
        st.fixed_dictionaries({"type": st.just("function_call"), "call_id": IDS, "name": st.just("shell"),
                               "arguments": st.just("{}")}),
        st.fixed_dictionaries({"type": st.sampled_from(["function_call_output", "custom_tool_call_output",
                                                        "local_shell_call_output"]), "call_id": IDS, "output": CONTENT}),
        st.fixed_dictionaries({"type": st.just("custom_tool_call"), "call_id": IDS, "name": st.just("apply_patch"),
                               "input": st.one_of(TEXT, JUNK)}),
        st.fixed_dictionaries({"type": st.just("local_shell_call"), "call_id": IDS, "status": st.just("completed"),
                               "action": st.one_of(JUNK, st.just({"type": "exec", "command": ["ls"]}))}),
        st.just({"type": "reasoning", "id": "rs", "summary": [], "encrypted_content": "x"}),
        JUNK,
    )
    return {"model": "m", "input": draw(st.one_of(TEXT, st.lists(item, min_size=1, max_size=6))),
            "instructions": "i", "max_output_tokens": 16,
            "parallel_tool_calls": draw(st.one_of(st.none(), st.booleans())),
            "text": draw(st.one_of(st.none(), st.just({"format": {"type": "json_schema", "name": "o", "schema": {}}}))),
            "tool_choice": draw(st.sampled_from(["auto", {"type": "custom", "name": "apply_patch"}, {"type": "local_shell"}])),
            "tools": [{"type": "custom", "name": "apply_patch"}, {"type": "local_shell"},
                      {"type": "function", "name": "shell", "parameters": {}}, {"type": "web_search"}]}


STRICT = select_template({"tokenizer.chat_template": (
    "{%- for m in messages -%}{%- if m.role != 'system' and (m.role == 'user') != "
    "(loop.index0 % 2 == (1 if messages[0].role == 'system' else 0)) -%}"
    "{{ raise_exception('roles must alternate') }}{%- endif -%}{{ m.role }}:{{ m.content }}\n{%- endfor -%}")})
EVENTS = [ReasoningDelta("r"), TextDelta("t"), ToolCallDelta(0, ToolCall("c", "apply_patch", '{"input": "x"}')),
          ToolCallDelta(1, ToolCall("d", "local_shell", '{"command": "ls"}'))]


def _answers_no_call(messages: Sequence[Message]) -> bool:
    """Some tool result comes before any assistant call with its id."""
    called: set[str] = set()
    for m in messages:
        called.update(c.id for c in m.tool_calls)
        if m.role == "tool" and m.tool_call_id not in called:
            return True
    return False


def answer_everything(conv: Conversation) -> None:
    """Render as the engine would (strict template, then normalised roles) and encode a reply."""
    builtin_template("gemma").render(conv.messages, conv.tools)
    try:
        STRICT.render(conv.messages, conv.tools)
    except ChatTemplateError:
        try:
            STRICT.render(alternate_roles(conv.messages), conv.tools)
        except ChatTemplateError:
            # What normalising cannot fix is the engine's named 400 (PromptRejected): an assistant
            # turn first, or a tool result no earlier call asked for (the APIs themselves refuse it).
            normalised = alternate_roles(conv.messages)
            assert ([m.role for m in normalised if m.role != "system"][:1] != ["user"]
                    or _answers_no_call(normalised))
    done = Finished("tool_calls", Usage(10, 2, 0))
    for output in (chat_output, messages_output, responses_output):
        output.complete_response(conv, "id", 1, "t", [e.call for e in EVENTS[2:]], done, reasoning="r")
        encoder = output.StreamEncoder(conv, "id", 1)
        for event in [*EVENTS, done]:
            encoder.feed(event)


PARSERS = [(anthropic_body, messages_api.parse_request), (chat_body, chat_api.parse_request),
           (responses_body, responses_api.parse_request)]


@settings(max_examples=300, suppress_health_check=[HealthCheck.too_slow], deadline=None)
@given(data=st.data(), which=st.integers(min_value=0, max_value=2))
def test_mixed_blocks_never_fail_with_more_than_a_400(data: st.DataObject, which: int) -> None:
    build, parse = PARSERS[which]
    body = data.draw(st.composite(lambda draw: build(draw))())
    try:
        conv = parse(body, {})
    except ApiError as err:
        assert 400 <= err.status < 500 and err.message
        return
    answer_everything(conv)


def test_a_tool_result_no_call_asked_for_is_the_engines_named_400() -> None:
    """Found by the fuzz above: a user turn, then a function_call_output with no function_call. A
    template that insists on alternation refuses it even normalised; the engine says so as
    PromptRejected (the gateway's 400), never an unnamed error."""
    from engine.llama_engine import LlamaEngine

    body = {"model": "m", "instructions": "i", "max_output_tokens": 16,
            "input": [{"type": "message", "role": "user", "content": ""},
                      {"type": "function_call_output", "call_id": "t1", "output": []}]}
    conv = responses_api.parse_request(body, {})
    assert _answers_no_call(conv.messages)
    with pytest.raises(PromptRejected, match="roles must alternate"):
        LlamaEngine.render(SimpleNamespace(template=STRICT), conv.messages, conv.tools)  # type: ignore[arg-type]
