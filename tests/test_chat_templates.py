"""Chat templates: exact built-in output, GGUF template handling, selection, and the
append-only property the prefix KV cache relies on."""

from __future__ import annotations

import hashlib
import json

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from engine.chat_templates import (
    BUILTIN_NAMES,
    ChatTemplate,
    ChatTemplateError,
    builtin_template,
    select_template,
)
from policies.conversation_types import Message, ToolCall, ToolSpec

WEATHER = ToolSpec(
    name="get_weather",
    description="Current weather for a city",
    parameters={"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
)

# system + user + assistant tool call + tool result + user
CONVERSATION = (
    Message("system", "You are terse."),
    Message("user", "Weather in Paris?"),
    Message(
        "assistant",
        "Let me check.",
        tool_calls=(ToolCall("call_1", "get_weather", '{"city": "Paris", "unit": "c"}'),),
    ),
    Message("tool", "18°C, sunny", tool_call_id="call_1", name="get_weather"),
    Message("user", "Thanks. Tomorrow?"),
)

CALL_LINE = (
    '<tool_call>{"name": "get_weather", "arguments": {"city": "Paris", "unit": "c"}}</tool_call>'
)
RESPONSE = "<tool_response>\n18°C, sunny\n</tool_response>"

EXPECTED_NO_TOOLS = {
    "gemma": (
        "<start_of_turn>user\nYou are terse.\n\nWeather in Paris?<end_of_turn>\n"
        f"<start_of_turn>model\nLet me check.\n{CALL_LINE}<end_of_turn>\n"
        f"<start_of_turn>user\n{RESPONSE}\nThanks. Tomorrow?<end_of_turn>\n"
        "<start_of_turn>model\n"
    ),
    "chatml": (
        "<|im_start|>system\nYou are terse.<|im_end|>\n"
        "<|im_start|>user\nWeather in Paris?<|im_end|>\n"
        f"<|im_start|>assistant\nLet me check.\n{CALL_LINE}<|im_end|>\n"
        f"<|im_start|>user\n{RESPONSE}\nThanks. Tomorrow?<|im_end|>\n"
        "<|im_start|>assistant\n"
    ),
    "llama3": (
        "<|start_header_id|>system<|end_header_id|>\n\nYou are terse.<|eot_id|>"
        "<|start_header_id|>user<|end_header_id|>\n\nWeather in Paris?<|eot_id|>"
        f"<|start_header_id|>assistant<|end_header_id|>\n\nLet me check.\n{CALL_LINE}<|eot_id|>"
        f"<|start_header_id|>user<|end_header_id|>\n\n{RESPONSE}\nThanks. Tomorrow?<|eot_id|>"
        "<|start_header_id|>assistant<|end_header_id|>\n\n"
    ),
    "mistral": (
        "[INST] You are terse.\n\nWeather in Paris? [/INST]"
        f"Let me check.\n{CALL_LINE}</s>"
        f"[INST] {RESPONSE}\nThanks. Tomorrow? [/INST]"
    ),
}


@pytest.mark.parametrize("name", sorted(EXPECTED_NO_TOOLS))
def test_builtin_exact_output(name: str) -> None:
    assert builtin_template(name).render(CONVERSATION, []) == EXPECTED_NO_TOOLS[name]


@pytest.mark.parametrize("name", sorted(EXPECTED_NO_TOOLS))
def test_builtin_with_tools_puts_tool_prompt_into_system_text(name: str) -> None:
    template = builtin_template(name)
    with_tools = template.render(CONVERSATION, [WEATHER])
    without = template.render(CONVERSATION, [])
    spec_line = json.dumps(
        {
            "type": "function",
            "function": {
                "name": "get_weather",
                "description": "Current weather for a city",
                "parameters": WEATHER.parameters,
            },
        },
        ensure_ascii=False,
    )
    listing = f"<tools>\n{spec_line}\n</tools>"
    assert listing in with_tools
    assert '<tool_call>{"name": ' in with_tools.split(listing)[1]
    # The prompt follows the client's system text, and everything after the system text is
    # rendered exactly as without tools.
    sys_at = with_tools.index("You are terse.")
    assert sys_at < with_tools.index("# Tools") < with_tools.index("Weather in Paris?")
    head, tail = without.split("You are terse.", 1)
    assert with_tools.startswith(head + "You are terse.\n\n# Tools")
    assert with_tools.endswith(tail)


def test_tool_prompt_creates_a_system_message_when_there_is_none() -> None:
    chatml = builtin_template("chatml")
    text = chatml.render([Message("user", "hi")], [WEATHER])
    assert text.startswith("<|im_start|>system\n# Tools\n\n")
    assert text.endswith("<|im_end|>\n<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n")
    gemma = builtin_template("gemma").render([Message("user", "hi")], [WEATHER])
    assert gemma.startswith("<start_of_turn>user\n# Tools\n\n")
    assert gemma.endswith("</tool_response>.\n\nhi<end_of_turn>\n<start_of_turn>model\n")
    assert gemma.count("<start_of_turn>user") == 1


def test_no_tools_means_no_tool_prompt() -> None:
    text = builtin_template("chatml").render([Message("user", "hi")], [])
    assert text == "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"


def test_tool_results_grouped_and_calls_keep_client_key_order() -> None:
    messages = [
        Message("user", "compare"),
        Message(
            "assistant",
            "",
            tool_calls=(
                ToolCall("a", "lookup", '{"zeta": 1, "alpha": "ü"}'),
                ToolCall("b", "lookup", "not json"),
            ),
        ),
        Message("tool", "one", tool_call_id="a"),
        Message("tool", "two", tool_call_id="b"),
        Message("assistant", "done"),
    ]
    text = builtin_template("chatml").render(messages, [], add_generation_prompt=False)
    assert text == (
        "<|im_start|>user\ncompare<|im_end|>\n"
        "<|im_start|>assistant\n"
        '<tool_call>{"name": "lookup", "arguments": {"zeta": 1, "alpha": "ü"}}</tool_call>\n'
        '<tool_call>{"name": "lookup", "arguments": "not json"}</tool_call><|im_end|>\n'
        "<|im_start|>user\n<tool_response>\none\n</tool_response>\n"
        "<tool_response>\ntwo\n</tool_response><|im_end|>\n"
        "<|im_start|>assistant\ndone<|im_end|>\n"
    )


def test_generation_prompt_flag() -> None:
    messages = [Message("user", "hi")]
    for name in ("gemma", "chatml", "llama3"):
        template = builtin_template(name)
        with_prompt = template.render(messages, [], add_generation_prompt=True)
        without = template.render(messages, [], add_generation_prompt=False)
        assert with_prompt.startswith(without) and with_prompt != without
    # Mistral's model answers straight after [/INST].
    mistral = builtin_template("mistral")
    assert mistral.render(messages, [], True) == mistral.render(messages, [], False)


def test_gemma_system_without_leading_user_gets_its_own_turn() -> None:
    gemma = builtin_template("gemma")
    text = gemma.render([Message("system", "S"), Message("assistant", "A")], [], False)
    assert text == "<start_of_turn>user\nS<end_of_turn>\n<start_of_turn>model\nA<end_of_turn>\n"


def test_builtin_metadata() -> None:
    expected_stops = {
        "gemma": ("<end_of_turn>",),
        "chatml": ("<|im_end|>",),
        "llama3": ("<|eot_id|>",),
        "mistral": ("</s>",),
    }
    assert set(BUILTIN_NAMES) == set(expected_stops)
    for name, stops in expected_stops.items():
        template = builtin_template(name)
        assert template.name == name
        assert template.stop_strings == stops
        assert template.tool_format == "hermes"
        assert template.native_tools is False


def test_sha256_covers_source_and_tool_format() -> None:
    t = builtin_template("chatml")
    assert t.sha256 == hashlib.sha256((t.source + "hermes").encode()).hexdigest()
    other = ChatTemplate("x", t.source, "mistral", False, t.stop_strings)
    assert other.sha256 != t.sha256
    assert builtin_template("gemma").sha256 != t.sha256


def test_rendering_is_deterministic() -> None:
    for name in BUILTIN_NAMES:
        t = builtin_template(name)
        assert t.render(CONVERSATION, [WEATHER]) == t.render(CONVERSATION, [WEATHER])


# ---------------------------------------------------------------------------------------------
# Selection
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("arch", "expected"),
    [
        ("gemma", "gemma"),
        ("gemma2", "gemma"),
        ("gemma3", "gemma"),
        ("qwen2", "chatml"),
        ("qwen3", "chatml"),
        ("qwen2moe", "chatml"),
        ("qwen3moe", "chatml"),
        ("llama", "llama3"),
        ("phi3", "chatml"),
        ("", "chatml"),
    ],
)
def test_builtin_chosen_by_architecture(arch: str, expected: str) -> None:
    assert select_template({"general.architecture": arch}).name == expected


