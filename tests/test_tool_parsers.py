"""Tool-call parsers on realistic model output (Qwen2.5's forms included), and the streaming
wrapper's equivalence with whole-text parsing however the text is split. Pure: no model."""

from __future__ import annotations

import itertools
import json
import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from engine.tool_parsers import (
    HermesParser,
    Llama3JsonParser,
    MistralParser,
    ToolCallParser,
    ToolCallStream,
    new_call_id,
    parser_for,
)
from policies.conversation_types import TextDelta, ToolCall, ToolCallDelta

# ---------------------------------------------------------------------------------------------
# Hermes
# ---------------------------------------------------------------------------------------------

HERMES_SAMPLES = [
    # Qwen 2.5 style: prose, then a call on its own lines.
    'I\'ll check the weather for you.\n<tool_call>\n{"name": "get_weather", "arguments": '
    '{"city": "Zürich", "unit": "celsius"}}\n</tool_call>',
    # Two calls back to back, compact form from the injected prompt.
    '<tool_call>{"name": "read_file", "arguments": {"path": "a.py"}}</tool_call>\n'
    '<tool_call>{"name": "read_file", "arguments": {"path": "b.py"}}</tool_call>',
    # Generation stopped before the closing tag.
    'Searching.\n<tool_call>\n{"name": "search", "arguments": {"q": "日本 旅行 🚄"}}\n',
    # "parameters" instead of "arguments", and trailing prose.
    '<tool_call>{"name": "ls", "parameters": {"dir": "/tmp"}}</tool_call>\nWaiting for results.',
    # Broken JSON stays as text; the valid call after it is still found.
    'Try: <tool_call>{"name": "x", "arguments": {"a": 1}</tool_call> and '
    '<tool_call>{"name": "y", "arguments": {}}</tool_call>',
    # A partial tag at the very end is plain text.
    "The tag is written <tool_",
    # No markup at all, with things that look a bit like it.
    "Use <b>bold</b> and {braces} and <tool> freely.",
    # Marker mentioned in prose, never closed, not JSON.
    "Models emit <tool_call> tags when they call tools.",
    "",
]


def test_hermes_prose_then_call() -> None:
    content, calls = HermesParser().parse(HERMES_SAMPLES[0])
    assert content == "I'll check the weather for you.\n"
    assert calls == [("get_weather", '{"city": "Zürich", "unit": "celsius"}')]


def test_hermes_multiple_calls_in_order() -> None:
    content, calls = HermesParser().parse(HERMES_SAMPLES[1])
    assert content == ""
    assert calls == [("read_file", '{"path": "a.py"}'), ("read_file", '{"path": "b.py"}')]


def test_hermes_missing_close_tag_at_end() -> None:
    content, calls = HermesParser().parse(HERMES_SAMPLES[2])
    assert content == "Searching.\n"
    assert calls == [("search", '{"q": "日本 旅行 🚄"}')]  # not \\u-escaped


def test_hermes_parameters_alias_and_trailing_prose() -> None:
    content, calls = HermesParser().parse(HERMES_SAMPLES[3])
    assert calls == [("ls", '{"dir": "/tmp"}')]
    assert content == "\nWaiting for results."


def test_hermes_broken_json_stays_as_text() -> None:
    content, calls = HermesParser().parse(HERMES_SAMPLES[4])
    assert calls == [("y", "{}")]
    assert content == 'Try: <tool_call>{"name": "x", "arguments": {"a": 1}</tool_call> and '


@pytest.mark.parametrize("text", HERMES_SAMPLES[5:])
def test_hermes_text_without_valid_calls_is_unchanged(text: str) -> None:
    assert HermesParser().parse(text) == (text, [])


def test_hermes_keeps_argument_key_order_and_decodes_double_encoding() -> None:
    text = '<tool_call>{"name": "f", "arguments": "{\\"z\\": 1, \\"a\\": [true, null]}"}</tool_call>'
    assert HermesParser().parse(text) == ("", [("f", '{"z": 1, "a": [true, null]}')])


@pytest.mark.parametrize(
    "body",
    [
        '{"arguments": {"a": 1}}',  # no name
        '{"name": "", "arguments": {}}',  # empty name
        '{"name": "f", "arguments": [1, 2]}',  # arguments not an object
        '{"name": "f", "arguments": "not json"}',
        '["f", {}]',
        "",
    ],
)
def test_hermes_rejects_non_calls(body: str) -> None:
    text = f"<tool_call>{body}</tool_call>"
    assert HermesParser().parse(text) == (text, [])


