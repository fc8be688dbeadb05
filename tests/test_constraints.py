"""tool_choice / parallel_tool_calls / response_format: normalisation and the grammars that enforce
them, checked by llama.cpp's own grammar engine (vocabulary only, no model evaluation)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from engine.constraints import ConstraintError, OutputConstraint, grammar_for, output_constraint
from engine.gbnf import literal, rules_text, text_without
from engine.tool_parsers import parser_for
from engine.upstream import to_openai_constraint
from policies.conversation_types import ToolSpec
from tests.grammar_check import GrammarChecker

WEATHER = ToolSpec("get_weather", "Weather for a city", {
    "type": "object",
    "properties": {"city": {"type": "string", "enum": ["Paris", "Lima", "Oslo"]}, "days": {"type": "integer"}},
    "required": ["city", "days"],
})
NOTE = ToolSpec("add_note", "", {
    "type": "object",
    "properties": {"text": {"type": "string", "maxLength": 20}, "pinned": {"type": "boolean"}},
    "required": ["text"],
})
PING = ToolSpec("ping")  # no parameters at all
TOOLS = (WEATHER, NOTE, PING)
FORMATS = ("hermes", "llama3_json", "mistral")
MARKERS = {"hermes": "<tool_call>", "llama3_json": "<|python_tag|>", "mistral": "[TOOL_CALLS]"}
settings.register_profile("grammar", max_examples=40, deadline=None,
                          suppress_health_check=[HealthCheck.function_scoped_fixture])


@pytest.fixture(scope="module")
def checker(model_path: Path) -> GrammarChecker:
    return GrammarChecker(model_path)


def calls_text(fmt: str, calls: list[tuple[str, dict[str, Any]]]) -> str:
    """Calls written the way the family's model would write them (and its parser reads them)."""
    key = "parameters" if fmt == "llama3_json" else "arguments"
    bodies = [json.dumps({"name": name, key: args}) for name, args in calls]
    if fmt == "hermes":
        return "\n".join(f"<tool_call>{b}</tool_call>" for b in bodies)
    if fmt == "mistral":
        return "[TOOL_CALLS][" + ", ".join(bodies) + "]"
    return "; ".join(bodies)


def grammar(choice: Any, parallel: bool = True, fmt: str = "hermes", response_format: Any = None,
            tools: tuple[ToolSpec, ...] = TOOLS) -> str:
    found = grammar_for(output_constraint(choice, parallel, response_format, tools), tools, fmt)
    assert found is not None
    return found.text


# --- normalisation ---------------------------------------------------------------------------


def test_tool_choice_normalised() -> None:
    assert output_constraint(None, True, None, TOOLS) == OutputConstraint()
    assert output_constraint("any", True, None, TOOLS).tool_choice == "required"
    named = output_constraint({"name": "ping"}, False, None, TOOLS)
    assert (named.tool_choice, named.tool_name, named.parallel_tool_calls) == ("required", "ping", False)
    openai_shape = output_constraint({"type": "function", "function": {"name": "ping"}}, True, None, TOOLS)
    assert openai_shape.tool_name == "ping"
    assert output_constraint("none", True, None, ()).tool_choice == "none"


@pytest.mark.parametrize("choice, tools", [
    ("required", ()), ({"name": "nope"}, TOOLS), ("sometimes", TOOLS), ({"type": "function"}, TOOLS),
])
def test_unenforceable_tool_choice_is_a_client_error(choice: Any, tools: tuple[ToolSpec, ...]) -> None:
    with pytest.raises(ConstraintError) as caught:
        output_constraint(choice, True, None, tools)
    assert caught.value.param == "tool_choice"


def test_response_format_normalised() -> None:
    schema = {"type": "object", "properties": {"ok": {"type": "boolean"}}}
    flat = output_constraint(None, True, {"type": "json_schema", "name": "r", "schema": schema}, ())
    assert flat.response_format == {"type": "json_schema", "name": "r", "schema": schema, "strict": False}
    assert flat.answer_schema == schema
    nested = output_constraint(None, True, {"type": "json_schema", "json_schema": {"name": "r", "schema": schema,
                                                                                    "strict": True}}, ())
    assert nested.response_format is not None and nested.response_format["strict"] is True
    assert output_constraint(None, True, {"type": "text"}, ()).response_format is None
    assert output_constraint(None, True, {"type": "json_object"}, ()).answer_schema == {"type": "object"}
    for bad in ({"type": "yaml"}, {"type": "json_schema"}, {"type": "json_schema", "schema": "x"}):
        with pytest.raises(ConstraintError):
            output_constraint(None, True, bad, ())


def test_free_answers_get_no_grammar() -> None:
    assert grammar_for(OutputConstraint(), (), "hermes") is None  # no tools: nothing to shape
    assert grammar_for(OutputConstraint("none"), (), "hermes") is None  # no tools: nothing to suppress


