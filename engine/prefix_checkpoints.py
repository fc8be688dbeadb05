"""The engines' side of prefix checkpoints: where a prompt is worth one, which one a turn starts
from, and saving one out of a sequence mid-prefill. The checkpoints themselves live in the
CheckpointTier (sessions/checkpoints.py); both engines call this from their one worker thread.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from cachetools import LRUCache

from engine.base import CheckpointTier, SavedState
from engine.seq_state import save_sequence
from policies.conversation_types import Message, ToolSpec
from policies.prefix_keys import checkpoint_positions

log = logging.getLogger("pflash.engine")


@dataclass(frozen=True)
class CheckpointOptions:
    interval: int = 8192  # a long cold prompt saves one every this many tokens (0: never)
    min_tokens: int = 1024  # shorter prefixes are cheap to prefill: not worth a state


@dataclass(frozen=True)
class StartPoint:
    """Where a turn's prefill starts: `reuse` tokens are in the sequence already."""

    reuse: int
    restored_from: str
    checkpoint_tokens: int = 0


class SystemMarks:
    """Where the system prompt and tools end in a rendered prompt: the LCP of the prompt's tokens
    with those of the system messages and tools rendered alone. Claude Code's are ~12K tokens,
    identical every turn, so their tokens are kept (by rendered text) instead of counted again."""

    def __init__(self, render: Callable[[Sequence[Message], Sequence[ToolSpec]], str],
                 tokenize: Callable[[str], list[int]]) -> None:
        self._render = render
        self._tokenize = tokenize
        self._tokens: LRUCache[str, tuple[int, ...]] = LRUCache(maxsize=16)

    def marks(self, messages: Sequence[Message], tools: Sequence[ToolSpec], tokens: Sequence[int]) -> tuple[int, ...]:
        head = []
        for message in messages:
            if message.role not in ("system", "developer"):
                break
            head.append(message)
        if not head and not tools:
            return ()
        try:
            text = self._render(head, tools)
        except Exception:  # a template that wants a user turn: no mark, nothing else lost
            return ()
        prefix = self._tokens.get(text)
        if prefix is None:
            prefix = self._tokens[text] = tuple(self._tokenize(text))
        common = 0
        for a, b in zip(prefix, tokens):
            if a != b:
                break
            common += 1
        return (common,) if 0 < common < len(tokens) else ()


class PrefixCheckpoints:
    def __init__(self, lib: Any, options: CheckpointOptions, counters: dict[str, float], rollback: int = 0) -> None:
        self._lib = lib
        self.options = options
        # How far a restored checkpoint may be cut back: a whole context for a cache that can be
        # truncated anywhere (any common prefix is reused), little for a sliding window.
        self.rollback = rollback
        self.tier: CheckpointTier | None = None
        self._counters = counters
        counters.update({"checkpoint_hits": 0, "checkpoint_misses": 0, "checkpoint_tokens_reused": 0,
                         "checkpoints_saved": 0})

    def better(self, tokens: Sequence[int], reuse: int) -> tuple[SavedState, str, int] | None:
        """A checkpoint that leaves less to prefill than `reuse`, its tier, and how many of the
        prompt's tokens it serves: the longest that is a prefix of the prompt, or one sharing a
        longer prefix with it when cutting it back that far is safe (`rollback`)."""
        if self.tier is None:
            return None
        n = self.tier.longest(tokens, above=reuse)
        covered, common = self.tier.longest_common(tokens, self.rollback, above=max(n, reuse)) if self.rollback else ((), 0)
        serves = min(max(n, common), len(tokens) - 1)  # the last token must yield logits
        if serves <= reuse:
            return None
        found = self.tier.load(covered) if common > n else self.tier.load(tokens[:n])
        return None if found is None else (*found, serves)

    def start(self, tokens: Sequence[int], reuse: int, restored_from: str,
              restore: Callable[[SavedState], bool]) -> StartPoint:
        """Where the turn starts: at `reuse` (what the session's own state gives), or past a longer
        checkpoint that `restore` put into the sequence (the engine cuts it back to the start
        point). A failed restore leaves the sequence empty."""
        found = self.better(tokens, reuse)
        if found is not None:
            state, _tier, n = found
            if restore(state):
                return self._counted(StartPoint(n, "checkpoint", n))
            self._counters["restore_failures"] += 1
            log.warning("checkpoint restore failed (%d tokens): prefill from the start", len(state.tokens))
            reuse, restored_from = 0, "none"
        return self._counted(StartPoint(reuse, restored_from))

    def _counted(self, start: StartPoint) -> StartPoint:
        """A hit when a checkpoint served; a miss when nothing did (the prompt prefilled cold)."""
        if start.checkpoint_tokens:
            self._counters["checkpoint_hits"] += 1
            self._counters["checkpoint_tokens_reused"] += start.checkpoint_tokens
        elif start.reuse == 0 and self.tier is not None:
            self._counters["checkpoint_misses"] += 1
        return start

    def positions(self, tokens: Sequence[int], reuse: int, marks: Sequence[int]) -> list[int]:
        """Where this prefill saves checkpoints: not where one already exists."""
        if self.tier is None:
            return []
        wanted = checkpoint_positions(len(tokens), reuse, marks, self.options.interval, self.options.min_tokens)
        return [p for p in wanted if not self.tier.has(tokens[:p])]

    def save(self, ctx: Any, seq: int, tokens: Sequence[int], marks: Sequence[int], prompt_len: int,
             owner: str) -> None:
        """Copy sequence `seq` (it covers exactly `tokens`) into a new checkpoint."""
        if self.tier is None:
            return
        n = len(tokens)
        origin = "system" if n in marks else "prompt" if n == prompt_len else "interval"
        state = save_sequence(self._lib, ctx, seq, tokens, None)  # memory of its own: the store keeps it
        if state is None:
            return
        self.tier.add(state, origin, owner)
        self._counters["checkpoints_saved"] += 1
        log.debug("checkpoint saved: %d tokens (%s, %.1f MB)", n, origin, len(state.blob) / 1e6)