def test_missing_architecture_defaults_to_chatml() -> None:
    assert select_template({}).name == "chatml"


def test_override_wins_over_gguf_template_and_architecture() -> None:
    metadata = {"general.architecture": "gemma3", "tokenizer.chat_template": "{{ messages }}"}
    assert select_template(metadata, override="llama3").name == "llama3"
    assert select_template(metadata, override=" ChatML ").name == "chatml"
    assert select_template(metadata).name == "gguf"


def test_unknown_override_is_a_clear_error() -> None:
    with pytest.raises(ValueError, match=r"unknown chat template 'vicuna'.*gemma.*chatml"):
        select_template({"general.architecture": "llama"}, override="vicuna")


def test_empty_or_broken_gguf_template_falls_back_to_architecture() -> None:
    empty = {"general.architecture": "gemma3", "tokenizer.chat_template": ""}
    assert select_template(empty).name == "gemma"
    broken = {"general.architecture": "qwen2", "tokenizer.chat_template": "{% for m in messages %}"}
    assert select_template(broken).name == "chatml"


# ---------------------------------------------------------------------------------------------
# GGUF templates
# ---------------------------------------------------------------------------------------------

# A small Qwen-style template that renders tools and tool messages itself.
QWEN_LIKE = r"""
{%- set ns = namespace(start=0) -%}
{%- if tools -%}
{{- '<|im_start|>system\n' -}}
{%- if messages and messages[0].role == 'system' -%}
{{- messages[0].content + '\n\n' -}}
{%- set ns.start = 1 -%}
{%- endif -%}
{{- '<tools>\n' -}}
{%- for tool in tools -%}
{{- tool | tojson -}}{{- '\n' -}}
{%- endfor -%}
{{- '</tools><|im_end|>\n' -}}
{%- endif -%}
{%- for message in messages[ns.start:] -%}
{%- if message.role == 'tool' -%}
{{- '<|im_start|>user\n<tool_response>\n' + message.content + '\n</tool_response><|im_end|>\n' -}}
{%- else -%}
{{- '<|im_start|>' + message.role + '\n' + message.content -}}
{%- for call in message.tool_calls | default([]) -%}
{{- '\n<tool_call>\n' -}}
{{- {'name': call.function.name, 'arguments': call.function.arguments} | tojson -}}
{{- '\n</tool_call>' -}}
{%- endfor -%}
{{- '<|im_end|>\n' -}}
{%- endif -%}
{%- endfor -%}
{%- if add_generation_prompt -%}
{{- '<|im_start|>assistant\n' -}}
{%- endif -%}
"""