def test_hermes_missing_arguments_means_none() -> None:
    assert HermesParser().parse('<tool_call>{"name": "now"}</tool_call>') == ("", [("now", "{}")])


# ---------------------------------------------------------------------------------------------
# Qwen2.5 (read by the Hermes parser): every form its output takes
# ---------------------------------------------------------------------------------------------

QWEN_SAMPLES = [
    # 0: what its own chat template asks for.
    '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>',
    # 1: several tagged calls, one per line.
    '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>\n'
    '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Oslo"}}\n</tool_call>',
    # 2: bare JSON, the whole output.
    '{"name": "get_weather", "arguments": {"city": "Paris"}}',
    # 3: several bare objects, newline-separated, with surrounding whitespace.
    '\n {"name": "a", "arguments": {"x": 1}}\n{"name": "b", "arguments": {}}\n',
    # 4: a ```json fence, the whole output.
    '```json\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n```',
    # 5: prose, then a fence with an array of two calls, then prose.
    'I will look it up.\n```json\n[{"name": "a", "arguments": {"x": 1}}, {"name": "b", "arguments": {"y": 2}}]\n```\nDone.',
    # 6: a fence cut short by the token limit.
    '```json\n{"name": "get_weather", "arguments": {"city": "Paris"}}',
    # 7: two objects inside one tag.
    '<tool_call>\n{"name": "a", "arguments": {}}\n{"name": "b", "arguments": {"q": "ü"}}\n</tool_call>',
    # 8: a JSON answer that is not a call (no arguments key) stays text.
    '{"name": "Paris", "population": 2102650}',
    # 9: a ```json fence of ordinary data stays text.
    'Here is the config:\n```json\n{"debug": true}\n```\n',
    # 10: code fences of other languages stay text.
    'Run:\n```python\nprint({"name": "x", "arguments": {}})\n```',
    # 11: bare JSON after prose is prose (only a leading object is a call).
    'The call would be {"name": "a", "arguments": {}} but I will not make it.',
    # 12: a fence whose JSON is followed by more than the closing fence stays text.
    '```json\n{"name": "a", "arguments": {}} trailing\n```',
]


@pytest.mark.parametrize(
    ("index", "content", "calls"),
    [
        (0, "", [("get_weather", '{"city": "Paris"}')]),
        (1, "", [("get_weather", '{"city": "Paris"}'), ("get_weather", '{"city": "Oslo"}')]),
        (2, "", [("get_weather", '{"city": "Paris"}')]),
        (3, "", [("a", '{"x": 1}'), ("b", "{}")]),
        (4, "", [("get_weather", '{"city": "Paris"}')]),
        (5, "I will look it up.\n\nDone.", [("a", '{"x": 1}'), ("b", '{"y": 2}')]),
        (6, "", [("get_weather", '{"city": "Paris"}')]),
        (7, "", [("a", "{}"), ("b", '{"q": "ü"}')]),
    ],
)
def test_qwen_forms_are_calls(index: int, content: str, calls: list[tuple[str, str]]) -> None:
    assert HermesParser().parse(QWEN_SAMPLES[index]) == (content, calls)


@pytest.mark.parametrize("text", QWEN_SAMPLES[8:])
def test_qwen_look_alikes_are_text(text: str) -> None:
    assert HermesParser().parse(text) == (text, [])


def test_qwen_template_renders_calls_the_parser_reads() -> None:
    """The exact text Qwen's own template writes for an assistant call parses back to that call."""
    rendered = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris", "days": [1, 2]}}\n</tool_call>'
    assert HermesParser().parse(rendered) == ("", [("get_weather", '{"city": "Paris", "days": [1, 2]}')])


_QWEN_CALLS = st.builds(
    lambda name, args: json.dumps({"name": name, "arguments": args}, ensure_ascii=False),
    st.sampled_from(["get_weather", "read_file", "f"]),
    st.dictionaries(st.sampled_from(["city", "path", "n"]),
                    st.one_of(st.text(max_size=8), st.integers(-5, 5), st.booleans()), max_size=3),
)


