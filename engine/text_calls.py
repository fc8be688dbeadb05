"""Tool calls an upstream wrote as text: a model whose server did not read its call markup (Qwen's
bare JSON object under llama-server, a `<tool_call>` tag a template did not expect) still reaches
the client as a call, read as the in-process engine reads its own output (engine/tool_parsers.py).

Text streams on until something that can open a call appears (an answer starting with `{`, or a
family's call marker anywhere); from there it is held to the end of the answer, then read as
calls when every call names an offered tool, else passed on as the text it was.
"""

from __future__ import annotations

from collections.abc import Iterable

from engine.tool_parsers import ParsedCall, parser_for

MARKERS = ("<tool_call>", "```json", "[TOOL_CALLS]", "<|python_tag|>")
FORMATS = ("hermes", "mistral", "llama3_json")


def _partial_marker(text: str) -> int:
    """Length of the longest end of `text` that could still grow into a marker."""
    return max((k for m in MARKERS for k in range(1, len(m)) if text.endswith(m[:k])), default=0)


class TextCalls:
    def __init__(self, tool_names: Iterable[str]) -> None:
        self._names = frozenset(tool_names)
        self._pending = ""  # not yet passed on: could be the start of a marker
        self._held: str | None = None  # from a possible call on: kept to the end
        self._at_start = True

    def feed(self, text: str) -> str:
        """The text that may go to the client now."""
        if self._held is not None:
            self._held += text
            return ""
        buffer = self._pending + text
        if self._at_start:
            if not buffer.strip():
                self._pending = buffer
                return ""
            self._at_start = False
            if buffer.lstrip().startswith("{"):
                self._held, self._pending = buffer, ""
                return ""
        found = [at for m in MARKERS if (at := buffer.find(m)) >= 0]
        if found:
            at = min(found)
            self._held, self._pending = buffer[at:], ""
            return buffer[:at]
        keep = _partial_marker(buffer)
        self._pending = buffer[len(buffer) - keep:]
        return buffer[: len(buffer) - keep]

    def flush(self) -> str:
        """Everything held, as the text it was."""
        rest = (self._held or "") + self._pending
        self._held, self._pending = None, ""
        return rest

    def finish(self) -> tuple[str, list[ParsedCall]]:
        """What is left as text, and the calls read from it (none unless all name offered tools)."""
        rest = self.flush()
        if rest.strip():
            for fmt in FORMATS:
                content, calls = parser_for(fmt).parse(rest)
                if calls and all(name in self._names for name, _args in calls):
                    return content, calls
        return rest, []
