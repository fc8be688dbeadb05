"""What one answer must look like (tool_choice, parallel tool calls, structured output), and the
llama.cpp grammar that makes the in-process engine obey it.

The request's fields are normalised into an `OutputConstraint` (engine-neutral: the upstream engine
forwards it). For the in-process engine, `grammar_for` compiles it to GBNF: tool arguments and JSON
answers go through llama-cpp-python's own JSON-schema converter (`json_schema_to_gbnf`); the
tool-call markup around them is the model family's own (see engine.tool_parsers), so the usual
parser reads the result.

Pure: plain data in, grammar text out. The converter is pure Python; it is imported lazily only
because importing llama_cpp loads the native library.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from engine.gbnf import MarkerAutomaton, Rules, literal, namespaced, negated_class, rules_text, text_without
from policies.conversation_types import ToolSpec

__all__ = ["CallMarkup", "ConstraintError", "Grammar", "OutputConstraint", "grammar_for", "output_constraint"]

ToolChoiceMode = Literal["auto", "none", "required"]


class ConstraintError(ValueError):
    """The client asked for something that cannot be enforced (a client error, never a 5xx)."""

    def __init__(self, message: str, param: str) -> None:
        super().__init__(message)
        self.param = param


@dataclass(frozen=True)
class OutputConstraint:
    """The answer's shape as the client asked for it, normalised."""

    tool_choice: ToolChoiceMode = "auto"
    tool_name: str | None = None  # with "required": the one tool that must be called
    parallel_tool_calls: bool = True
    # None, {"type": "json_object"} or {"type": "json_schema", "name": str, "schema": {...}, "strict": bool}
    response_format: Mapping[str, Any] | None = None

    @property
    def answer_schema(self) -> dict[str, Any] | None:
        """The JSON schema the answer text must satisfy, if any."""
        if self.response_format is None:
            return None
        if self.response_format["type"] == "json_object":
            return {"type": "object"}
        return dict(self.response_format["schema"])


def _choice_name(choice: Mapping[str, Any]) -> object:
    function = choice.get("function")  # OpenAI's own shape, should one arrive unconverted
    return function.get("name") if isinstance(function, Mapping) else choice.get("name")


def output_constraint(
    tool_choice: str | Mapping[str, Any] | None,
    parallel_tool_calls: bool,
    response_format: Mapping[str, Any] | None,
    tools: Sequence[ToolSpec],
) -> OutputConstraint:
    """Normalise a conversation's tool_choice / parallel_tool_calls / response_format.

    Anthropic's "any" is "required"; a named tool is {"name": ...}. Raises ConstraintError for
    what cannot be honoured (a forced call without tools, an unknown tool, an unknown format).
    """
    names = [t.name for t in tools]
    mode: ToolChoiceMode
    name: str | None = None
    if tool_choice is None or tool_choice == "auto":
        mode = "auto"
    elif tool_choice == "none":
        mode = "none"
    elif tool_choice in ("required", "any"):
        mode = "required"
    elif isinstance(tool_choice, Mapping) and isinstance(_choice_name(tool_choice), str):
        mode, name = "required", str(_choice_name(tool_choice))
        if name not in names:
            raise ConstraintError(f"tool_choice names {name!r}, which is not one of the tools", "tool_choice")
    else:
        raise ConstraintError(f"unsupported tool_choice {tool_choice!r}", "tool_choice")
    if mode == "required" and not tools:
        raise ConstraintError("tool_choice forces a tool call, but no tools were given", "tool_choice")
    return OutputConstraint(mode, name, parallel_tool_calls, _response_format(response_format))


def _response_format(raw: Mapping[str, Any] | None) -> dict[str, Any] | None:
    if raw is None or raw.get("type") in (None, "text"):
        return None
    kind = raw.get("type")
    if kind == "json_object":
        return {"type": "json_object"}
    if kind != "json_schema":
        raise ConstraintError(f"unsupported response_format type {kind!r}", "response_format")
    inner = raw.get("json_schema") if isinstance(raw.get("json_schema"), Mapping) else raw  # Chat's nesting
    schema = inner.get("schema")
    if not isinstance(schema, Mapping):
        raise ConstraintError("response_format json_schema needs a 'schema' object", "response_format")
    return {"type": "json_schema", "name": str(inner.get("name") or "response"), "schema": dict(schema),
            "strict": bool(inner.get("strict", False))}


# ---------------------------------------------------------------------------------------------
# Tool-call markup per model family (the shapes engine.tool_parsers reads back)
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class CallMarkup:
    block_open: str  # before the first call
    call_open: str  # before each call
    call_close: str  # after each call
    separator: str  # between calls
    block_close: str  # after the last call
    arguments_key: str
    marker: str  # text that opens call markup anywhere: what "none" forbids
    fence: str = ""  # a code fence whose JSON the parser also reads as calls (Hermes: ```json)


FENCE_CLOSE = "```"


