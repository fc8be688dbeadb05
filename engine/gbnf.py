"""Small, pure helpers for writing llama.cpp grammars (GBNF) as text.

GBNF is llama.cpp's grammar language: `name ::= body` rules, "literals", [classes], `|`, `( )`,
`?`, `*`, `+`. These helpers escape text safely, rename a converted grammar's rules so several can
live in one file, and build the one rule the JSON-schema converter cannot: text that never
contains a given marker.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

__all__ = ["Rules", "literal", "namespaced", "rules_text", "text_without"]

# Rule name -> body, in the order they should be written (root first reads best).
Rules = dict[str, str]

_RULE_LINE = re.compile(r"^([a-zA-Z0-9-]+) ::= (.*)$")
_NAME_CHAR = re.compile(r"[a-zA-Z0-9-]")


def _char(ch: str, in_class: bool) -> str:
    if ch.isalnum() and ch.isascii():
        return ch
    code = ord(ch)
    if not in_class and ch not in '"\\' and 0x20 <= code < 0x7F:
        return ch  # printable ASCII punctuation needs no escape inside a literal
    if code < 0x100:
        return f"\\x{code:02X}"
    if code < 0x10000:
        return f"\\u{code:04X}"
    return f"\\U{code:08X}"


def literal(text: str) -> str:
    """A GBNF literal that matches exactly `text` (quotes, backslashes and control characters escaped)."""
    return '"' + "".join(_char(ch, in_class=False) for ch in text) + '"'


def negated_class(chars: set[str]) -> str:
    return "[^" + "".join(_char(ch, in_class=True) for ch in sorted(chars)) + "]"


def rules_text(rules: Rules) -> str:
    return "\n".join(f"{name} ::= {body}" for name, body in rules.items()) + "\n"


def _parse_rules(grammar: str) -> Rules:
    rules: Rules = {}
    for line in grammar.splitlines():
        if not line.strip():
            continue
        match = _RULE_LINE.match(line)
        if match is None:  # the converter writes one rule per line; anything else is a bug upstream
            raise ValueError(f"unexpected grammar line: {line!r}")
        rules[match.group(1)] = match.group(2)
    return rules


def _rename_body(body: str, rename: dict[str, str]) -> str:
    """Rename rule references in one body, leaving "literals", [classes] and {counts} alone."""
    out: list[str] = []
    i = 0
    while i < len(body):
        ch = body[i]
        if ch in '"[{':
            close = {'"': '"', "[": "]", "{": "}"}[ch]
            j = i + 1
            while j < len(body) and body[j] != close:
                j += 2 if body[j] == "\\" else 1
            out.append(body[i : j + 1])
            i = j + 1
        elif _NAME_CHAR.match(ch):
            j = i
            while j < len(body) and _NAME_CHAR.match(body[j]):
                j += 1
            word = body[i:j]
            out.append(rename.get(word, word))
            i = j
        else:
            out.append(ch)
            i += 1
    return "".join(out)


def namespaced(grammar: str, prefix: str) -> tuple[str, Rules]:
    """Every rule of `grammar` renamed `prefix-<name>`, so converted grammars can be combined.

    Returns the new name of the grammar's `root` and the renamed rules.
    """
    rules = _parse_rules(grammar)
    rename = {name: f"{prefix}-{name}" for name in rules}
    renamed = {rename[name]: _rename_body(body, rename) for name, body in rules.items()}
    return rename["root"], renamed


class MarkerAutomaton:
    """Aho-Corasick over a few markers: a state is the longest end of the text so far that begins a
    marker. States are numbered by that prefix, shortest first (one marker: state i = its first i
    characters), so grammar rules can name them."""

    def __init__(self, markers: Sequence[str]) -> None:
        if not markers or not all(markers):
            raise ValueError("empty marker")
        self.markers = tuple(markers)
        prefixes = {m[:i] for m in markers for i in range(len(m))}
        self.states = sorted(prefixes, key=lambda p: (len(p), p))
        self.alphabet = sorted({ch for m in markers for ch in m})

    def step(self, state: str, ch: str) -> str | None:
        """The state after `ch`, or None when the text would then contain a marker."""
        text = state + ch
        if any(text.endswith(m) for m in self.markers):
            return None
        while text not in self.states:
            text = text[1:]
        return text

    def rule(self, name: str, state: str) -> str:
        return f"{name}-{self.states.index(state)}"


def text_without(marker: str | Sequence[str], name: str) -> Rules:
    """Rules for any text (empty included) that never contains `marker` (or any of several).

    The automaton written as grammar rules: rule `name-i` means "the text so far ends with state i's
    prefix of a marker". A character that would complete a marker has no transition, so no
    tokenization of the output can ever spell it out.
    """
    automaton = MarkerAutomaton([marker] if isinstance(marker, str) else marker)
    rules: Rules = {}
    for state in automaton.states:
        moves = {ch: automaton.step(state, ch) for ch in automaton.alphabet}
        alternatives = [f"{negated_class(set(automaton.alphabet))} {name}-0"]
        for ch, nxt in moves.items():
            if nxt is not None:
                alternatives.append(f"{literal(ch)} {automaton.rule(name, nxt)}")
        rules[automaton.rule(name, state)] = "( " + " | ".join(alternatives) + " )?"
    rules[name] = f"{name}-0"
    return rules
