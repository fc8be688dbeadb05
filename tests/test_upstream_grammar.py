"""Which upstream gets the gateway's tool-call grammar, and what the request then says.
Model: none (the grammar is text; llama.cpp compiles it in tests/test_upstream_grammar_e2e.py).
"""

from __future__ import annotations

from engine.base import PreparedPrompt
from engine.constraints import OutputConstraint
from engine.upstream_grammar import UpstreamGrammars, family_of
from policies.conversation_types import Message, ToolSpec

READ = ToolSpec("read_file", "Read a file.", {"type": "object", "properties": {"path": {"type": "string"}},
                                              "required": ["path"]})
QWEN_PROPS = {"build_info": "b11434-abc", "chat_template": "{% if tools %}<tools>...</tools> <tool_call>{% endif %}"}


def prompt(constraint: OutputConstraint = OutputConstraint(), tools: tuple[ToolSpec, ...] = (READ,)) -> PreparedPrompt:
    return PreparedPrompt((Message("user", "read calc.py"),), tools, 10, constraint=constraint)


def test_only_a_llama_server_whose_template_spells_a_known_call_markup_gets_a_grammar() -> None:
    assert family_of(QWEN_PROPS) == "hermes"
    assert family_of({**QWEN_PROPS, "chat_template": "[TOOL_CALLS] {{ tools }}"}) == "mistral"
    assert family_of({"chat_template": QWEN_PROPS["chat_template"]}) is None  # not llama-server (no build)
    assert family_of({**QWEN_PROPS, "chat_template": "{{ messages }}"}) is None  # no call markup at all
    assert family_of({"build_info": "b1", "chat_template": None}) is None


def test_under_auto_the_request_carries_the_grammar_and_tool_choice_none() -> None:
    grammars = UpstreamGrammars()
    grammars.learn(QWEN_PROPS)
    body: dict[str, object] = {"tools": [{"type": "function"}]}
    assert grammars.apply(body, prompt())
    assert body["tool_choice"] == "none"  # llama-server refuses a grammar beside tools otherwise
    grammar = str(body["grammar"])
    assert "\\x22read_file\\x22" in grammar and "root ::=" in grammar and "<tool_call>" in grammar


def test_a_forced_shape_or_an_upstream_without_grammars_is_left_alone() -> None:
    grammars = UpstreamGrammars()
    grammars.learn(QWEN_PROPS)
    for constraint in (OutputConstraint(tool_choice="required"), OutputConstraint(tool_choice="none"),
                       OutputConstraint(response_format={"type": "json_object"})):
        body: dict[str, object] = {}
        assert not grammars.apply(body, prompt(constraint)) and body == {}
    assert not grammars.apply({}, prompt(tools=()))
    off = UpstreamGrammars(enabled=False)
    off.learn(QWEN_PROPS)
    assert off.family is None and not off.apply({}, prompt())
    grammars.give_up("400: grammar parse error")
    assert not grammars.apply({}, prompt())