def test_gguf_template_with_native_tools() -> None:
    template = select_template(
        {"general.architecture": "qwen2", "tokenizer.chat_template": QWEN_LIKE}
    )
    assert template.name == "gguf"
    assert template.native_tools is True
    assert template.tool_format == "hermes"  # no <tool_call> literal needed: hermes is default
    assert template.stop_strings == ("<|im_end|>",)
    assert template.eos_token == "<|im_end|>"
    text = template.render(CONVERSATION, [WEATHER])
    spec = json.dumps(
        {"type": "function", "function": {"name": "get_weather", "description": WEATHER.description,
                                          "parameters": WEATHER.parameters}},
        ensure_ascii=False,
    )
    assert text == (
        f"<|im_start|>system\nYou are terse.\n\n<tools>\n{spec}\n</tools><|im_end|>\n"
        "<|im_start|>user\nWeather in Paris?<|im_end|>\n"
        "<|im_start|>assistant\nLet me check.\n<tool_call>\n"
        '{"name": "get_weather", "arguments": {"city": "Paris", "unit": "c"}}'
        "\n</tool_call><|im_end|>\n"
        "<|im_start|>user\n<tool_response>\n18°C, sunny\n</tool_response><|im_end|>\n"
        "<|im_start|>user\nThanks. Tomorrow?<|im_end|>\n"
        "<|im_start|>assistant\n"
    )
    # No tools: the template's own `if tools` branch is skipped (tools is None, not []).
    plain = template.render(CONVERSATION[:2], [])
    assert plain == (
        "<|im_start|>system\nYou are terse.<|im_end|>\n"
        "<|im_start|>user\nWeather in Paris?<|im_end|>\n<|im_start|>assistant\n"
    )


