"""The lazy tool-call grammar, sent with the request to an upstream that takes one (llama.cpp's
llama-server).

llama-server constrains a tool call only once the model opens its markup the way its own parser
expects; Qwen's bare JSON object or ```json fence passes as text, and nothing checks a name. It
refuses a custom grammar beside tools unless tool_choice is "none" (its template still renders the
tools), so under "auto" the request goes with tool_choice "none" and the gateway's own grammar
(engine/constraints.py: free text, then only offered tools with schema-valid arguments); the answer
comes back as text and is read as calls (engine/text_calls.py), as the in-process engine reads its
own output.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

from cachetools import LRUCache

from engine.base import PreparedPrompt
from engine.constraints import MARKUPS, ConstraintError, grammar_for
from engine.grammar_cache import grammar_key

log = logging.getLogger("pflash.upstream")

def family_of(props: Mapping[str, Any]) -> str | None:
    """The tool-call family of a llama-server (its /props: a build and a chat template), else None:
    the family engine/constraints.py shapes whose call marker the template spells."""
    template = props.get("chat_template")
    if not isinstance(template, str) or "build_info" not in props:
        return None
    return next((family for family, markup in MARKUPS.items() if markup.marker in template), None)


class UpstreamGrammars:
    def __init__(self, enabled: bool = True) -> None:
        self.enabled = enabled
        self.family: str | None = None  # None: the upstream takes no grammar of ours
        self._texts: LRUCache[str, str | None] = LRUCache(maxsize=32)  # one per tool list: Claude Code's is 36K characters

    def learn(self, props: Mapping[str, Any]) -> None:
        self.family = family_of(props) if self.enabled else None
        if self.family is not None:
            log.info("upstream is llama-server (%s calls): tool calls under auto are sent with the gateway's grammar",
                     self.family)

    def give_up(self, reason: object) -> None:
        """The upstream refused a grammar: requests go without one from now on (logged once)."""
        if self.family is not None:
            log.warning("upstream refused the tool-call grammar (%s): tool calls are no longer constrained", reason)
        self.family = None

    def apply(self, body: dict[str, Any], prompt: PreparedPrompt) -> bool:
        """Put the grammar into `body` when this answer is free to call tools ("auto", no response
        format); whether it did."""
        constraint = prompt.constraint
        if self.family is None or not prompt.tools or constraint.tool_choice != "auto" or constraint.response_format:
            return False
        key = grammar_key(constraint, prompt.tools)
        if key not in self._texts:
            try:
                grammar = grammar_for(constraint, prompt.tools, self.family)
            except (ConstraintError, ValueError) as exc:
                log.warning("no tool-call grammar for %d tools (%s): calls go unconstrained", len(prompt.tools), exc)
                grammar = None
            self._texts[key] = grammar.text if grammar is not None else None
        text = self._texts[key]
        if text is None:
            return False
        body["tool_choice"] = "none"
        body["grammar"] = text
        return True
