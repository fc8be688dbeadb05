"""Ends an answer that has fallen into a loop: one line repeated, lines that vary a little, or one
phrase over and over in a line that never ends.

Small local models (a base model above all) can repeat one line until the answer's limit: minutes of
a CPU's time during which every other session waits, for text no client can use, and an agent
such as Claude Code answers a length stop by asking for more of the same. Three rules, each
tripping at `limit`:
- the last `limit` non-blank lines are one line (blank lines between them neither count nor break
  the run; lines that differ in leading or trailing spaces only are the same line);
- `limit` lines in a row each echo one of the 8 lines before it: at least 4 words, and at least
  3/4 of their words the same (a sampled loop: "I will read the file." / "I'll read the files.").
  Numbered lists and table rows differ in the words that matter and do not trip it;
- a line grown past 2,000 characters whose last 40 characters occur `limit`/4 times in its last
  2,000 (a phrase looping with no newline).
`reason` says which rule tripped ("line", "near", "phrase").
"""

from __future__ import annotations

import re
from collections import deque

NEAR_WORDS = 4  # shorter lines repeat only exactly
NEAR_SHARE = 0.75  # shared share of two lines' words (Jaccard) that makes them near-repeats
NEAR_WINDOW = 8  # earlier lines a near-repeat may echo
PHRASE_LINE = 2000  # an unbroken line this long is checked for a looping phrase
PHRASE = 40
_WORD = re.compile(r"\w+")


def _near(a: frozenset[str], b: frozenset[str]) -> bool:
    return len(a & b) >= NEAR_SHARE * len(a | b)


class LoopGuard:
    def __init__(self, limit: int) -> None:
        self.limit = limit  # 0: never trips
        self._partial = ""  # the line being written
        self._last: str | None = None
        self._run = 0
        self._recent: deque[frozenset[str]] = deque(maxlen=NEAR_WINDOW)
        self._near_run = 0
        self._checked = 0  # length of the partial line at its last phrase check
        self.tripped = False
        self.reason: str | None = None

    def feed(self, text: str) -> bool:
        """Take streamed answer text; True once the answer loops by one of the rules."""
        if self.limit <= 0 or self.tripped:
            return self.tripped
        *lines, self._partial = (self._partial + text).split("\n")
        if lines:
            self._checked = 0
        for line in lines:
            if self._line(line.strip()):
                return True
        if len(self._partial) >= PHRASE_LINE and len(self._partial) - self._checked >= 256:
            self._checked = len(self._partial)
            tail = self._partial[-PHRASE_LINE:]
            if tail.count(tail[-PHRASE:]) >= max(2, self.limit // 4):
                return self._trip("phrase")
        return False

    def _line(self, key: str) -> bool:
        if not key:
            return False
        self._run = self._run + 1 if key == self._last else 1
        self._last = key
        words = frozenset(_WORD.findall(key.lower()))
        echoes = len(words) >= NEAR_WORDS and any(_near(words, seen) for seen in self._recent)
        self._near_run = self._near_run + 1 if echoes else 0
        self._recent.append(words)
        if self._run >= self.limit:
            return self._trip("line")
        if self._near_run >= self.limit:
            return self._trip("near")
        return False

    def _trip(self, reason: str) -> bool:
        self.tripped, self.reason = True, reason
        return True