def test_native_template_sees_openai_style_dicts() -> None:
    dump = "{{ messages | tojson }}|{{ tools | tojson }}|{{ add_generation_prompt }}|{{ eos_token }}"
    template = select_template({"tokenizer.chat_template": dump + "<|im_end|>"})
    assert template.native_tools is True
    messages, tools, gen, eos = template.render(CONVERSATION, [WEATHER], False).split("|", 3)
    assert json.loads(messages) == [
        {"role": "system", "content": "You are terse."},
        {"role": "user", "content": "Weather in Paris?"},
        {
            "role": "assistant",
            "content": "Let me check.",
            "tool_calls": [
                {
                    "id": "call_1",
                    "type": "function",
                    "function": {"name": "get_weather", "arguments": {"city": "Paris", "unit": "c"}},
                }
            ],
        },
        {"role": "tool", "content": "18°C, sunny", "tool_call_id": "call_1", "name": "get_weather"},
        {"role": "user", "content": "Thanks. Tomorrow?"},
    ]
    assert "18°C" in messages  # tojson does not escape non-ASCII
    assert json.loads(tools) == [
        {
            "type": "function",
            "function": {"name": "get_weather", "description": WEATHER.description,
                         "parameters": WEATHER.parameters},
        }
    ]
    assert gen == "False"
    assert eos == "<|im_end|><|im_end|>"
    assert template.render([Message("user", "x")], []).split("|")[1] == "null"


def test_gguf_template_without_tool_support_gets_the_text_rewrite() -> None:
    # No mention of tools: tool traffic must reach it as plain system/user/assistant text.
    template = select_template({"tokenizer.chat_template": "{{ messages | tojson }}"})
    assert template.native_tools is False and template.tool_format == "hermes"
    rendered = json.loads(template.render(CONVERSATION, [WEATHER]))
    assert [m["role"] for m in rendered] == ["system", "user", "assistant", "user"]
    assert set().union(*(m.keys() for m in rendered)) == {"role", "content"}
    assert rendered[0]["content"].startswith("You are terse.\n\n# Tools\n\n")
    assert rendered[2]["content"] == f"Let me check.\n{CALL_LINE}"
    assert rendered[3]["content"] == f"{RESPONSE}\nThanks. Tomorrow?"


# Strict user/assistant alternation, as Gemma's and Mistral's own templates enforce.
STRICT = r"""
{%- for message in messages -%}
{%- if message.role != 'system' and (message.role == 'user') != (loop.index0 % 2 == (1 if messages[0].role == 'system' else 0)) -%}
{{- raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') -}}
{%- endif -%}
{{- bos_token + '<|' + message.role + '|>' + message.content + '<|end|>' -}}
{%- endfor -%}
"""


def test_strict_alternation_template_accepts_tool_results_followed_by_user_text() -> None:
    template = select_template({"tokenizer.chat_template": STRICT})
    assert template.native_tools is False
    assert template.stop_strings == ("<|end|>",)
    text = template.render(CONVERSATION, [])
    assert text.count("<|user|>") == 2


def test_raise_exception_surfaces_as_chat_template_error() -> None:
    template = select_template({"tokenizer.chat_template": STRICT})
    with pytest.raises(ChatTemplateError, match="must alternate"):
        template.render([Message("user", "a"), Message("user", "b")], [])
    # ValueError subclass, so callers can map it to a 400.
    assert issubclass(ChatTemplateError, ValueError)


def test_runtime_template_error_is_wrapped() -> None:
    template = select_template({"tokenizer.chat_template": "{{ messages[0].content.nope() }}"})
    with pytest.raises(ChatTemplateError, match="gguf"):
        template.render([Message("user", "a")], [])


