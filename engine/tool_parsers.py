"""Read tool calls out of generated text, whole or while it streams.

Each model family marks calls its own way (Hermes/Qwen `<tool_call>` tags, bare JSON or a ```json
fence; Llama 3 bare JSON; Mistral `[TOOL_CALLS]`). A parser turns finished text into (prose, calls); `ToolCallStream` wraps one so
prose reaches the client token by token while anything that may be a call is held until the end.

Parsing never raises: markup that does not hold a valid call stays in the prose as text.
"""

from __future__ import annotations

import json
import re
import secrets
from collections.abc import Callable, Iterable
from typing import Any, Protocol

from policies.conversation_types import TextDelta, ToolCall, ToolCallDelta

__all__ = [
    "HermesParser",
    "Llama3JsonParser",
    "MistralParser",
    "ParsedCall",
    "ToolCallParser",
    "ToolCallStream",
    "new_call_id",
    "parser_for",
]

# (name, arguments as a JSON object serialised to a string)
ParsedCall = tuple[str, str]


class ToolCallParser(Protocol):
    # Markers that open tool-call markup wherever they appear.
    start_markers: tuple[str, ...]
    # Markers that open a call only as the first non-whitespace text of the output (Llama 3's
    # bare JSON); a '{' later in prose is just prose.
    leading_markers: tuple[str, ...]

    def parse(self, text: str) -> tuple[str, list[ParsedCall]]: ...


_DECODER = json.JSONDecoder()
_WS = re.compile(r"\s*")


def _skip_ws(text: str, pos: int) -> int:
    match = _WS.match(text, pos)
    return match.end() if match else pos


def _arguments_json(value: Any) -> str | None:
    """Arguments as a JSON-object string, or None when they are not an object."""
    if value is None:
        value = {}
    if isinstance(value, str):
        # Some models double-encode the arguments.
        try:
            value = json.loads(value)
        except ValueError:
            return None
    if not isinstance(value, dict):
        return None
    return json.dumps(value, ensure_ascii=False)


def _call_from_object(obj: Any, require_arguments: bool = False) -> ParsedCall | None:
    """A call from {"name": ..., "arguments"|"parameters": {...}}, or None if it is not one.

    Inside explicit call markup a missing arguments key means "no arguments"; for bare JSON
    (`require_arguments`) it means the model just answered with a JSON object.
    """
    if not isinstance(obj, dict):
        return None
    name = obj.get("name")
    if not isinstance(name, str) or not name.strip():
        return None
    if require_arguments and "arguments" not in obj and "parameters" not in obj:
        return None
    args = obj["arguments"] if "arguments" in obj else obj.get("parameters")
    arguments = _arguments_json(args)
    if arguments is None:
        return None
    return name.strip(), arguments


def _find_marker(text: str, markers: Iterable[str], start: int) -> tuple[int, str] | None:
    """The earliest marker occurrence at or after `start`."""
    best: tuple[int, str] | None = None
    for marker in markers:
        at = text.find(marker, start)
        if at != -1 and (best is None or at < best[0]):
            best = (at, marker)
    return best


# Reads the calls that begin at a marker: (calls, end of the markup), or None when it holds none.
_CallReader = Callable[[str, int, str], "tuple[list[ParsedCall], int] | None"]


def _split_at_markers(
    text: str, markers: tuple[str, ...], read: _CallReader
) -> tuple[str, list[ParsedCall]]:
    """Shared scan for marker-based formats.

    Text before the first marker is kept verbatim (the stream has already sent it). After that,
    whitespace-only gaps between calls are markup and dropped; markup that fails to parse is kept
    verbatim up to the next marker.
    """
    found = _find_marker(text, markers, 0)
    if found is None:
        return text, []
    content = [text[: found[0]]]
    calls: list[ParsedCall] = []
    while found is not None:
        at, marker = found
        result = read(text, at, marker)
        if result is None:
            following = _find_marker(text, markers, at + len(marker))
            end = following[0] if following else len(text)
            content.append(text[at:end])
        else:
            new_calls, end = result
            calls.extend(new_calls)
            following = _find_marker(text, markers, end)
            gap = text[end : following[0] if following else len(text)]
            if gap.strip():
                content.append(gap)
        found = following
    return "".join(content), calls


# ---------------------------------------------------------------------------------------------
# Hermes (Qwen, Hermes, and the prompt the built-in templates inject)
# ---------------------------------------------------------------------------------------------


def _read_call_objects(text: str, pos: int, require_arguments: bool) -> tuple[list[ParsedCall], int] | None:
    """Call objects from `pos` on: one or more `{"name": ..., "arguments": ...}` (or a JSON array of
    them), separated by whitespace, ',' or ';'. (calls, end of the last one), or None if none."""
    calls: list[ParsedCall] = []
    end = pos
    at = _skip_ws(text, pos)
    while at < len(text) and text[at] in "{[":
        try:
            value, after = _DECODER.raw_decode(text, at)
        except ValueError:
            break
        items = value if isinstance(value, list) else [value]
        found = [_call_from_object(item, require_arguments) for item in items]
        if not found or any(call is None for call in found):
            break
        calls.extend(call for call in found if call is not None)
        end = after
        at = _skip_ws(text, after)
        if at < len(text) and text[at] in ",;":
            at = _skip_ws(text, at + 1)
    return (calls, end) if calls else None


