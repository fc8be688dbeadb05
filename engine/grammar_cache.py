"""The grammars of one engine, compiled once per (output constraint, tool list).

Claude Code sends the same 20-36K characters of tools every turn: converting their schemas and
checking the grammar with llama.cpp's own parser happens on the first turn only. Under
tool_choice "auto" a tool list the grammar cannot express never fails the request: a schema the
converter cannot take gives that tool any JSON object, and a grammar llama.cpp refuses is
retried with every tool's arguments as any JSON object (names still constrained), logged once.
"""

from __future__ import annotations

import hashlib
import json
import logging
import threading
from collections.abc import Sequence
from dataclasses import replace
from typing import Any

from cachetools import LRUCache

from engine.constraints import ConstraintError, Grammar, OutputConstraint, grammar_for
from policies.conversation_types import ToolSpec

log = logging.getLogger("pflash.engine")


def grammar_key(constraint: OutputConstraint, tools: Sequence[ToolSpec]) -> str:
    shape = [constraint.tool_choice, constraint.tool_name, constraint.parallel_tool_calls,
             constraint.response_format, [(t.name, t.parameters) for t in tools]]
    return hashlib.sha256(json.dumps(shape, sort_keys=True, default=str).encode()).hexdigest()


class GrammarCache:
    def __init__(self, lib: Any, vocab: Any, tool_format: str, size: int = 32) -> None:
        self._lib = lib
        self._vocab = vocab
        self._format = tool_format
        self._lock = threading.Lock()
        self._cache: LRUCache[str, Grammar | None] = LRUCache(maxsize=size)

    def get(self, constraint: OutputConstraint, tools: Sequence[ToolSpec]) -> Grammar | None:
        """The constraint's grammar, checked by llama.cpp's own parser; ConstraintError (the client's
        400) only where the client forced a shape that cannot be enforced."""
        key = grammar_key(constraint, tools)
        with self._lock:
            if key in self._cache:
                return self._cache[key]
        grammar = self._build(constraint, tools)
        with self._lock:
            self._cache[key] = grammar
        return grammar

    def _build(self, constraint: OutputConstraint, tools: Sequence[ToolSpec]) -> Grammar | None:
        grammar = grammar_for(constraint, tools, self._format)
        if grammar is None or self._compiles(grammar):
            if grammar is not None and grammar.loose:
                log.warning("tool call arguments of %s: any JSON object (their schemas cannot be converted)",
                            ", ".join(grammar.loose))
            return grammar
        lazy = constraint.tool_choice == "auto" and constraint.response_format is None
        if not lazy:  # a call or a JSON answer the client forced: it must be enforced or refused
            param = "response_format" if constraint.response_format else "tools"
            raise ConstraintError("llama.cpp cannot compile the grammar for this output constraint", param)
        loose = [ToolSpec(t.name, t.description, {"type": "object"}) for t in tools]
        fallback = grammar_for(constraint, loose, self._format)
        if fallback is not None and self._compiles(fallback):
            log.warning("llama.cpp refused the tool grammar of %d tools: their arguments are any JSON object, "
                        "their names still only those offered", len(tools))
            return replace(fallback, loose=tuple(t.name for t in tools))
        log.warning("llama.cpp refused every tool grammar for %d tools: tool calls are not constrained", len(tools))
        return None

    def _compiles(self, grammar: Grammar) -> bool:
        sampler = self._lib.llama_sampler_init_grammar(self._vocab, grammar.text.encode("utf-8"), b"root")
        if not sampler:  # NULL: llama.cpp could not parse it (e.g. a schema pattern it cannot express)
            return False
        self._lib.llama_sampler_free(sampler)
        return True
