"""Does a long text no call asked for read as a transcript: a pasted agent session or terminal log,
several commands each followed by its output?

The ranker's second weight set (engine/scoring/ranker.py) trusts a transcript's repeats (code the agent
opened twice); inside one tool output a repeated line is boilerplate. So text whose producing call
was found, or that shows fewer than TRANSCRIPT_MIN_COMMANDS commands, is ranked as a tool output."""

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
