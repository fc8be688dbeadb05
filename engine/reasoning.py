"""Reasoning markup (`<think>…</think>`, Qwen3 / DeepSeek-R1 style) split out of the answer stream.

Incremental: text arrives in arbitrary chunks (a tag may be cut anywhere), and the split is the
same however the text was chunked. A model opens its reasoning before the answer, so `<think>`
counts only before any answer text; a template whose generation prompt already opened it
(`starts_inside`) begins in reasoning and waits for `</think>`. Whitespace right after either
tag is layout, not content, and is dropped.
"""

from __future__ import annotations

from policies.conversation_types import ReasoningDelta, TextDelta

OPEN_TAG = "<think>"
CLOSE_TAG = "</think>"


def prompt_opens_reasoning(prompt_text: str) -> bool:
    """True when the rendered prompt ends inside an open `<think>` (the model starts reasoning)."""
    return prompt_text.rstrip().endswith(OPEN_TAG)


class ReasoningSplitter:
    def __init__(self, starts_inside: bool = False) -> None:
        self._inside = starts_inside
        self._may_open = not starts_inside  # `<think>` still possible: no answer text yet
        self._strip = starts_inside  # drop whitespace right after a tag
        self._held = ""  # a tail that may be the start of a tag

    def feed(self, text: str) -> list[ReasoningDelta | TextDelta]:
        out: list[ReasoningDelta | TextDelta] = []
        buf = self._held + text
        self._held = ""
        while buf:
            if self._strip:
                buf = buf.lstrip()
                if not buf:
                    break
                self._strip = False
            if self._inside:
                buf = self._scan(buf, CLOSE_TAG, out, ReasoningDelta)
            elif self._may_open:
                buf = self._scan_open(buf, out)
            else:
                out.append(TextDelta(buf))
                buf = ""
        return out

    def finish(self) -> list[ReasoningDelta | TextDelta]:
        """The held-back tail, as what it turned out to be (not a tag)."""
        held, self._held = self._held, ""
        if not held:
            return []
        return [ReasoningDelta(held) if self._inside else TextDelta(held)]

    def _scan(self, buf: str, tag: str, out: list, kind: type) -> str:
        at = buf.find(tag)
        if at >= 0:
            if at:
                out.append(kind(buf[:at]))
            self._inside = not self._inside
            self._may_open = False
            self._strip = True
            return buf[at + len(tag) :]
        keep = _partial_suffix(buf, tag)
        if len(buf) > keep:
            out.append(kind(buf[: len(buf) - keep]))
        self._held = buf[len(buf) - keep :]
        return ""

    def _scan_open(self, buf: str, out: list) -> str:
        # Before any answer text: only whitespace may precede `<think>`.
        stripped = buf.lstrip()
        lead = buf[: len(buf) - len(stripped)]
        if stripped.startswith(OPEN_TAG):
            self._inside = True
            self._may_open = False
            self._strip = True
            return stripped[len(OPEN_TAG) :]
        if OPEN_TAG.startswith(stripped):  # "", "<", "<th", ...: cannot tell yet
            self._held = buf
            return ""
        self._may_open = False  # answer text: reasoning can no longer open
        return lead + stripped


def _partial_suffix(text: str, tag: str) -> int:
    """The length of the longest suffix of `text` that is a proper prefix of `tag`."""
    for n in range(min(len(tag) - 1, len(text)), 0, -1):
        if text.endswith(tag[:n]):
            return n
    return 0
