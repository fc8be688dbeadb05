"""Small, pure helpers for writing llama.cpp grammars (GBNF) as text.

GBNF is llama.cpp's grammar language: `name ::= body` rules, "literals", [classes], `|`, `( )`,
`?`, `*`, `+`. These helpers escape text safely, rename a converted grammar's rules so several can
live in one file, and build the one rule the JSON-schema converter cannot: text that never
contains a given marker.
"""

from __future__ import annotations

import re

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


def _negated_class(chars: set[str]) -> str:
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


def _kmp_step(marker: str, state: int, ch: str) -> int:
    """After reading `ch` with the first `state` characters of `marker` matched: how many match now."""
    while True:
        if marker[state] == ch:
            return state + 1
        if state == 0:
            return 0
        # Longest proper border of marker[:state] (tiny markers: quadratic is fine).
        state = next(k for k in range(state - 1, -1, -1) if marker[:k] == marker[state - k : state])


def text_without(marker: str, name: str) -> Rules:
    """Rules for any text (empty included) that never contains `marker`.

    A Knuth-Morris-Pratt automaton written as grammar rules: rule `name-i` means "the text so far
    ends with the first i characters of the marker". A character that would complete the marker
    has no transition, so no tokenization of the output can ever spell it out.
    """
    if not marker:
        raise ValueError("empty marker")
    rules: Rules = {}
    for state in range(len(marker)):
        moves = {ch: _kmp_step(marker, state, ch) for ch in set(marker)}
        progress = {ch: nxt for ch, nxt in moves.items() if nxt > 0}  # every other character: back to 0
        alternatives = [f"{_negated_class(set(progress))} {name}-0"]
        for ch, nxt in sorted(progress.items()):
            if nxt < len(marker):
                alternatives.append(f"{literal(ch)} {name}-{nxt}")
        rules[f"{name}-{state}"] = "( " + " | ".join(alternatives) + " )?"
    rules[name] = f"{name}-0"
    return rules
