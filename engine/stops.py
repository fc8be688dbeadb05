"""Stop-sequence matching over streamed text, holding back only what could still become a stop."""

from __future__ import annotations


class StopMatcher:
    def __init__(self, stops: tuple[str, ...]) -> None:
        self._stops = tuple(s for s in stops if s)
        self._held = ""
        self.hit: str | None = None

    def feed(self, text: str) -> str:
        """Text safe to emit now; after a stop is hit, nothing more is emitted."""
        if self.hit is not None:
            return ""
        buf = self._held + text
        first: tuple[int, str] | None = None
        for stop in self._stops:
            at = buf.find(stop)
            if at != -1 and (first is None or at < first[0]):
                first = (at, stop)
        if first is not None:
            self.hit = first[1]
            self._held = ""
            return buf[: first[0]]
        keep = self._partial_suffix(buf)
        self._held = buf[len(buf) - keep :] if keep else ""
        return buf[: len(buf) - keep]

    def flush(self) -> str:
        out, self._held = self._held, ""
        return out if self.hit is None else ""

    def _partial_suffix(self, buf: str) -> int:
        """Length of the longest suffix of buf that is a proper prefix of some stop."""
        best = 0
        for stop in self._stops:
            for n in range(min(len(stop) - 1, len(buf)), best, -1):
                if buf.endswith(stop[:n]):
                    best = n
                    break
        return best