@st.composite
def _qwen_outputs(draw: st.DrawFn) -> tuple[str, int]:
    """A Qwen2.5 output in one of its forms, and how many calls it holds."""
    calls = draw(st.lists(_QWEN_CALLS, min_size=1, max_size=3))
    form = draw(st.sampled_from(["tags", "bare", "fence", "fence-array"]))
    prose = draw(st.sampled_from(["", "Let me check.\n", "Sure! "]))
    if form == "tags":
        return prose + "\n".join(f"<tool_call>\n{c}\n</tool_call>" for c in calls), len(calls)
    if form == "bare":
        return "\n".join(calls), len(calls)
    body = "[" + ", ".join(calls) + "]" if form == "fence-array" else "\n".join(calls)
    return f"{prose}```json\n{body}\n```", len(calls)


@settings(max_examples=300, deadline=None)
@given(output=_qwen_outputs(), data=st.data())
def test_qwen_forms_stream_like_whole_text_under_any_chunking(output: tuple[str, int], data: st.DataObject) -> None:
    text, n_calls = output
    content, calls = HermesParser().parse(text)
    assert len(calls) == n_calls
    assert all(isinstance(json.loads(arguments), dict) for _, arguments in calls)
    assert "<tool_call>" not in content and "```" not in content
    cuts = sorted(data.draw(st.lists(st.integers(0, len(text)), max_size=8)))
    chunks = [text[a:b] for a, b in zip([0, *cuts], [*cuts, len(text)])]
    _assert_matches_parse(HermesParser(), text, chunks)


# ---------------------------------------------------------------------------------------------
# Llama 3
# ---------------------------------------------------------------------------------------------

LLAMA3_SAMPLES = [
    '{"name": "get_weather", "parameters": {"city": "San Francisco", "unit": "fahrenheit"}}',
    '  \n{"type": "function", "name": "a", "parameters": {"x": 1}}; '
    '{"name": "b", "arguments": {"y": "ß"}}\n',
    '<|python_tag|>{"name": "search", "parameters": {"query": "llama 3.1 release"}}',
    'Sure, searching now.<|python_tag|>{"name": "search", "parameters": {"query": "x"}}',
    'Here is the JSON you asked for: {"name": "Bob", "parameters": {"age": 3}}',
    '{"name": "Bob", "age": 3}',
    '{"name": "f", "parameters": {"a": 1}',
    "<|python_tag|>brave_search.call(query=\"weather\")",
    "function f() { return {a: 1}; }",
    "",
]


def test_llama3_exact_json_object() -> None:
    assert Llama3JsonParser().parse(LLAMA3_SAMPLES[0]) == (
        "",
        [("get_weather", '{"city": "San Francisco", "unit": "fahrenheit"}')],
    )


def test_llama3_semicolon_separated_with_whitespace() -> None:
    assert Llama3JsonParser().parse(LLAMA3_SAMPLES[1]) == (
        "",
        [("a", '{"x": 1}'), ("b", '{"y": "ß"}')],
    )


def test_llama3_python_tag() -> None:
    parser = Llama3JsonParser()
    assert parser.parse(LLAMA3_SAMPLES[2]) == ("", [("search", '{"query": "llama 3.1 release"}')])
    assert parser.parse(LLAMA3_SAMPLES[3]) == ("Sure, searching now.", [("search", '{"query": "x"}')])


@pytest.mark.parametrize("text", LLAMA3_SAMPLES[4:])
def test_llama3_non_calls_are_text(text: str) -> None:
    # JSON inside prose, plain JSON answers, broken JSON, builtin-tool python, code.
    assert Llama3JsonParser().parse(text) == (text, [])


# ---------------------------------------------------------------------------------------------
# Mistral
# ---------------------------------------------------------------------------------------------

MISTRAL_SAMPLES = [
    '[TOOL_CALLS] [{"name": "get_weather", "arguments": {"location": "Paris, FR"}, "id": "a1B2c3D4e"}]',
    'Let me look both up.[TOOL_CALLS][{"name": "a", "arguments": {"n": 1}}, '
    '{"name": "b", "arguments": "{\\"m\\": \\"é\\"}"}]',
    '[TOOL_CALLS]get_weather[ARGS]{"city": "Lyon"}[TOOL_CALLS]get_time[ARGS]{"tz": "CET"}',
    '[TOOL_CALLS]lookup[CALL_ID]abc123XYZ[ARGS] {"k": [1, 2]}',
    '[TOOL_CALLS] [{"name": "a", "arguments": {"n": 1}]',
    "[TOOL_CALLS] sorry, I cannot",
    "A [TOOL_ plain sentence",
    "",
]