def test_unsupported_schema_is_a_client_error() -> None:
    odd = ToolSpec("odd", "", {"type": "object", "properties": {"x": {"type": "frobnicate"}}})
    with pytest.raises(ConstraintError) as caught:
        grammar_for(output_constraint("required", True, None, (odd,)), (odd,), "hermes")
    assert caught.value.param == "tools[0].parameters"


def test_upstream_shapes() -> None:
    assert to_openai_constraint(OutputConstraint(), True) == {}
    assert to_openai_constraint(OutputConstraint("none"), True) == {"tool_choice": "none"}
    forced = to_openai_constraint(OutputConstraint("required", "ping", False), True)
    assert forced == {"tool_choice": {"type": "function", "function": {"name": "ping"}}, "parallel_tool_calls": False}
    fmt = output_constraint(None, True, {"type": "json_schema", "name": "r", "schema": {"type": "object"}}, ())
    assert to_openai_constraint(fmt, False) == {"response_format": {"type": "json_schema", "json_schema": {
        "name": "r", "schema": {"type": "object"}, "strict": False}}}


# --- grammars, through llama.cpp's grammar engine --------------------------------------------


@pytest.mark.parametrize("fmt", FORMATS)
def test_required_allows_only_valid_calls(checker: GrammarChecker, fmt: str) -> None:
    many, single = grammar("required", True, fmt), grammar("required", False, fmt)
    one = [("get_weather", {"city": "Lima", "days": 3})]
    two = one + [("add_note", {"text": "rain", "pinned": True}), ("ping", {})]
    for g in (many, single):
        assert checker.compiles(g)
        assert checker.accepts(g, calls_text(fmt, one))
    assert checker.accepts(many, calls_text(fmt, two))
    assert not checker.accepts(single, calls_text(fmt, two))
    assert not checker.accepts(many, "Sure! " + calls_text(fmt, one))  # no prose under "required"
    assert not checker.accepts(many, "")
    assert not checker.accepts(many, calls_text(fmt, one)[:-1])  # a cut-off call is no answer
    for bad in ({"city": "Rome", "days": 3}, {"city": "Lima"}, {"city": "Lima", "days": "3"},
                {"city": "Lima", "days": 3, "extra": 1}):
        assert not checker.accepts(many, calls_text(fmt, [("get_weather", bad)])), bad
    assert not checker.accepts(many, calls_text(fmt, [("delete_all", {})]))
    assert not checker.accepts(many, calls_text(fmt, [("add_note", {"text": "x" * 21})]))  # maxLength


@pytest.mark.parametrize("fmt", FORMATS)
def test_named_tool_only(checker: GrammarChecker, fmt: str) -> None:
    g = grammar({"name": "add_note"}, False, fmt)
    assert checker.accepts(g, calls_text(fmt, [("add_note", {"text": "hi"})]))
    assert not checker.accepts(g, calls_text(fmt, [("get_weather", {"city": "Oslo", "days": 1})]))


@pytest.mark.parametrize("fmt", FORMATS)
def test_none_forbids_the_call_markup(checker: GrammarChecker, fmt: str) -> None:
    g = grammar("none", True, fmt)
    assert checker.accepts(g, "It is sunny in Lima; no tool needed.")
    assert checker.accepts(g, "")
    assert checker.accepts(g, "a " + MARKERS[fmt][:-1] + " b")  # all but the marker's last character
    assert not checker.accepts(g, "Let me check. " + MARKERS[fmt] + "{", complete=False)


@pytest.mark.parametrize("fmt", FORMATS)
def test_auto_without_parallel_calls_allows_at_most_one(checker: GrammarChecker, fmt: str) -> None:
    g = grammar("auto", False, fmt)
    call = calls_text(fmt, [("ping", {})])
    lead = "" if fmt != "llama3_json" else MARKERS[fmt]
    assert checker.accepts(g, "Just text.")
    assert checker.accepts(g, "Checking. " + lead + call)
    assert not checker.accepts(g, "Checking. " + lead + calls_text(fmt, [("ping", {}), ("ping", {})]))
    assert not checker.accepts(g, "Checking. " + lead + call + " and more text")
    content, calls = parser_for(fmt).parse("Checking. " + lead + call)
    assert calls == [("ping", "{}")] and content.strip() == "Checking."