# Families whose parser reads an answer that starts with a JSON object as bare call objects.
BARE_CALLS = frozenset({"hermes", "llama3_json"})

MARKUPS: dict[str, CallMarkup] = {
    "hermes": CallMarkup("", "<tool_call>", "</tool_call>", "\n", "", "arguments", "<tool_call>", "```json"),
    "llama3_json": CallMarkup("", "", "", "; ", "", "parameters", "<|python_tag|>"),
    "mistral": CallMarkup("[TOOL_CALLS][", "", "", ", ", "]", "arguments", "[TOOL_CALLS]"),
}


@dataclass(frozen=True)
class Grammar:
    """GBNF with a `root` rule, and what it enforces in words (logs, PreparedPrompt)."""

    text: str
    enforces: str
    loose: tuple[str, ...] = ()  # tools whose schema the converter could not take: any JSON object


_ANNOTATIONS = frozenset({"description", "title", "examples", "default", "$comment", "deprecated", "readOnly",
                          "writeOnly", "$schema", "$id"})
_NAMED = frozenset({"properties", "patternProperties", "$defs", "definitions", "dependentSchemas"})  # name -> schema
_LISTED = frozenset({"anyOf", "oneOf", "allOf", "prefixItems"})
_NESTED = frozenset({"items", "additionalProperties", "not", "contains", "propertyNames", "if", "then", "else",
                     "additionalItems", "unevaluatedProperties"})
LONGEST_BOUND = 4096  # a maxLength above this is dropped: no answer reaches it, and its grammar is megabytes


def _for_grammar(schema: Any) -> Any:
    """The schema as the converter should read it: annotations dropped (a property given only a
    description, "any value" to JSON Schema, is one the converter refuses), every object that lists
    properties closed to further keys, and a maxLength no answer reaches left out (Claude Code's
    Workflow script allows 524,288 characters: four megabytes of grammar). Structural, so a
    property named "description" stays. Narrowing but for that bound: whatever the grammar admits
    validates against the original schema, and a small model cannot wander off into invented keys."""
    if not isinstance(schema, dict):
        return schema
    out: dict[str, Any] = {}
    for key, value in schema.items():
        if key in _ANNOTATIONS or (key == "maxLength" and isinstance(value, int) and value > LONGEST_BOUND):
            continue
        if key in _NAMED and isinstance(value, dict):
            out[key] = {name: _for_grammar(sub) for name, sub in value.items()}
        elif key in _LISTED and isinstance(value, list):
            out[key] = [_for_grammar(sub) for sub in value]
        elif key in _NESTED:
            out[key] = _for_grammar(value)
        else:
            out[key] = value
    if "properties" in out and "additionalProperties" not in out:
        out["additionalProperties"] = False
    return out


def _schema_rules(schema: Mapping[str, Any], prefix: str, param: str) -> tuple[str, Rules]:
    """GBNF rules (names prefixed) for JSON valid against `schema`, by llama-cpp-python's converter."""
    from llama_cpp.llama_grammar import json_schema_to_gbnf

    try:
        text = json_schema_to_gbnf(json.dumps(_for_grammar(copy.deepcopy(dict(schema)))))
    except (AssertionError, ValueError, KeyError, TypeError, RecursionError) as exc:
        raise ConstraintError(f"cannot enforce the JSON schema of {param}: {exc}", param) from None
    return namespaced(text, prefix)


def _call_rules(tools: Sequence[ToolSpec], markup: CallMarkup, loose: list[str] | None = None) -> Rules:
    """Rules `callobj` (one call object of any of `tools`, arguments per schema) and `call` (one in
    the family's markup). With `loose`, a schema the converter cannot take gives any JSON object
    (the tool named in `loose`) instead of a ConstraintError."""
    rules: Rules = {}
    alternatives = []
    for index, tool in enumerate(tools):
        schema = tool.parameters or {"type": "object"}
        try:
            args, arg_rules = _schema_rules(schema, f"tool{index}", f"tools[{index}].parameters")
        except ConstraintError:
            if loose is None:
                raise
            loose.append(tool.name)
            args, arg_rules = _schema_rules({"type": "object"}, f"tool{index}", f"tools[{index}].parameters")
        head = '{"name": ' + json.dumps(tool.name, ensure_ascii=False) + f', "{markup.arguments_key}": '
        rules[f"callobj-{index}"] = " ".join([literal(head), args, literal("}")])
        alternatives.append(f"callobj-{index}")
        rules.update(arg_rules)
    rules["callobj"] = " | ".join(alternatives)
    parts = [literal(markup.call_open)] if markup.call_open else []
    parts.append("callobj")
    parts += [literal(markup.call_close)] if markup.call_close else []
    rules["call"] = " ".join(parts)
    if markup.fence:  # the fenced form the parser reads too: shaped the same
        rules["call"] += f" | {literal(markup.fence)} {_WS} callobj ( {_SEP} callobj )* {_WS} {literal(FENCE_CLOSE)}"
    return rules