class HermesParser:
    """Every form Qwen2.5 (and other Hermes-style models) writes tool calls in:

    - `<tool_call>{"name": ..., "arguments": {...}}</tool_call>`, any number of them (the form its
      own chat template asks for);
    - output that starts with bare call JSON, `{"name": ..., "arguments": {...}}`, one or several;
    - a ```json fenced block holding such JSON, anywhere in the output.

    Bare JSON counts only at the very start and only with an "arguments"/"parameters" key, so a
    model answering with some other JSON object, or prose mentioning braces, is not a call.
    """

    start_markers: tuple[str, ...] = ("<tool_call>", "```json")
    leading_markers: tuple[str, ...] = ("{",)
    _close = "</tool_call>"
    _fence = "```"

    def parse(self, text: str) -> tuple[str, list[ParsedCall]]:
        leading = _read_call_objects(text, 0, require_arguments=True) if text.lstrip().startswith("{") else None
        if leading is None:
            return _split_at_markers(text, self.start_markers, self._read)
        calls, end = leading
        rest, more = _split_at_markers(text[end:], self.start_markers, self._read)
        return (rest if rest.strip() else ""), calls + more

    def _read(self, text: str, at: int, marker: str) -> tuple[list[ParsedCall], int] | None:
        return self._read_fence(text, at + len(marker)) if marker == "```json" else self._read_tag(text, at, marker)

    def _read_tag(self, text: str, at: int, marker: str) -> tuple[list[ParsedCall], int] | None:
        body_start = at + len(marker)
        close = text.find(self._close, body_start)
        reopen = text.find(marker, body_start)
        # A missing close tag is tolerated: generation may stop right after the JSON.
        if close != -1 and (reopen == -1 or close < reopen):
            body_end, end = close, close + len(self._close)
        else:
            body_end = reopen if reopen != -1 else len(text)
            end = body_end
        body = text[body_start:body_end]
        result = _read_call_objects(body, 0, require_arguments=False)
        if result is None or body[result[1] :].strip():
            return None
        return result[0], end

    def _read_fence(self, text: str, body_start: int) -> tuple[list[ParsedCall], int] | None:
        result = _read_call_objects(text, body_start, require_arguments=False)
        if result is None:
            return None
        calls, end = result
        after = _skip_ws(text, end)
        if after == len(text):
            return calls, after  # generation stopped before the closing fence
        if text.startswith(self._fence, after):
            return calls, after + len(self._fence)
        return None


# ---------------------------------------------------------------------------------------------
# Llama 3.1+ (JSON tool calling)
# ---------------------------------------------------------------------------------------------


def _read_json_calls(text: str, pos: int) -> tuple[list[ParsedCall], int] | None:
    """One or more call objects separated by ';' starting at `pos`: (calls, end)."""
    calls: list[ParsedCall] = []
    pos = _skip_ws(text, pos)
    while True:
        try:
            obj, pos = _DECODER.raw_decode(text, pos)
        except ValueError:
            return None
        call = _call_from_object(obj, require_arguments=True)
        if call is None:
            return None
        calls.append(call)
        after = _skip_ws(text, pos)
        if after < len(text) and text[after] == ";":
            pos = _skip_ws(text, after + 1)
            if pos == len(text):
                return calls, pos  # a trailing ';'
            continue
        return calls, pos


class Llama3JsonParser:
    """Output that is exactly `{"name": ..., "parameters": {...}}` (or several, ';'-separated),
    or such JSON after `<|python_tag|>`."""

    start_markers: tuple[str, ...] = ("<|python_tag|>",)
    leading_markers: tuple[str, ...] = ("{",)

    def parse(self, text: str) -> tuple[str, list[ParsedCall]]:
        stripped = text.strip()
        if stripped.startswith("{"):
            result = _read_json_calls(stripped, 0)
            if result is not None and result[1] == len(stripped):
                return "", result[0]
        return _split_at_markers(text, self.start_markers, self._read)

    @staticmethod
    def _read(text: str, at: int, marker: str) -> tuple[list[ParsedCall], int] | None:
        return _read_json_calls(text, at + len(marker))


# ---------------------------------------------------------------------------------------------
# Mistral
# ---------------------------------------------------------------------------------------------

# `name[ARGS]` (v11+ tokenizers), optionally with `[CALL_ID]id` between the two.
_MISTRAL_NAMED = re.compile(
    r"\s*([A-Za-z0-9_.:\-]+)\s*(?:\[CALL_ID\]\s*[A-Za-z0-9_\-]+\s*)?\[ARGS\]"
)


