"""Tool outputs that arrive as user messages, and a harness's own words.

Agents without native tool calls (mini-swe-agent, SWE-agent, Aider, OpenHands without function
calling) send each command's output back as a *user* message in a fixed wrapper, and their harness
adds its own boilerplate as user messages too (a format error, an "output too long" warning). Neither
is the user asking anything: a request built from them ranks a new output against the previous one.
This module tells them apart by their real wrappers, so the rest of the gateway can treat such a
message as the tool output it is.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Literal

from policies.conversation_types import Message
from policies.rendering import bare, split_lines

MessageKind = Literal["system", "user", "assistant", "tool_output", "harness"]

# Openings of a command's output sent as a user message, matched at the message's first
# non-blank characters (each agent's own template; tests/test_observations.py quotes them).
_OBSERVATION_OPENINGS: tuple[tuple[str, re.Pattern[str]], ...] = (
    # mini-swe-agent: "<returncode>0</returncode>\n<output>..." (<warning>/<output_head> when long),
    # v2 opens with "<exception>" when the command failed to run; v1's timeout quotes the command.
    ("mini-swe-agent", re.compile(r"<(?:returncode>-?\d+</returncode>|exception>)")),
    ("mini-swe-agent", re.compile(r"The last command <command>")),
    # SWE-agent's next-step templates (and OpenHands' older CodeAct): "OBSERVATION:\n{observation}",
    # the built-in "Observation: ", the empty-output note, and its history processor's stand-in.
    ("swe-agent", re.compile(r"(?:OBSERVATION:\s*\n|Observation: )")),
    ("swe-agent", re.compile(r"Your command ran successfully and did not produce any output")),
    ("swe-agent", re.compile(r"Old environment output:")),
    # OpenHands without native function calling: "EXECUTION RESULT of [execute_bash]:\n...".
    ("openhands", re.compile(r"EXECUTION RESULT of \[[\w.-]+\]:")),
    # Aider's /run and /test ("I ran this command:\n\n{command}\n\nAnd got this output:") and its
    # lint reflection. (Its "Output from {command}" is left out: a user's own paste opens so too.)
    ("aider", re.compile(r"I ran this command:\s*\n")),
    ("aider", re.compile(r"# Fix any errors below, if possible\.")),
)
# OpenHands' command outputs end with the exit code whatever opened them.
_OBSERVATION_ENDINGS: tuple[tuple[str, re.Pattern[str]], ...] = (
    ("openhands", re.compile(r"\[(?:Command (?:\S+ )?finished with exit code -?\d+|"
                             r"The command completed with exit code -?\d+\.?)\]\s*$")),
)

# A harness message that is neither the user's words nor a command's output: a complaint about the
# agent's format, a step limit, files added. Matched at the start of the message.
_HARNESS_OPENINGS: tuple[re.Pattern[str], ...] = (
    re.compile(r"Please always provide EXACTLY ONE action"),  # mini-swe-agent v1's format error
    re.compile(r"(?:Format|Tool call) error:"),  # mini-swe-agent v2
    re.compile(r"Your previous response reached the output token limit"),
    re.compile(r"Your output was not formatted correctly"),  # SWE-agent's parsers
    re.compile(r"Your last output (?:did not use any|included multiple) tool calls"),
    re.compile(r"Your action could not be parsed properly"),
    re.compile(r"Your bash command contained syntax errors"),
    re.compile(r"I added these files to the chat"),  # Aider
)

# The wrapper lines a mini-swe-agent output opens with, down to and including the line that opens
# the output itself: the exception, the return code, the harness's warning, the output tag.
_WRAPPER_LINE = re.compile(r"^\s*</?(?:returncode|warning|output|output_head|exception)>")
_OUTPUT_OPENED = re.compile(r"<(?:output|output_head)>\s*$")
MAX_WRAPPER_LINES = 16

# The last fenced block of an agent's turn: the command it ran (```bash ...``` or ``` ... ```);
# OpenHands without native calls writes "<function=execute_bash><parameter=command>...".
_FENCED = re.compile(r"```[\w+-]*[ \t]*\n(.*?)```", re.S)
_FUNCTION = re.compile(r"<function=([\w.-]+)>(.*?)(?:</function>|$)", re.S)
_PARAMETER = re.compile(r"<parameter=[\w.-]+>(.*?)(?:</parameter>|(?=<parameter=)|$)", re.S)


def observation_agent(text: str) -> str | None:
    """The agent whose tool-output wrapper `text` is in, or None."""
    head, tail = text.lstrip()[:200], text[-200:]
    return next((agent for agent, opening in _OBSERVATION_OPENINGS if opening.match(head)),
                next((agent for agent, ending in _OBSERVATION_ENDINGS if ending.search(tail)), None))


def is_harness_message(text: str) -> bool:
    head = text.lstrip()[:200]
    return any(opening.match(head) for opening in _HARNESS_OPENINGS)


def message_kind(message: Message) -> MessageKind:
    """What a message is, whatever role carried it: a user message in a tool-output wrapper is a
    tool output; a harness's format complaint is the harness's."""
    if message.role == "tool":
        return "tool_output"
    if message.role == "user":
        if observation_agent(message.content) is not None:
            return "tool_output"
        if is_harness_message(message.content):
            return "harness"
    return message.role


def is_tool_output(message: Message) -> bool:
    return message_kind(message) == "tool_output"


def is_user_words(message: Message) -> bool:
    """A user message the user (or the task) wrote: not a tool output, not the harness's."""
    return message_kind(message) == "user"


def agent_command(text: str) -> str | None:
    """The command an agent's turn ran as text: its last fenced block, or its last function block
    (name and parameter values)."""
    functions = _FUNCTION.findall(text)
    if functions:
        name, body = functions[-1]
        values = [v.strip() for v in _PARAMETER.findall(body) if v.strip()]
        return " ".join([name, *values])
    blocks = _FENCED.findall(text)
    command = blocks[-1].strip() if blocks else ""
    return command or None


def without_command(text: str) -> str:
    """An agent's turn without its command blocks: its stated intent."""
    return _FUNCTION.sub("", _FENCED.sub("", text)).strip()


def wrapper_lines(text: str) -> tuple[int, int] | None:
    """0-based inclusive span of a wrapped output's opening lines (return code, the harness's
    warning, the tag that opens the output), kept whatever the scores say: without them the model
    reads a bare excerpt and cannot tell whether the command failed."""
    lines = [bare(line) for line in split_lines(text)[:MAX_WRAPPER_LINES]]
    if not lines or not _WRAPPER_LINE.match(lines[0]):
        return None
    in_warning = False
    for i, line in enumerate(lines):
        if "<warning>" in line:
            in_warning = True
        if "</warning>" in line:
            in_warning = False
        if not in_warning and _OUTPUT_OPENED.search(line):
            return (0, i)
        if not (in_warning or _WRAPPER_LINE.match(line)):
            return (0, i - 1) if i > 0 else None
    return None


def latest_user_words(messages: Sequence[Message], before: int) -> int | None:
    """Index of the latest non-empty message before `before` that the user wrote."""
    return next((i for i in range(before - 1, -1, -1)
                 if is_user_words(messages[i]) and messages[i].content.strip()), None)
