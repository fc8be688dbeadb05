"""Does a long text no call asked for read as a transcript: a pasted agent session or terminal log,
several commands each followed by its output?

The ranker's second weight set (engine/scoring/ranker.py) trusts a transcript's repeats (code the agent
opened twice); inside one tool output a repeated line is boilerplate. So text whose producing call
was found, or that shows fewer than TRANSCRIPT_MIN_COMMANDS commands, is ranked as a tool output.
In a transcript, output of a file that a later command edits is evidence too (edited_later_lines)."""

from __future__ import annotations

import re
from collections.abc import Sequence

# A shell prompt (`$ pytest -x`) or Claude Code's tool-use marker (`⏺ Bash(pytest -x)`).
_COMMAND = re.compile(r"^(?:\$ \S|⏺ )")
TRANSCRIPT_MIN_COMMANDS = 3


def looks_like_transcript(lines: Sequence[str]) -> bool:
    commands = 0
    for line in lines:
        if _COMMAND.match(line):
            commands += 1
            if commands >= TRANSCRIPT_MIN_COMMANDS:
                return True
    return False


def is_unasked_transcript(answers_call: bool, lines: Sequence[str]) -> bool:
    """Ranked as a transcript: no producing call found, and several commands in the text."""
    return not answers_call and looks_like_transcript(lines)


# A file a command names (the last two path parts: `./django/db/models/query.py` and
# `/testbed/django/db/models/query.py` are the same `models/query.py`).
_FILE = re.compile(r"[\w./-]*?[\w-][\w.-]*\.(?:py|pyx|pyi|c|h|cc|cpp|hpp|js|ts|tsx|rs|go|java|rb|php|"
                   r"rst|md|txt|cfg|ini|toml|json|ya?ml)\b")
# A command that changes a file it names: sed/perl in place, a redirect, a patch, Claude Code's edits.
_EDIT = re.compile(r"\bsed\s+(?:-\w+\s+)*-i|\bperl\s+-\w*i|>>?\s*['\"]?[\w./-]+\.\w+|\bpatch\b|apply_patch|str_replace|"
                   r"⏺ (?:Update|Edit|MultiEdit|Write)\(")


def _files_named(command: str) -> frozenset[str]:
    return frozenset("/".join(path.split("/")[-2:]) for path in _FILE.findall(command))


def edited_later_lines(lines: Sequence[str]) -> list[bool]:
    """Per line of a transcript: is it output shown under a command naming a file that a later
    command edits? Code an agent read and then changed is what its task needed."""
    current: list[frozenset[str]] = []
    edits: list[tuple[int, frozenset[str]]] = []
    shown: frozenset[str] = frozenset()
    for i, line in enumerate(lines):
        if _COMMAND.match(line):
            shown = _files_named(line)
            if _EDIT.search(line):
                edits.append((i, shown))
            current.append(frozenset())
        else:
            current.append(shown)
    marked = [False] * len(lines)
    edited_after: set[str] = set()
    for i in range(len(lines) - 1, -1, -1):
        while edits and edits[-1][0] > i:
            edited_after |= edits.pop()[1]
        marked[i] = bool(current[i] & edited_after)
    return marked