def test_rendered_text_never_contains_bos() -> None:
    with_var = select_template({"tokenizer.chat_template": "{{ bos_token }}[{{ messages[0].content }}]"})
    assert with_var.render([Message("user", "hi")], []) == "[hi]"
    hard_coded = select_template(
        {"tokenizer.chat_template": "<|begin_of_text|>{{ messages[0].content }}<|eot_id|>"}
    )
    assert hard_coded.render([Message("user", "hi")], []) == "hi<|eot_id|>"


def test_sandbox_blocks_unsafe_attribute_access() -> None:
    template = select_template({"tokenizer.chat_template": "{{ messages.__class__.__mro__ }}"})
    with pytest.raises(ChatTemplateError):
        template.render([Message("user", "hi")], [])


@pytest.mark.parametrize(
    ("source", "tool_format"),
    [
        ("{% if tools %}<tool_call>{% endif %}<|im_end|>", "hermes"),
        ("{% if tools %}[AVAILABLE_TOOLS]{% endif %}[TOOL_CALLS]", "mistral"),
        ("{% if tools %}{% endif %}<|python_tag|><|eot_id|>", "llama3_json"),
        ('{% if tools %}"parameters": dict{% endif %}ipython<|eot_id|>', "llama3_json"),
        ("{% for t in tools %}{{ t | tojson }}{% endfor %}", "hermes"),
    ],
)
def test_tool_format_detection(source: str, tool_format: str) -> None:
    template = select_template({"tokenizer.chat_template": source})
    assert template.native_tools is True
    assert template.tool_format == tool_format


def test_llama3_style_gguf_stops() -> None:
    source = "{% if tools %}<|python_tag|>{% endif %}<|eot_id|><|eom_id|>"
    template = select_template({"tokenizer.chat_template": source})
    assert template.stop_strings == ("<|eot_id|>", "<|eom_id|>")
    assert template.eos_token == "<|eot_id|>"


# ---------------------------------------------------------------------------------------------
# The append-only property (prefix KV cache)
# ---------------------------------------------------------------------------------------------

_PIECES = st.sampled_from(
    ["\n", " ", "{", "}", '"', "<tool_call>", "[INST]", "<|im_end|>", "ü", "日本", "\\", "  \n\n"]
)
_TEXT = st.lists(st.one_of(st.text(max_size=6), _PIECES), max_size=5).map("".join)


@st.composite
def _call(draw: st.DrawFn) -> ToolCall:
    args = draw(
        st.one_of(
            st.dictionaries(st.text(max_size=4), st.one_of(st.integers(), _TEXT), max_size=3).map(
                lambda d: json.dumps(d, ensure_ascii=False)
            ),
            _TEXT,
        )
    )
    name = draw(st.from_regex(r"[a-z_]{1,8}", fullmatch=True))
    return ToolCall(id="call_x", name=name, arguments=args)


_MESSAGE = st.one_of(
    st.builds(Message, role=st.just("user"), content=_TEXT),
    st.builds(Message, role=st.just("assistant"), content=_TEXT),
    st.builds(
        Message,
        role=st.just("assistant"),
        content=_TEXT,
        tool_calls=st.lists(_call(), min_size=1, max_size=2).map(tuple),
    ),
    st.builds(Message, role=st.just("tool"), content=_TEXT, tool_call_id=st.just("call_x")),
)


@st.composite
def _conversation(draw: st.DrawFn) -> list[Message]:
    head = [Message("system", draw(_TEXT))] if draw(st.booleans()) else []
    return head + draw(st.lists(_MESSAGE, min_size=1, max_size=8))


_TEMPLATES: dict[str, ChatTemplate] = {name: builtin_template(name) for name in BUILTIN_NAMES}
_TEMPLATES["gguf_native"] = select_template({"tokenizer.chat_template": QWEN_LIKE})
_TOOLSETS = st.sampled_from([(), (WEATHER,)])


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(conversation=_conversation(), tools=_TOOLSETS, name=st.sampled_from(sorted(_TEMPLATES)))
def test_generated_text_is_a_prefix_of_the_next_prompt(
    conversation: list[Message], tools: tuple[ToolSpec, ...], name: str
) -> None:
    template = _TEMPLATES[name]
    full = template.render(conversation, tools, add_generation_prompt=True)
    for k, message in enumerate(conversation):
        if message.role != "assistant" or message.tool_calls:
            continue
        prompt = template.render(conversation[:k], tools, add_generation_prompt=True)
        assert full.startswith(prompt + message.content), (name, k)


