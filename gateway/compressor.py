"""Compress one long message: segment → find the request → score → plan. Shared by the serving
path and `pflash-gateway compress`, so the preview is exactly what a request would get."""

from __future__ import annotations

import logging
import math
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from cachetools import LRUCache

from engine.scoring.bundle import ScorerBundle
from engine.scoring.scorers import size_exponent
from policies.budget import keep_fraction, parse_curve, token_budget
from policies.compression import CompressionPlan, plan_compression
from policies.conversation_types import Message
from policies.kept_lines import content_hash
from policies.recall import DEFAULT_RECALL_BUDGET, DEFAULT_THETA
from policies.rendering import split_lines
from policies.request_finding import find_request
from policies.segmentation import Unit, is_tight, segment
from policies.transcript import is_unasked_transcript

log = logging.getLogger("pflash.compress")

_SEGMENT_CACHE_ENTRIES = 32  # long messages whose segmentation is kept for the recall gate


@dataclass(frozen=True)
class CompressionSettings:
    threshold: int
    budget_curve: str
    min_segment: int
    max_segment: int
    request_tokens: int
    fallback_spread: float
    recall_theta: float = DEFAULT_THETA
    recall_budget: int = DEFAULT_RECALL_BUDGET
    recall_context: int | None = None  # earlier questions in the gate's query; None: the scorer's default


@dataclass(frozen=True)
class CompressionReport:
    compressed: bool
    reason: str
    scorer: str
    original_tokens: int
    kept_tokens: int  # tokens of the rewritten message as served (note and markers included)
    scorer_seconds: float
    total_seconds: float
    source_hash: str = ""  # content hash of the original message (its kept-line map's key)
    lines: int = 0  # lines of the original message
    unit_texts: tuple[str, ...] = field(default=(), repr=False)  # what was scored, unit by unit


class MessageCompressor:
    def __init__(self, count_tokens: Callable[[str], int], scorers: ScorerBundle,
                 settings: CompressionSettings) -> None:
        self.count_tokens = count_tokens
        self.scorers = scorers
        self.settings = settings
        self._curve = parse_curve(settings.budget_curve)
        # The least any message keeps (the overflow check before compression uses it).
        self.smallest_keep_fraction = min(fraction for _tokens, fraction in self._curve)
        self._segments: LRUCache[str, tuple[list[str], list[int], list[Unit]]] = LRUCache(_SEGMENT_CACHE_ENTRIES)
        self._lock = threading.Lock()

    def curve_share(self, tokens: int) -> float:
        """The share of a `tokens`-token message the budget curve keeps."""
        return keep_fraction(tokens, self._curve)

    def segment_message(self, text: str, keep_share: float) -> tuple[list[str], list[int], list[Unit]]:
        """Lines, tokens per line and units: a pure function of the text and the share kept of it
        (shorter units of code, grep and logs under a tight budget: policies.segmentation.unit_limit),
        so recall re-derives exactly the units compression chose from. Cached: a follow-up's recall
        gate must not re-tokenize the long messages it scores (only the new question is new work)."""
        tight = is_tight(keep_share)
        key = f"{content_hash(text)}/{tight}"
        with self._lock:
            hit = self._segments.get(key)
        if hit is not None:
            return hit
        lines = split_lines(text)
        line_tokens = [self.count_tokens(line) for line in lines]
        result = (lines, line_tokens, segment(lines, line_tokens, self.settings.min_segment, self.settings.max_segment, tight))
        with self._lock:
            self._segments[key] = result
        return result

    def compress(
        self, messages: Sequence[Message], index: int, tokens: int, keep_ratio: float | None = None,
        step_aside: bool = True,
    ) -> tuple[CompressionPlan, CompressionReport]:
        """Blocking (tokenizing and scoring): call it from a worker thread. `step_aside=False`:
        relevance too flat is no reason to serve the message whole (it cannot be)."""
        started = time.perf_counter()
        text = messages[index].content
        share = keep_ratio if keep_ratio is not None else self.curve_share(tokens)
        lines, line_tokens, units = self.segment_message(text, share)
        request = find_request(messages, index, self.count_tokens, self.settings.request_tokens)
        unit_texts = ["".join(lines[u.first : u.last + 1]) for u in units]
        scoring_started = time.perf_counter()
        scores: list[float] | None
        unasked = is_unasked_transcript(request.answers_call, lines)
        scorer = self.scorers.unasked if unasked else self.scorers.compress
        try:
            scores = scorer.score(unit_texts, request.scored)
        except Exception as exc:  # a failing scorer never fails the request
            log.warning("scorer %s failed (%s): serving the message whole", scorer.name, exc)
            scores = None
        scorer_seconds = time.perf_counter() - scoring_started
        budget = int(tokens * keep_ratio) if keep_ratio is not None else token_budget(tokens, self._curve)
        plan = plan_compression(
            text, line_tokens, scores, units, budget, request.pinned_lines,
            self.settings.fallback_spread if step_aside else -math.inf, self.count_tokens, size_exponent(scorer),
        )
        served_tokens = self.count_tokens(plan.text) if plan.compressed else tokens
        report = CompressionReport(plan.compressed, plan.reason, scorer.name, tokens, served_tokens,
                                   scorer_seconds, time.perf_counter() - started, content_hash(text), len(lines),
                                   tuple(unit_texts))
        return plan, report
