"""Chat templates: turn a neutral conversation into the exact prompt text one model expects.

A GGUF usually carries its own Jinja template (`tokenizer.chat_template`); when it does not, or
when the operator overrides it, a small built-in template is picked by architecture. Built-ins
never render tools themselves: tool specs, calls and results are rewritten into plain Hermes-style
text before the Jinja step, so every template stays a simple "role + text" loop.

Prompts must grow append-only from turn to turn, because the engine reuses the KV cache of the
longest common prefix. So nothing here trims, reorders or re-serialises text in a way that would
change an earlier turn when a later one is added. Two transitions are exceptions by design, both
arriving within one request so no cached prefix is lost: the first user turn taking in the system
text (Gemma, Mistral), and tool results or a user message joining an open tool-result turn.
"""

from __future__ import annotations

import functools
import hashlib
import json
import logging
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import jinja2
from jinja2.sandbox import ImmutableSandboxedEnvironment

from policies.conversation_types import Message, ToolCall, ToolSpec

__all__ = [
    "BUILTIN_NAMES",
    "ChatTemplate",
    "ChatTemplateError",
    "builtin_template",
    "select_template",
]

log = logging.getLogger(__name__)


class ChatTemplateError(ValueError):
    """A template refused the conversation (raise_exception) or failed to render."""


# ---------------------------------------------------------------------------------------------
# Built-in Jinja sources. They see only system/user/assistant messages with string content.
# ---------------------------------------------------------------------------------------------

# Gemma has no system role: the system text opens the first user turn. If the conversation does
# not start with a user turn, the system text gets a user turn of its own.
_GEMMA = r"""
{%- if messages and messages[0]['role'] == 'system' -%}
{%- set system = messages[0]['content'] -%}
{%- set loop_messages = messages[1:] -%}
{%- else -%}
{%- set system = '' -%}
{%- set loop_messages = messages -%}
{%- endif -%}
{%- if system and (not loop_messages or loop_messages[0]['role'] != 'user') -%}
{{- '<start_of_turn>user\n' + system + '<end_of_turn>\n' -}}
{%- endif -%}
{%- for message in loop_messages -%}
{{- '<start_of_turn>' + ('model' if message['role'] == 'assistant' else 'user') + '\n' -}}
{%- if loop.first and system and message['role'] == 'user' -%}
{{- system + '\n\n' -}}
{%- endif -%}
{{- message['content'] + '<end_of_turn>\n' -}}
{%- endfor -%}
{%- if add_generation_prompt -%}
{{- '<start_of_turn>model\n' -}}
{%- endif -%}
"""

_CHATML = r"""
{%- for message in messages -%}
{{- '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>\n' -}}
{%- endfor -%}
{%- if add_generation_prompt -%}
{{- '<|im_start|>assistant\n' -}}
{%- endif -%}
"""

_LLAMA3 = r"""
{%- for message in messages -%}
{{- '<|start_header_id|>' + message['role'] + '<|end_header_id|>\n\n' + message['content'] + '<|eot_id|>' -}}
{%- endfor -%}
{%- if add_generation_prompt -%}
{{- '<|start_header_id|>assistant<|end_header_id|>\n\n' -}}
{%- endif -%}
"""

# Mistral's own templates put the system text into the *last* user turn, which would rewrite
# history every turn; here it opens the first one instead, as Gemma's does. The model answers
# right after [/INST], so there is no separate generation prompt.
_MISTRAL = r"""
{%- if messages and messages[0]['role'] == 'system' -%}
{%- set system = messages[0]['content'] -%}
{%- set loop_messages = messages[1:] -%}
{%- else -%}
{%- set system = '' -%}
{%- set loop_messages = messages -%}
{%- endif -%}
{%- if system and (not loop_messages or loop_messages[0]['role'] != 'user') -%}
{{- '[INST] ' + system + ' [/INST]' -}}
{%- endif -%}
{%- for message in loop_messages -%}
{%- if message['role'] == 'assistant' -%}
{{- message['content'] + eos_token -}}
{%- else -%}
{{- '[INST] ' -}}
{%- if loop.first and system and message['role'] == 'user' -%}
{{- system + '\n\n' -}}
{%- endif -%}
{{- message['content'] + ' [/INST]' -}}
{%- endif -%}
{%- endfor -%}
"""


@dataclass(frozen=True)
class _Builtin:
    source: str
    stop_strings: tuple[str, ...]
    eos_token: str


_BUILTINS: dict[str, _Builtin] = {
    "gemma": _Builtin(_GEMMA, ("<end_of_turn>",), "<eos>"),
    "chatml": _Builtin(_CHATML, ("<|im_end|>",), "<|im_end|>"),
    "llama3": _Builtin(_LLAMA3, ("<|eot_id|>",), "<|eot_id|>"),
    "mistral": _Builtin(_MISTRAL, ("</s>",), "</s>"),
}
BUILTIN_NAMES: tuple[str, ...] = tuple(_BUILTINS)