def _markers(markup: CallMarkup) -> list[str]:
    """What opens a call anywhere in the answer: the prose never spells one of these out."""
    return [markup.marker, *([markup.fence] if markup.fence else [])]


def _opening_rules(markup: CallMarkup) -> Rules:
    """Rule `opening`: free text that never opens a call and does not start with `{` (a parser
    reads an answer that starts with a JSON object as a bare call: that one is shaped by `bare`).
    Rule `bare`: calls written as bare JSON at the start, as Qwen and Llama 3 also do."""
    automaton = MarkerAutomaton(_markers(markup))
    firsts = sorted({m[0] for m in automaton.markers})
    start = negated_class({"{", " ", "\t", "\n", "\r", *firsts})
    by_first = " | ".join(f"{literal(ch)} {automaton.rule('prose', automaton.step('', ch) or '')}" for ch in firsts)
    return {"opening": f"{_WS} ( {start} prose-0 | {by_first} )?",
            "bare": f"{_WS} callobj ( {_SEP} callobj )*", "bare-one": f"{_WS} callobj"}


_WS = r"[ \t\n\r]*"
_SEP = f"{_WS} [,;]? {_WS}"  # between call objects, as the parser reads them


def _calls_body(markup: CallMarkup, many: bool) -> str:
    parts = [literal(markup.block_open)] if markup.block_open else []
    parts.append(f"call ( {literal(markup.separator)} call )*" if many else "call")
    parts += [literal(markup.block_close)] if markup.block_close else []
    return " ".join(parts)


def grammar_for(constraint: OutputConstraint, tools: Sequence[ToolSpec], tool_format: str) -> Grammar | None:
    """The grammar the in-process engine samples under for this answer, or None when it is free.

    - required / a named tool: only tool calls (one, or one or more with parallel calls), each
      naming an allowed tool with arguments valid against its schema; no prose.
    - none (with tools in the prompt): any text that never opens the call markup; a JSON answer
      when a response_format asks for one.
    - a response_format: the answer is JSON valid against the schema (or, under "auto" with
      tools, alternatively tool calls).
    - auto with parallel_tool_calls=false: prose, then at most one call.
    - auto (what agents send): free text until the answer opens the family's call markup, then
      only calls of offered tools with schema-valid arguments, closed as the parser expects; prose
      between calls where each call opens with the marker. A schema the converter cannot take
      gives that tool any JSON object (`Grammar.loose`) rather than failing the request.
    """
    markup = MARKUPS.get(tool_format)
    if markup is None:
        raise ValueError(f"no call markup for tool format {tool_format!r}")
    schema = constraint.answer_schema
    rules: Rules = {}
    if constraint.tool_choice == "required":
        allowed = [t for t in tools if constraint.tool_name in (None, t.name)]
        many = constraint.parallel_tool_calls
        rules["root"] = _calls_body(markup, many)
        rules.update(_call_rules(allowed, markup))
        names = ", ".join(t.name for t in allowed)
        return Grammar(rules_text(rules), f"{'one or more calls' if many else 'exactly one call'} of: {names}")
    if schema is not None:
        answer, answer_rules = _schema_rules(schema, "answer", "response_format")
        rules["root"] = answer
        enforces = "a JSON answer valid against the response_format schema"
        if tools and constraint.tool_choice == "auto":
            rules["root"] = f"{answer} | {_calls_body(markup, constraint.parallel_tool_calls)}"
            rules.update(_call_rules(tools, markup))
            enforces += ", or tool calls"
        rules.update(answer_rules)
        return Grammar(rules_text(rules), enforces)
    if not tools:
        return None
    if constraint.tool_choice == "none":
        rules["root"] = "prose"
        rules.update(text_without(markup.marker, "prose"))
        return Grammar(rules_text(rules), f"text that never opens a tool call ({markup.marker})")
    # After prose a call must open with the marker (Llama 3 reads bare JSON only at the start).
    opens = (markup.block_open or markup.call_open).startswith(markup.marker)
    lead = "" if opens else literal(markup.marker) + " "
    reads_bare = tool_format in BARE_CALLS
    loose: list[str] = []
    rules.update(text_without(_markers(markup), "prose"))
    rules.update(_call_rules(tools, markup, loose))
    rules.update(_opening_rules(markup))
    if not constraint.parallel_tool_calls:
        rules["root"] = f"{'bare-one | ' if reads_bare else ''}opening ( {lead}{_calls_body(markup, many=False)} )?"
        return Grammar(rules_text(rules), "text, then at most one tool call", tuple(loose))
    if markup.call_open.startswith(markup.marker):  # each call opens with the marker: prose may come between
        rules["root"] = f"( {'bare prose | ' if reads_bare else ''}opening ) ( call prose )*"
    else:
        rules["root"] = f"{'bare | ' if reads_bare else ''}opening ( {lead}{_calls_body(markup, many=True)} prose )?"
    return Grammar(rules_text(rules), "text, and tool calls only of offered tools with valid arguments",
                   tuple(loose))