def test_mistral_array_form() -> None:
    parser = MistralParser()
    assert parser.parse(MISTRAL_SAMPLES[0]) == ("", [("get_weather", '{"location": "Paris, FR"}')])
    assert parser.parse(MISTRAL_SAMPLES[1]) == (
        "Let me look both up.",
        [("a", '{"n": 1}'), ("b", '{"m": "é"}')],
    )


def test_mistral_named_form() -> None:
    parser = MistralParser()
    assert parser.parse(MISTRAL_SAMPLES[2]) == (
        "",
        [("get_weather", '{"city": "Lyon"}'), ("get_time", '{"tz": "CET"}')],
    )
    assert parser.parse(MISTRAL_SAMPLES[3]) == ("", [("lookup", '{"k": [1, 2]}')])


@pytest.mark.parametrize("text", MISTRAL_SAMPLES[4:])
def test_mistral_non_calls_are_text(text: str) -> None:
    assert MistralParser().parse(text) == (text, [])


def test_parser_for() -> None:
    assert isinstance(parser_for("hermes"), HermesParser)
    assert isinstance(parser_for("llama3_json"), Llama3JsonParser)
    assert isinstance(parser_for("mistral"), MistralParser)
    with pytest.raises(ValueError, match="unknown tool format 'xml'"):
        parser_for("xml")


def test_arguments_are_always_json_objects() -> None:
    all_samples = [
        (HermesParser(), HERMES_SAMPLES),
        (Llama3JsonParser(), LLAMA3_SAMPLES),
        (MistralParser(), MISTRAL_SAMPLES),
    ]
    seen = 0
    for parser, samples in all_samples:
        for text in samples:
            for _, arguments in parser.parse(text)[1]:
                assert isinstance(json.loads(arguments), dict)
                seen += 1
    assert seen >= 15


# ---------------------------------------------------------------------------------------------
# Streaming
# ---------------------------------------------------------------------------------------------

CALL_ID = re.compile(r"^call_[0-9a-f]{24}$")
ALL_CASES = (
    [(HermesParser, t) for t in HERMES_SAMPLES + QWEN_SAMPLES]
    + [(Llama3JsonParser, t) for t in LLAMA3_SAMPLES]
    + [(MistralParser, t) for t in MISTRAL_SAMPLES]
)


def _run(parser: ToolCallParser, chunks: list[str]) -> tuple[list[TextDelta | ToolCallDelta], ToolCallStream]:
    stream = ToolCallStream(parser)
    events: list[TextDelta | ToolCallDelta] = []
    for chunk in chunks:
        events.extend(stream.feed(chunk))
    events.extend(stream.finish())
    return events, stream


def _assert_matches_parse(parser: ToolCallParser, text: str, chunks: list[str]) -> None:
    events, stream = _run(parser, chunks)
    content, calls = parser.parse(text)
    texts = [e.text for e in events if isinstance(e, TextDelta)]
    deltas = [e for e in events if isinstance(e, ToolCallDelta)]
    assert all(texts), "no empty text deltas"
    assert "".join(texts) == content
    assert [(d.call.name, d.call.arguments) for d in deltas] == calls
    assert [d.index for d in deltas] == list(range(len(calls)))
    assert all(CALL_ID.match(d.call.id) for d in deltas)
    assert len({d.call.id for d in deltas}) == len(deltas)
    assert stream.has_tool_calls == bool(calls)


@pytest.mark.parametrize(("parser_cls", "text"), ALL_CASES)
def test_stream_equals_parse_at_every_split(parser_cls: type, text: str) -> None:
    parser = parser_cls()
    for cut in range(len(text) + 1):
        _assert_matches_parse(parser, text, [text[:cut], text[cut:]])
    _assert_matches_parse(parser, text, list(text))  # one character at a time