# End-of-turn markers a GGUF template may spell out literally; each becomes a stop string.
_END_MARKERS: tuple[str, ...] = (
    "<|im_end|>",
    "<end_of_turn>",
    "<|eot_id|>",
    "<|eom_id|>",
    "<|end|>",
    "<|END_OF_TURN_TOKEN|>",
    "</s>",
)
# llama-cpp-python's metadata holds only the EOS token id, not its text, so the text is guessed
# from what the template looks like (first match wins).
_EOS_HINTS: tuple[tuple[str, str], ...] = (
    ("<|im_end|>", "<|im_end|>"),
    ("<end_of_turn>", "<eos>"),
    ("<|eot_id|>", "<|eot_id|>"),
    ("<|end|>", "<|endoftext|>"),
    ("<|END_OF_TURN_TOKEN|>", "<|END_OF_TURN_TOKEN|>"),
)
_DEFAULT_EOS = "</s>"

# BOS spellings some templates hard-code instead of using {{ bos_token }}. The tokenizer adds
# BOS itself, so a literal one at the start of the text would be doubled.
_LITERAL_BOS: tuple[str, ...] = ("<|begin_of_text|>", "<bos>", "<s>", "<|startoftext|>")


# ---------------------------------------------------------------------------------------------
# Jinja environment
# ---------------------------------------------------------------------------------------------


def _raise_exception(message: str) -> None:
    raise ChatTemplateError(message)


def _tojson(
    value: Any,
    indent: int | None = None,
    separators: tuple[str, str] | None = None,
    sort_keys: bool = False,
    ensure_ascii: bool = False,
) -> str:
    # Jinja's own tojson HTML-escapes '<', '>' and '&', which no model was trained on.
    return json.dumps(
        value, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys
    )


def _strftime_now(fmt: str) -> str:
    # Some templates (Llama 3.2, Granite) print today's date; it changes once a day at most.
    return datetime.now().strftime(fmt)


@functools.lru_cache(maxsize=1)
def _environment() -> ImmutableSandboxedEnvironment:
    env = ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True, extensions=["jinja2.ext.loopcontrols"]
    )
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = _strftime_now
    return env


@functools.lru_cache(maxsize=32)
def _compile(source: str) -> jinja2.Template:
    return _environment().from_string(source)


# ---------------------------------------------------------------------------------------------
# Message conversion
# ---------------------------------------------------------------------------------------------


def _arguments_value(arguments: str) -> Any:
    """The call's arguments as templates expect them: a dict in the client's key order."""
    try:
        value = json.loads(arguments)
    except ValueError:
        return arguments
    return value if isinstance(value, dict) else arguments


def _tool_call_dict(call: ToolCall) -> dict[str, Any]:
    return {
        "id": call.id,
        "type": "function",
        "function": {"name": call.name, "arguments": _arguments_value(call.arguments)},
    }


def _message_dict(message: Message) -> dict[str, Any]:
    # Optional keys are left out rather than set to None: many HF templates test `is defined`.
    out: dict[str, Any] = {"role": message.role, "content": message.content}
    if message.tool_calls:
        out["tool_calls"] = [_tool_call_dict(c) for c in message.tool_calls]
    if message.tool_call_id is not None:
        out["tool_call_id"] = message.tool_call_id
    if message.name is not None:
        out["name"] = message.name
    return out


def _tool_dict(spec: ToolSpec) -> dict[str, Any]:
    return {
        "type": "function",
        "function": {
            "name": spec.name,
            "description": spec.description,
            "parameters": spec.parameters,
        },
    }


def _tool_prompt(tools: Sequence[ToolSpec]) -> str:
    listing = "\n".join(json.dumps(_tool_dict(t), ensure_ascii=False) for t in tools)
    return (
        "# Tools\n\n"
        "You can call functions to help answer. Their JSON signatures are listed between "
        "<tools> and </tools>:\n"
        f"<tools>\n{listing}\n</tools>\n\n"
        "To call a function, answer with one line per call, in exactly this form:\n"
        '<tool_call>{"name": "<function name>", "arguments": {<arguments as a JSON object>}}'
        "</tool_call>\n"
        "Each result comes back to you between <tool_response> and </tool_response>."
    )


def _render_call(call: ToolCall) -> str:
    # Same shape the tool prompt asks for, so the model sees its own convention in history.
    body = {"name": call.name, "arguments": _arguments_value(call.arguments)}
    return f"<tool_call>{json.dumps(body, ensure_ascii=False)}</tool_call>"


def _tool_response(message: Message) -> str:
    return f"<tool_response>\n{message.content}\n</tool_response>"