def _carries_system(conversation: list[Message], n: int) -> bool:
    """Message n opens the first user turn (tool results render as one), which takes in the
    system text."""
    return n == 1 and conversation[0].role == "system" and conversation[1].role in ("user", "tool")


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(conversation=_conversation(), tools=_TOOLSETS, name=st.sampled_from(sorted(_TEMPLATES)))
def test_history_grows_append_only(
    conversation: list[Message], tools: tuple[ToolSpec, ...], name: str
) -> None:
    template = _TEMPLATES[name]
    folds_system = name in ("gemma", "mistral")
    for n in range(1, len(conversation)):
        nxt = conversation[n]
        if folds_system and _carries_system(conversation, n):
            continue
        if (
            not template.native_tools
            and conversation[n - 1].role == "tool"
            and nxt.role in ("tool", "user")
        ):
            continue  # joins the open tool-result turn (see _text_only_messages)
        before = template.render(conversation[:n], tools, add_generation_prompt=False)
        after = template.render(conversation[: n + 1], tools, add_generation_prompt=False)
        assert after.startswith(before), (name, n)
        assert len(after) > len(before), (name, n)  # every message leaves a trace


def test_append_only_exceptions_really_are_exceptions() -> None:
    # Documents the excluded transitions; if they ever start holding, tighten the tests.
    gemma = builtin_template("gemma")
    system_only = gemma.render([Message("system", "S")], [], False)
    with_user = gemma.render([Message("system", "S"), Message("user", "U")], [], False)
    assert not with_user.startswith(system_only)
    chatml = builtin_template("chatml")
    tail = [Message("user", "q"), Message("tool", "r")]
    for joining in (Message("user", "u"), Message("tool", "r2")):
        assert not chatml.render(tail + [joining], [], False).startswith(
            chatml.render(tail, [], False)
        )


# ---------------------------------------------------------------------------------------------
# The served default's own template, read from Qwen2.5-Coder-0.5B-Instruct's GGUF metadata
# ---------------------------------------------------------------------------------------------


def _gguf_metadata(path: object) -> dict[str, str]:
    """The metadata the engine picks its template from (vocabulary only: no weights, ~1 s)."""
    from llama_cpp import Llama

    return Llama(model_path=str(path), vocab_only=True, verbose=False).metadata


def test_qwen_gguf_template_renders_tools_calls_and_results(instruct_model_path: object) -> None:
    """Model: Qwen2.5-Coder-0.5B-Instruct (metadata only, no weights loaded)."""
    template = select_template(_gguf_metadata(instruct_model_path))
    assert (template.name, template.tool_format, template.native_tools) == ("gguf", "hermes", True)
    assert template.stop_strings == ("<|im_end|>",) and template.eos_token == "<|im_end|>"
    call = ToolCall("call_1", "get_weather", '{"city": "Paris"}')
    text = template.render(
        [Message("system", "You are terse."), Message("user", "Weather in Paris?"),
         Message("assistant", "", tool_calls=(call,)), Message("tool", '{"temp_c": 21}', tool_call_id="call_1")],
        [WEATHER],
    )
    tools_line = json.dumps({"type": "function", "function": {
        "name": "get_weather", "description": WEATHER.description, "parameters": WEATHER.parameters}})
    assert text.startswith("<|im_start|>system\nYou are terse.\n\n# Tools\n")
    assert f"<tools>\n{tools_line}\n</tools>" in text  # the spec itself, not HTML-escaped
    assert text.endswith(
        "<|im_start|>user\nWeather in Paris?<|im_end|>\n"
        '<|im_start|>assistant\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n'
        "</tool_call><|im_end|>\n"
        '<|im_start|>user\n<tool_response>\n{"temp_c": 21}\n</tool_response><|im_end|>\n'
        "<|im_start|>assistant\n"
    )
    plain = template.render([Message("user", "Say hi")], [])
    assert plain == ("<|im_start|>system\nYou are Qwen, created by Alibaba Cloud. You are a helpful assistant."
                     "<|im_end|>\n<|im_start|>user\nSay hi<|im_end|>\n<|im_start|>assistant\n")
