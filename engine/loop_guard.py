"""Ends an answer that has fallen into a loop: one line, repeated.

Small local models (a base model above all) can repeat one line until the answer's limit: minutes of
a CPU's time during which every other session waits, for text no client can use, and an agent
such as Claude Code answers a length stop by asking for more of the same. An answer whose last
`limit` non-blank lines are one line is over; blank lines between them neither count nor break the
run, and lines that differ in leading or trailing spaces only are the same line.
"""

from __future__ import annotations


class LoopGuard:
    def __init__(self, limit: int) -> None:
        self.limit = limit  # 0: never trips
        self._partial = ""  # the line being written
        self._last: str | None = None
        self._run = 0
        self.tripped = False

    def feed(self, text: str) -> bool:
        """Take streamed answer text; True once the answer repeats one line `limit` times."""
        if self.limit <= 0 or self.tripped:
            return self.tripped
        *lines, self._partial = (self._partial + text).split("\n")
        for line in lines:
            key = line.strip()
            if not key:
                continue
            self._run = self._run + 1 if key == self._last else 1
            self._last = key
            if self._run >= self.limit:
                self.tripped = True
                break
        return self.tripped