def test_response_format_json_schema(checker: GrammarChecker) -> None:
    schema = {"type": "object", "properties": {"answer": {"type": "string", "enum": ["yes", "no"]},
                                               "score": {"type": "number"}}, "required": ["answer"]}
    fmt = {"type": "json_schema", "name": "verdict", "schema": schema, "strict": True}
    g = grammar("auto", True, response_format=fmt, tools=())
    assert checker.accepts(g, '{"answer": "yes", "score": 0.5}')
    assert checker.accepts(g, '{"answer": "no"}')
    for bad in ('{"answer": "maybe"}', '{"score": 1}', "Yes.", '["yes"]', '{"answer": "yes"} trailing'):
        assert not checker.accepts(g, bad), bad
    with_tools = grammar("auto", True, response_format=fmt)  # auto: the JSON answer or tool calls
    assert checker.accepts(with_tools, '{"answer": "no"}')
    assert checker.accepts(with_tools, calls_text("hermes", [("ping", {})]))
    no_calls = grammar("none", True, response_format=fmt)
    assert not checker.accepts(no_calls, calls_text("hermes", [("ping", {})]))
    any_object = grammar(None, True, response_format={"type": "json_object"}, tools=())
    assert checker.accepts(any_object, '{"a": [1, {"b": null}]}')
    assert not checker.accepts(any_object, "[1]")


def test_same_ref_names_in_two_tools_stay_apart(checker: GrammarChecker) -> None:
    def tool(name: str, item: dict[str, Any]) -> ToolSpec:
        return ToolSpec(name, "", {"$defs": {"Item": item}, "type": "object",
                                   "properties": {"x": {"$ref": "#/$defs/Item"}}, "required": ["x"]})

    tools = (tool("ints", {"type": "integer"}), tool("flags", {"type": "boolean"}))
    g = grammar("required", True, tools=tools)
    assert checker.accepts(g, calls_text("hermes", [("ints", {"x": 4}), ("flags", {"x": True})]))
    assert not checker.accepts(g, calls_text("hermes", [("ints", {"x": True})]))
    assert not checker.accepts(g, calls_text("hermes", [("flags", {"x": 4})]))


# --- properties ------------------------------------------------------------------------------

# Keys in schema order: the converter's grammar writes properties in the order the schema lists them.
_weather_args = st.builds(lambda city, days: {"city": city, "days": days},
                          st.sampled_from(["Paris", "Lima", "Oslo"]), st.integers(-10**6, 10**6))
_note_args = st.builds(lambda text, pinned: {"text": text} | ({} if pinned is None else {"pinned": pinned}),
                       # Characters outside the BMP are left out: serialised with JSON's surrogate-pair escapes
                       # they are refused by the grammar checker (a known gap, in the issue-13 note).
                       st.text(st.characters(max_codepoint=0xFFFF, exclude_categories=("Cs",)), max_size=20),
                       st.none() | st.booleans())
_calls = st.lists(st.one_of(st.tuples(st.just("get_weather"), _weather_args), st.tuples(st.just("add_note"), _note_args),
                            st.tuples(st.just("ping"), st.just({}))), min_size=1, max_size=3)


@settings(settings.get_profile("grammar"))
@given(fmt=st.sampled_from(FORMATS), calls=_calls)
def test_every_valid_call_list_is_accepted_and_parsed_back(checker: GrammarChecker, fmt: str,
                                                           calls: list[tuple[str, dict[str, Any]]]) -> None:
    text = calls_text(fmt, calls)
    assert checker.accepts(grammar("required", True, fmt), text)
    assert checker.accepts(grammar("required", False, fmt), text) == (len(calls) == 1)
    _content, parsed = parser_for(fmt).parse(text)
    assert [(name, json.loads(args)) for name, args in parsed] == calls


@settings(settings.get_profile("grammar"))
@given(marker=st.sampled_from(list(MARKERS.values()) + ["aab", "abab"]),
       text=st.text(alphabet=st.sampled_from(list("<tool_call>[TOOLS]|python ab\n")), max_size=40))
def test_text_without_marker_is_exact(checker: GrammarChecker, marker: str, text: str) -> None:
    g = rules_text({"root": "prose", **text_without(marker, "prose")})
    assert checker.accepts(g, text) == (marker not in text)


@settings(settings.get_profile("grammar"))
@given(markers=st.sampled_from([["<tool_call>", "```json"], ["aab", "abb"], ["ab", "ba"]]),
       text=st.text(alphabet=st.sampled_from(list("<tool_call>`json abx\n")), max_size=40))
def test_text_without_several_markers_is_exact(checker: GrammarChecker, markers: list[str], text: str) -> None:
    g = rules_text({"root": "prose", **text_without(markers, "prose")})
    assert checker.accepts(g, text) == (not any(m in text for m in markers))


@settings(settings.get_profile("grammar"))
@given(text=st.text(st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00"), min_size=1))
def test_literal_matches_exactly_its_text(checker: GrammarChecker, text: str) -> None:
    g = f"root ::= {literal(text)}\n"
    assert checker.accepts(g, text)
    assert not checker.accepts(g, text + "x")
