"""Follow-ups that remember: on a new user question, the θ gate decides whether lines omitted
from earlier compressed messages matter now, and brings the best of them back as labelled
excerpts at the top of the new turn. The rewritten turn goes to the session's recall log, so the
same request resent later renders byte-identically (it has become history)."""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass, field

from gateway.compressor import MessageCompressor
from policies.conversation_types import Message
from policies.kept_lines import content_hash
from policies.recall import context_questions_for, decide_recall, gate_query, omitted_flags, render_excerpts
from sessions.record import RecallEntry, SessionRecord

log = logging.getLogger("pflash.recall")


@dataclass(frozen=True)
class RecallReport:
    fired: bool
    reason: str
    peak_share: float
    added_tokens: int
    seconds: float
    turn_hash: str = ""  # when fired: the recall log entry this turn added
    # Units the gate's encoder has no vector for (their background job was lost to a restart):
    # scored with BM25 this time, embedded after the turn for the next follow-up.
    unembedded: tuple[str, ...] = field(default=(), repr=False)


@dataclass(frozen=True)
class _Candidate:
    source_hash: str
    label: str
    lines: list[str]
    first: int
    last: int
    tokens: int
    omitted: bool


class RecallGate:
    def __init__(self, compressor: MessageCompressor, theta: float, budget_tokens: int,
                 context_questions: int | None = None) -> None:
        self.compressor = compressor
        self.theta = theta
        self.budget_tokens = budget_tokens
        # None: the serving scorer's default (policies/recall.py); read at each follow-up, since
        # the scorer is the one that loaded, which may be a fallback.
        self.context_questions = context_questions

    def rewrite(
        self, messages: Sequence[Message], index: int, record: SessionRecord
    ) -> tuple[Message, RecallReport] | None:
        """Blocking (scoring): the question at `index` as the model should see it, or None when
        the session has nothing compressed in this conversation."""
        started = time.perf_counter()
        question = messages[index]
        candidates = self._candidates(messages[:index], record)
        if not candidates:
            return None
        bundle = self.compressor.scorers
        features = bundle.features
        stored = record.features_copy() if features is not None else {}
        if features is not None and stored:
            features.import_features(stored)  # after eviction or a restart: no re-read
        query = gate_query(messages, index, context_questions_for(bundle.gate.name, self.context_questions))
        texts = ["".join(c.lines[c.first : c.last + 1]) for c in candidates]
        scores = bundle.gate_scores(texts, query)
        background = bundle.background
        unembedded = tuple(texts) if background is not None and not background.has_vectors(texts) else ()
        recalled = record.recalled_units()
        already = frozenset(
            i for i, c in enumerate(candidates) if (c.source_hash, c.first, c.last) in recalled
        )
        decision = decide_recall(
            scores.evidence, [c.tokens for c in candidates], [c.omitted for c in candidates], already,
            self.theta, self.budget_tokens, scores.choice,
        )
        elapsed = time.perf_counter() - started
        if not decision.recall:
            return question, RecallReport(False, decision.reason, decision.peak_share, 0, elapsed,
                                          unembedded=unembedded)
        blocks: list[str] = []
        by_source: dict[str, list[int]] = {}
        for unit in decision.units:
            by_source.setdefault(candidates[unit].source_hash, []).append(unit)
        for indices in by_source.values():
            first = candidates[indices[0]]
            ranges: list[tuple[int, int]] = []
            for i in indices:  # adjacent units read as one excerpt
                if ranges and candidates[i].first == ranges[-1][1] + 1:
                    ranges[-1] = (ranges[-1][0], candidates[i].last)
                else:
                    ranges.append((candidates[i].first, candidates[i].last))
            blocks.append(render_excerpts(first.lines, ranges, first.label))
        excerpts = "".join(b if b.endswith("\n") else b + "\n" for b in blocks)
        rendered = excerpts + "\n" + question.content
        units = tuple((candidates[i].source_hash, candidates[i].first, candidates[i].last) for i in decision.units)
        key = turn_key(index, question.content)
        record.add_recall(RecallEntry(key, rendered, units))
        added = self.compressor.count_tokens(rendered) - self.compressor.count_tokens(question.content)
        log.info("recall: %d units (%d tokens), peak share %.3f", len(units), added, decision.peak_share)
        return Message(question.role, rendered), RecallReport(True, decision.reason, decision.peak_share,
                                                              added, elapsed, key, unembedded)

    def _candidates(self, messages: Sequence[Message], record: SessionRecord) -> list[_Candidate]:
        """Every unit of every compressed message in this conversation, kept or omitted."""
        out: list[_Candidate] = []
        seen: set[str] = set()
        for message in messages:
            key = content_hash(message.content)
            kept = record.kept_maps.get(key)
            if kept is None or key in seen:
                continue
            seen.add(key)
            # Segmented as compression did: its share came from the curve (keep_ratio is the CLI's alone).
            share = self.compressor.curve_share(kept.total_tokens)
            lines, _tokens, units = self.compressor.segment_message(message.content, share)
            flags = omitted_flags(units, kept.kept_ranges)
            label = record.map_labels.get(key, "an earlier message")
            out.extend(_Candidate(key, label, lines, u.first, u.last, u.tokens, flag) for u, flag in zip(units, flags))
        return out


def turn_key(index: int, content: str) -> str:
    """A turn is its position and its text: the same words asked again later are a new turn."""
    return content_hash(f"{index}\x00{content}")


def recalled_turn(message: Message, index: int, record: SessionRecord) -> Message | None:
    """A question that was rewritten with excerpts before renders the same again."""
    if message.role != "user" or not record.recall_log:
        return None
    key = turn_key(index, message.content)
    for entry in list(record.recall_log):  # a copy: the recall gate may append from its thread
        if entry.turn_hash == key:
            return Message(message.role, entry.rendered)
    return None