def _text_only_messages(
    messages: Sequence[Message], tools: Sequence[ToolSpec]
) -> list[dict[str, Any]]:
    """Rewrite tool specs, calls and results as plain text for templates that cannot render them.

    A run of tool results becomes one user turn. The user message right after the results, if
    any, joins that same turn: templates that insist on alternating roles (Gemma's, Mistral's) would
    otherwise refuse the common "tool results plus a note from the user" shape.
    """
    out: list[dict[str, Any]] = []
    in_tool_turn = False  # the last entry of `out` is a user turn that began with tool results
    for message in messages:
        if message.role == "tool":
            if in_tool_turn:
                out[-1]["content"] += "\n" + _tool_response(message)
            else:
                out.append({"role": "user", "content": _tool_response(message)})
                in_tool_turn = True
            continue
        if message.role == "user" and in_tool_turn:
            out[-1]["content"] += "\n" + message.content
            in_tool_turn = False
            continue
        in_tool_turn = False
        content = message.content
        if message.role == "assistant" and message.tool_calls:
            calls = "\n".join(_render_call(c) for c in message.tool_calls)
            if content and not content.endswith("\n"):
                content += "\n"
            content += calls
        out.append({"role": message.role, "content": content})

    if tools:
        prompt = _tool_prompt(tools)
        if out and out[0]["role"] == "system":
            system = out[0]["content"]
            out[0]["content"] = f"{system}\n\n{prompt}" if system else prompt
        else:
            out.insert(0, {"role": "system", "content": prompt})
    return out


# ---------------------------------------------------------------------------------------------
# The template
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class ChatTemplate:
    name: str
    source: str
    # Which parser reads tool calls out of this model's output (see engine.tool_parsers).
    tool_format: str
    # True when the Jinja source renders `tools` and tool messages itself.
    native_tools: bool
    stop_strings: tuple[str, ...]
    eos_token: str = _DEFAULT_EOS

    @property
    def sha256(self) -> str:
        return hashlib.sha256((self.source + self.tool_format).encode("utf-8")).hexdigest()

    def render(
        self,
        messages: Sequence[Message],
        tools: Sequence[ToolSpec],
        add_generation_prompt: bool = True,
    ) -> str:
        """The prompt text, without BOS (the tokenizer adds it)."""
        if self.native_tools:
            chat: list[dict[str, Any]] = [_message_dict(m) for m in messages]
            tool_dicts = [_tool_dict(t) for t in tools] or None
        else:
            chat = _text_only_messages(messages, tools)
            tool_dicts = None
        try:
            text = _compile(self.source).render(
                messages=chat,
                tools=tool_dicts,
                add_generation_prompt=add_generation_prompt,
                bos_token="",
                eos_token=self.eos_token,
            )
        except ChatTemplateError:
            raise
        except jinja2.TemplateError as exc:
            raise ChatTemplateError(f"chat template {self.name!r} failed: {exc}") from exc
        for bos in _LITERAL_BOS:
            if text.startswith(bos):
                return text[len(bos) :]
        return text


def builtin_template(name: str) -> ChatTemplate:
    key = name.strip().lower()
    builtin = _BUILTINS.get(key)
    if builtin is None:
        raise ValueError(
            f"unknown chat template {name!r}; built-in templates are: {', '.join(BUILTIN_NAMES)}"
        )
    return ChatTemplate(
        name=key,
        source=builtin.source,
        tool_format="hermes",  # built-ins get the injected Hermes-style tool prompt
        native_tools=False,
        stop_strings=builtin.stop_strings,
        eos_token=builtin.eos_token,
    )


def _builtin_for_architecture(architecture: str) -> str:
    arch = architecture.strip().lower()
    if arch.startswith("gemma"):
        return "gemma"
    if arch == "llama":
        return "llama3"
    if arch.startswith("mistral"):
        return "mistral"
    return "chatml"  # qwen2, qwen3, qwen2moe, ... and a reasonable guess for the rest


def _detect_tool_format(source: str) -> str:
    if "<tool_call>" in source:
        return "hermes"
    if "[TOOL_CALLS]" in source:
        return "mistral"
    if "<|python_tag|>" in source or ('"parameters"' in source and "ipython" in source):
        return "llama3_json"
    return "hermes"


_MENTIONS_TOOLS = re.compile(r"\btools\b")


def _from_gguf(source: str) -> ChatTemplate:
    native = bool(_MENTIONS_TOOLS.search(source))
    # Without native tool support we inject the Hermes prompt, so the model answers in Hermes.
    tool_format = _detect_tool_format(source) if native else "hermes"
    stops = tuple(marker for marker in _END_MARKERS if marker in source)
    eos = next((e for marker, e in _EOS_HINTS if marker in source), _DEFAULT_EOS)
    return ChatTemplate(
        name="gguf",
        source=source,
        tool_format=tool_format,
        native_tools=native,
        stop_strings=stops,
        eos_token=eos,
    )


def select_template(metadata: Mapping[str, str], override: str | None = None) -> ChatTemplate:
    """The template for a model, from its GGUF metadata (as llama_cpp.Llama.metadata gives it).

    `override` names a built-in and always wins. Otherwise the GGUF's own template is used; a
    missing or unparsable one falls back to a built-in chosen by `general.architecture`.
    """
    if override is not None:
        return builtin_template(override)
    source = metadata.get("tokenizer.chat_template") or ""
    if source.strip():
        try:
            _compile(source)
        except jinja2.TemplateSyntaxError as exc:
            log.warning("GGUF chat template does not parse (%s); using a built-in", exc)
        else:
            return _from_gguf(source)
    return builtin_template(_builtin_for_architecture(metadata.get("general.architecture", "")))
