"""The lazy tool-call grammar under tool_choice "auto" with parallel calls (what Claude Code, Codex
and most agents send): free text until the answer opens its family's call markup, then only calls
of offered tools with arguments their schema accepts. Checked by llama.cpp's own grammar engine
(vocabulary only) and read back by the family's parser.
Model: Gemma 3 270M's vocabulary only (no evaluation).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import jsonschema
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from engine.constraints import OutputConstraint, grammar_for
from engine.tool_parsers import parser_for
from policies.conversation_types import ToolSpec
from tests.grammar_check import GrammarChecker
from tests.test_constraints import FORMATS, MARKERS, TOOLS, calls_text

AUTO = OutputConstraint()  # auto, parallel calls allowed


@pytest.fixture(scope="module")
def checker(model_path: Path) -> GrammarChecker:
    return GrammarChecker(model_path)


def lead(fmt: str) -> str:
    return MARKERS[fmt] if fmt == "llama3_json" else ""  # Llama 3 reads bare JSON only at the start


@pytest.mark.parametrize("fmt", FORMATS)
def test_auto_takes_prose_and_every_call_shape_the_parser_reads(checker: GrammarChecker, fmt: str) -> None:
    g = grammar_for(AUTO, TOOLS, fmt)
    assert g is not None and not g.loose
    one = calls_text(fmt, [("get_weather", {"city": "Oslo", "days": 2})])
    two = calls_text(fmt, [("ping", {}), ("add_note", {"text": "hi", "pinned": True})])
    for text in ("", "Just text, no call.", "Checking. " + lead(fmt) + one, "Two at once: " + lead(fmt) + two,
                 lead(fmt) + one):
        assert checker.accepts(g.text, text), text
        content, calls = parser_for(fmt).parse(text)
        assert all(name in {t.name for t in TOOLS} for name, _ in calls)
    _content, calls = parser_for(fmt).parse("Two at once: " + lead(fmt) + two)
    assert [name for name, _ in calls] == ["ping", "add_note"]


@pytest.mark.parametrize("fmt", FORMATS)
def test_auto_refuses_a_tool_that_was_not_offered_and_arguments_the_schema_refuses(
        checker: GrammarChecker, fmt: str) -> None:
    g = grammar_for(AUTO, TOOLS, fmt)
    assert g is not None
    for name, args in (("gitStatus", {}), ("get_weather", {"city": "Rome", "days": 1}),
                       ("get_weather", {"city": "Oslo"}), ("add_note", {"text": "x", "extra": 1})):
        text = "Let me look. " + lead(fmt) + calls_text(fmt, [(name, args)])
        assert not checker.accepts(g.text, text, complete=False), (name, args)


def test_hermes_calls_may_have_prose_between_them(checker: GrammarChecker) -> None:
    g = grammar_for(AUTO, TOOLS, "hermes")
    assert g is not None
    text = ("First the weather. " + calls_text("hermes", [("get_weather", {"city": "Lima", "days": 1})])
            + " Then a note. " + calls_text("hermes", [("ping", {})]) + " Done.")
    assert checker.accepts(g.text, text)
    assert not checker.accepts(g.text, "Oops <tool_call>" + json.dumps({"name": "ls", "arguments": {}}),
                               complete=False)


def test_a_schema_the_converter_cannot_take_gives_that_tool_any_object(checker: GrammarChecker) -> None:
    odd = ToolSpec("odd", "", {"type": "object", "properties": {"x": {"type": "frobnicate"}}})
    g = grammar_for(AUTO, (*TOOLS, odd), "hermes")
    assert g is not None and g.loose == ("odd",)
    assert checker.accepts(g.text, calls_text("hermes", [("odd", {"anything": [1, 2]})]))
    assert not checker.accepts(g.text, calls_text("hermes", [("even", {})]))


PROPERTY = st.sampled_from([
    {"type": "string"}, {"type": "integer"}, {"type": "boolean"}, {"type": "number"},
    {"type": "string", "enum": ["a", "b c"]}, {"type": "array", "items": {"type": "integer"}},
    {"type": "object", "properties": {"inner": {"type": "string"}}, "required": ["inner"]},
])
NAMES = st.text(alphabet="abcdefghijklmnopqrstuvwxyz_", min_size=1, max_size=10)


@st.composite
def tool_and_call(draw: Any) -> tuple[list[ToolSpec], str, dict[str, Any]]:
    props = draw(st.dictionaries(NAMES, PROPERTY, min_size=0, max_size=4))
    required = sorted(draw(st.sets(st.sampled_from(sorted(props)))) if props else set())
    schema = {"type": "object", "properties": props, "required": required}
    names = draw(st.lists(NAMES, min_size=1, max_size=3, unique=True))
    tools = [ToolSpec(n, "", schema) for n in names]
    values = {"string": st.text(alphabet="abc xyz", max_size=6), "integer": st.integers(-99, 99),
              "boolean": st.booleans(), "number": st.integers(-9, 9)}
    args: dict[str, Any] = {}
    # The converter's grammar writes required keys first, then optional ones, each in schema order.
    for key, spec in sorted(props.items(), key=lambda kv: kv[0] not in required):
        if key not in required and draw(st.booleans()):
            continue
        if "enum" in spec:
            args[key] = draw(st.sampled_from(spec["enum"]))
        elif spec["type"] == "array":
            args[key] = draw(st.lists(st.integers(0, 9), max_size=3))
        elif spec["type"] == "object":
            args[key] = {"inner": draw(values["string"])}
        else:
            args[key] = draw(values[spec["type"]])
    jsonschema.validate(args, schema)
    return tools, draw(st.sampled_from(names)), args


@given(case=tool_and_call())
@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
def test_any_offered_tool_with_valid_arguments_passes_and_an_unknown_name_never(
        checker: GrammarChecker, case: tuple[list[ToolSpec], str, dict[str, Any]]) -> None:
    tools, name, args = case
    g = grammar_for(AUTO, tools, "hermes")
    assert g is not None and not g.loose
    assert checker.accepts(g.text, "Sure. " + calls_text("hermes", [(name, args)]))
    stranger = "zz" + "".join(t.name for t in tools)
    assert not checker.accepts(g.text, "Sure. " + calls_text("hermes", [(stranger, args)]), complete=False)


@pytest.mark.parametrize("fmt", ["hermes", "llama3_json"])
def test_a_bare_json_call_at_the_start_is_shaped_too(checker: GrammarChecker, fmt: str) -> None:
    """Qwen and Llama 3 also write a call as a bare JSON object; their parsers read one at the start."""
    g = grammar_for(AUTO, TOOLS, fmt)
    assert g is not None
    key = "parameters" if fmt == "llama3_json" else "arguments"
    good = json.dumps({"name": "get_weather", key: {"city": "Lima", "days": 3}})
    assert checker.accepts(g.text, "  " + good)
    _content, calls = parser_for(fmt).parse("  " + good)
    assert calls == [("get_weather", '{"city": "Lima", "days": 3}')]
    for bad in ({"name": "calc.py", key: {}}, {"name": "get_weather", key: {"city": "Rome", "days": 1}}):
        assert not checker.accepts(g.text, json.dumps(bad), complete=False), bad
    assert not checker.accepts(g.text, '{"answer": 42}', complete=False)  # no other JSON object at the start


def test_a_fenced_call_is_shaped_like_a_tagged_one(checker: GrammarChecker) -> None:
    """Qwen on Claude Code's prompt writes its call in a ```json fence, which the parser reads too."""
    g = grammar_for(AUTO, TOOLS, "hermes")
    assert g is not None
    fenced = 'Run this:\n```json\n{"name": "get_weather", "arguments": {"city": "Oslo", "days": 1}}\n```\nDone.'
    assert checker.accepts(g.text, fenced)
    assert parser_for("hermes").parse(fenced)[1] == [("get_weather", '{"city": "Oslo", "days": 1}')]
    assert not checker.accepts(g.text, 'Run this:\n```json\n{"name": "calc.py", "arguments": {}}', complete=False)
    assert checker.accepts(g.text, "A shell block:\n```sh\nls -la\n```\n")  # other fences stay prose