class MistralParser:
    """`[TOOL_CALLS] [{"name": ..., "arguments": {...}}, ...]` or `[TOOL_CALLS]name[ARGS]{...}`."""

    start_markers: tuple[str, ...] = ("[TOOL_CALLS]",)
    leading_markers: tuple[str, ...] = ()

    def parse(self, text: str) -> tuple[str, list[ParsedCall]]:
        return _split_at_markers(text, self.start_markers, self._read)

    @staticmethod
    def _read(text: str, at: int, marker: str) -> tuple[list[ParsedCall], int] | None:
        pos = _skip_ws(text, at + len(marker))
        if text.startswith("[", pos) and not text.startswith("[ARGS]", pos):
            return MistralParser._read_array(text, pos)
        return MistralParser._read_named(text, pos)

    @staticmethod
    def _read_array(text: str, pos: int) -> tuple[list[ParsedCall], int] | None:
        try:
            items, end = _DECODER.raw_decode(text, pos)
        except ValueError:
            return None
        if not isinstance(items, list) or not items:
            return None
        calls = [_call_from_object(item) for item in items]
        if any(c is None for c in calls):
            return None
        return [c for c in calls if c is not None], end

    @staticmethod
    def _read_named(text: str, pos: int) -> tuple[list[ParsedCall], int] | None:
        calls: list[ParsedCall] = []
        # Several calls may follow one marker back to back: a[ARGS]{...}b[ARGS]{...}
        while (match := _MISTRAL_NAMED.match(text, pos)) is not None:
            try:
                args, end = _DECODER.raw_decode(text, _skip_ws(text, match.end()))
            except ValueError:
                break
            arguments = _arguments_json(args)
            if arguments is None:
                break
            calls.append((match.group(1), arguments))
            pos = end
        return (calls, pos) if calls else None


_PARSERS: dict[str, Callable[[], ToolCallParser]] = {
    "hermes": HermesParser,
    "llama3_json": Llama3JsonParser,
    "mistral": MistralParser,
}


def parser_for(tool_format: str) -> ToolCallParser:
    factory = _PARSERS.get(tool_format)
    if factory is None:
        raise ValueError(
            f"unknown tool format {tool_format!r}; known formats: {', '.join(_PARSERS)}"
        )
    return factory()


# ---------------------------------------------------------------------------------------------
# Streaming
# ---------------------------------------------------------------------------------------------


def new_call_id() -> str:
    return "call_" + secrets.token_hex(12)


def _partial_marker_suffix(text: str, markers: tuple[str, ...]) -> int:
    """Length of the longest end of `text` that is a proper beginning of some marker."""
    longest = 0
    for marker in markers:
        for size in range(min(len(marker) - 1, len(text)), longest, -1):
            if text.endswith(marker[:size]):
                longest = size
                break
    return longest


class ToolCallStream:
    """Turns generated text, as it arrives, into text and tool-call events.

    Prose is passed on as soon as it cannot be the start of a marker; from the first marker on,
    everything is held and parsed by `finish()`. The events joined together always equal
    `parser.parse()` of the whole text, however the text was split.
    """

    def __init__(self, parser: ToolCallParser, id_factory: Callable[[], str] = new_call_id):
        self._parser = parser
        self._new_id = id_factory
        self._pending = ""  # received but not yet sent, since it might open a marker
        self._buffering = False  # a marker was seen: hold everything until finish()
        self._at_start = True  # only whitespace so far, so a leading marker still counts
        self._finished = False
        self._calls = 0

    @property
    def has_tool_calls(self) -> bool:
        """Whether finish() found at least one call."""
        return self._calls > 0

    def feed(self, delta: str) -> list[TextDelta | ToolCallDelta]:
        if self._finished:
            raise RuntimeError("ToolCallStream.feed() after finish()")
        self._pending += delta
        if self._buffering:
            return []
        if self._at_start and self._parser.leading_markers:
            head = self._pending.lstrip()
            if not head:
                return []
            leading = self._parser.leading_markers
            if any(head.startswith(m) for m in leading):
                self._buffering = True
                return []
            if any(m.startswith(head) for m in leading):
                return []
        self._at_start = False

        found = _find_marker(self._pending, self._parser.start_markers, 0)
        if found is not None:
            text, self._pending = self._pending[: found[0]], self._pending[found[0] :]
            self._buffering = True
        else:
            keep = _partial_marker_suffix(self._pending, self._parser.start_markers)
            cut = len(self._pending) - keep
            text, self._pending = self._pending[:cut], self._pending[cut:]
        return [TextDelta(text)] if text else []

    def finish(self) -> list[TextDelta | ToolCallDelta]:
        if self._finished:
            return []
        self._finished = True
        rest, self._pending = self._pending, ""
        if not self._buffering:
            return [TextDelta(rest)] if rest else []
        content, calls = self._parser.parse(rest)
        events: list[TextDelta | ToolCallDelta] = [TextDelta(content)] if content else []
        for index, (name, arguments) in enumerate(calls):
            events.append(ToolCallDelta(index, ToolCall(self._new_id(), name, arguments)))
        self._calls = len(calls)
        return events
