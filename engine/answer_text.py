"""One answer's text as its tokens are sampled, the same for both engines: bytes decoded as UTF-8
across token boundaries, stop sequences held back until they can no longer match, a loop caught
(engine/loop_guard.py), and the end reported once with what was held back."""

from __future__ import annotations

import codecs
from collections.abc import Callable

from engine.llama_jobs import Job, RawDone, RawText
from engine.loop_guard import LoopGuard
from engine.stops import StopMatcher

# Whether the answer loops (the engine counts and logs it): (guard, the new text, session).
LoopCheck = Callable[[LoopGuard, str, str], bool]


class AnswerText:
    def __init__(self, job: Job, repeated_line_stop: int, detokenize: Callable[[list[int]], bytes],
                 loops: LoopCheck) -> None:
        self._job = job
        self._detokenize = detokenize
        self._loops = loops
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self._stops = StopMatcher(job.params.stop)
        self._guard = LoopGuard(repeated_line_stop)
        self.produced = 0

    def feed(self, token: int) -> str | None:
        """Emit what the token adds to the answer; "stop" when the answer ends with it (a stop
        sequence, a loop), else None."""
        self.produced += 1
        text = self._stops.feed(self._decoder.decode(self._detokenize([token])))
        if text:
            self._job.emit(RawText(text))
        if self._stops.hit is not None or self._loops(self._guard, text, self._job.session_id):
            return "stop"
        return None

    def finish(self, reason: str) -> None:
        """The text held back (a partial character, a partial stop sequence), then the end."""
        tail = self._stops.feed(self._decoder.decode(b"", final=True)) + self._stops.flush()
        if tail:
            self._job.emit(RawText(tail))
        self._job.emit(RawDone(reason, self.produced, self._stops.hit))