@pytest.mark.parametrize(("parser_cls", "text"), ALL_CASES)
def test_stream_equals_parse_at_every_pair_of_splits(parser_cls: type, text: str) -> None:
    parser = parser_cls()
    step = max(1, len(text) // 25)  # keep it quadratic but bounded
    for a, b in itertools.combinations(range(0, len(text) + 1, step), 2):
        _assert_matches_parse(parser, text, [text[:a], text[a:b], text[b:]])


_FRAGMENTS = st.sampled_from(
    [
        "<tool_call>", "</tool_call>", "<tool_", "<", "\n", " ", "{", "}", ";", "```json", "```", "``",
        '{"name": "f", "arguments": {"a": 1}}', '{"name": "g", "parameters": {}}',
        '"name"', "[TOOL_CALLS]", "[TOOL_", "[", "]", "[ARGS]", "h", "<|python_tag|>", "<|py",
        '[{"name": "m", "arguments": {}}]', "ü", "text",
    ]
)


@settings(max_examples=400, deadline=None)
@given(
    pieces=st.lists(_FRAGMENTS, max_size=12),
    parser_cls=st.sampled_from([HermesParser, Llama3JsonParser, MistralParser]),
    data=st.data(),
)
def test_stream_equals_parse_for_arbitrary_text_and_splits(
    pieces: list[str], parser_cls: type, data: st.DataObject
) -> None:
    text = "".join(pieces)
    cuts = sorted(data.draw(st.lists(st.integers(0, len(text)), max_size=6)))
    chunks = [text[a:b] for a, b in zip([0, *cuts], [*cuts, len(text)])]
    _assert_matches_parse(parser_cls(), text, chunks)


def test_stream_sends_prose_before_the_end() -> None:
    stream = ToolCallStream(HermesParser())
    assert stream.feed("Let me ") == [TextDelta("Let me ")]
    assert stream.feed("check <tool") == [TextDelta("check ")]  # "<tool" may open a marker
    assert stream.feed("_call>{") == []
    assert stream.feed('"name": "f", "arguments": {}}</tool_call> ok') == []
    assert stream.has_tool_calls is False  # not known until finish()
    events = stream.finish()
    assert events[0] == TextDelta(" ok")
    assert isinstance(events[1], ToolCallDelta) and events[1].call.name == "f"
    assert stream.has_tool_calls is True


def test_stream_releases_held_text_once_it_cannot_be_a_marker() -> None:
    stream = ToolCallStream(HermesParser())
    assert stream.feed("a <to") == [TextDelta("a ")]
    assert stream.feed("p> b") == [TextDelta("<top> b")]
    assert stream.finish() == []
    assert stream.has_tool_calls is False


def test_llama3_stream_holds_only_leading_json() -> None:
    stream = ToolCallStream(Llama3JsonParser())
    assert stream.feed("  \n") == []  # could still be a bare JSON call
    assert stream.feed("Sure {x}") == [TextDelta("  \nSure {x}")]  # '{' in prose is prose
    assert stream.finish() == []

    stream = ToolCallStream(Llama3JsonParser(), id_factory=lambda: "call_fixed")
    assert stream.feed('{"name": "f",') == []
    assert stream.feed(' "parameters": {"q": "ü"}}') == []
    assert stream.finish() == [ToolCallDelta(0, ToolCall("call_fixed", "f", '{"q": "ü"}'))]


def test_stream_finish_flushes_held_partial_marker() -> None:
    stream = ToolCallStream(MistralParser())
    assert stream.feed("see [TOOL") == [TextDelta("see ")]
    assert stream.finish() == [TextDelta("[TOOL")]


def test_stream_uses_id_factory_in_order() -> None:
    ids = iter(["call_a", "call_b"])
    stream = ToolCallStream(HermesParser(), id_factory=lambda: next(ids))
    stream.feed(HERMES_SAMPLES[1])
    events = stream.finish()
    assert [(e.index, e.call.id) for e in events if isinstance(e, ToolCallDelta)] == [
        (0, "call_a"),
        (1, "call_b"),
    ]


def test_feed_after_finish_is_an_error() -> None:
    stream = ToolCallStream(HermesParser())
    stream.finish()
    with pytest.raises(RuntimeError):
        stream.feed("x")


def test_new_call_id_shape() -> None:
    ids = {new_call_id() for _ in range(100)}
    assert len(ids) == 100
    assert all(CALL_ID.match(i) and re.match(r"^[a-zA-Z0-9_-]+$", i) for i in ids)
