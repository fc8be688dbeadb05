"""The θ recall gate: on a later question, bring back omitted lines that matter now.

Every unit of an earlier compressed message is scored against the new question. The gate compares
the best unit the model cannot see (omitted, not yet recalled) with the best unit it can see (kept,
or recalled on an earlier turn), each as relevance above the message's median unit:

    peak share = best hidden / (best hidden + best visible)

and fires when the peak share reaches θ. A question about what was kept has its best match among
the visible units (share well under 1/2) and costs nothing; a question whose best match was left
out scores near 1. A share of all omitted mass (the first statistic) grows with how much was
omitted, not with whether the answer was: it fired on 95 % of follow-ups. θ = 0 recalls whenever
anything is hidden; θ = 1 only when nothing visible has any relevance.

A gate with two scorers (the sentence encoder and BM25, engine/scoring/embedder.py) takes the peak share of
their fused ranks (`rank_fusion`): a hidden unit that either ranks near the top counts, so the gate
misses less of what one of them overlooks. Which units come back is still chosen by the encoder's
relevance (`choice`), which orders whole passages better than fused ranks. On MTRAG train +
validation (236 conversations, budget 3,072 tokens), with the most gold present at the last turn
while firing on at most 35 % of follow-ups: the encoder's peak share kept all gold in 91.5 % of
conversations (θ = 0.42, firing on 34.3 %), BM25's in 94.9 % (θ = 0.44, 35.0 %), fused ranks in
96.6 % (θ = 0.43, 33.3 %). θ, the budget and the fusion constant were chosen there by that rule
(the goal allows 40 % firing; the margin is for unseen conversations).

What comes back: hidden units with any relevance above the median, densest first, within a token
budget, as labelled excerpts. At θ = 0.43 a budget of 2,048 tokens kept all gold in 94.9 % (firing
on 36.3 %): 3,072 brings back whole passages that 2,048 cut short, for ~1 s more prefill on a
follow-up that fires.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from policies.conversation_types import Message
from policies.observations import is_user_words
from policies.rendering import Range, line_span_label
from policies.segmentation import Unit
from policies.selection import competition_ranks, relevance_mass

DEFAULT_THETA = 0.43
DEFAULT_RECALL_BUDGET = 3072
# Reciprocal rank fusion's constant, chosen with θ (5 and 20 kept as much gold only firing more).
RANK_FUSION_K = 10
# Earlier user questions the gate's query carries, by scorer (validation split, θ = 0.45): a
# follow-up is often elliptical ("and the second one?"). With the question before it `hybrid`
# kept the same gold share (96.7 %) and fired on 23 % of follow-ups instead of 38 %; `embed`
# (95 % -> 88 %) and `bm25` (90 % -> 79 %) lost gold, the older words pulling their peaks
# towards what was already kept for that question.
CONTEXT_QUESTIONS = {"hybrid": 1}


@dataclass(frozen=True)
class RecallDecision:
    recall: bool
    peak_share: float  # best hidden relevance / (best hidden + best visible); see the module doc
    units: tuple[int, ...]  # unit indices to bring back, in original order
    reason: str


def context_questions_for(scorer_name: str, configured: int | None) -> int:
    """Earlier questions in the gate's query: the setting when given, else the scorer's default."""
    return configured if configured is not None else CONTEXT_QUESTIONS.get(scorer_name, 0)


def gate_query(messages: Sequence[Message], index: int, context_questions: int) -> str:
    """The text the gate scores units against: the question at `index`, then up to
    `context_questions` earlier user questions, newest first. The question leads so that an
    encoder which truncates its input keeps it whole."""
    earlier = [m.content for m in messages[:index] if is_user_words(m) and m.content.strip()]  # not an output
    picked = earlier[len(earlier) - context_questions :] if context_questions > 0 else []
    return "\n\n".join([messages[index].content, *reversed(picked)])


def omitted_flags(units: Sequence[Unit], kept_ranges: Sequence[Range]) -> list[bool]:
    """Per unit: True when none of its lines was kept."""
    flags: list[bool] = []
    for u in units:
        kept = any(a <= u.last and b >= u.first for a, b in kept_ranges)
        flags.append(not kept)
    return flags


def peak_share(relevance: Sequence[float], hidden: Sequence[bool]) -> float:
    """best hidden / (best hidden + best visible) over non-negative relevance; 0 when neither has any."""
    top_hidden = max((r for r, h in zip(relevance, hidden) if h), default=0.0)
    top_visible = max((r for r, h in zip(relevance, hidden) if not h), default=0.0)
    total = top_hidden + top_visible
    return top_hidden / total if total > 0 else 0.0


def rank_fusion(score_lists: Sequence[Sequence[float]], k: int = RANK_FUSION_K) -> list[float]:
    """Reciprocal rank fusion: per unit, the sum over scorers of 1 / (k + its rank), rank 0 the best.
    Tied units share the better rank, so the order of units never decides (BM25 scores many
    units 0). Non-finite scores rank last."""
    if not score_lists:
        return []
    fused = [0.0] * len(score_lists[0])
    for scores in score_lists:
        if len(scores) != len(fused):
            raise ValueError(f"rank_fusion: {len(scores)} scores against {len(fused)}")
        ranks = competition_ranks([float(s) if math.isfinite(s) else -math.inf for s in scores])
        for i, rank in enumerate(ranks):
            fused[i] += 1.0 / (k + rank - 1)
    return fused


def decide_recall(
    scores: Sequence[float],
    tokens: Sequence[int],
    omitted: Sequence[bool],
    already_recalled: frozenset[int],
    theta: float = DEFAULT_THETA,
    budget_tokens: int = DEFAULT_RECALL_BUDGET,
    choice: Sequence[float] | None = None,
) -> RecallDecision:
    """Whether to recall, and which units (see the module doc for the statistic).

    Units recalled on an earlier turn count as visible. Recall iff the peak share of `scores`
    reaches θ and some hidden unit fits the budget. Units are chosen by density (relevance per
    token, ties to the earlier unit) of `choice` (default: `scores`), skipping those that do not
    fit; only units with relevance, unless none has any (then by position, as θ = 0 asks to
    recall anyway).
    """
    if not 0.0 <= theta <= 1.0:
        raise ValueError(f"theta must be in [0, 1], got {theta}")
    n = len(scores)
    if len(tokens) != n or len(omitted) != n:
        return RecallDecision(False, 0.0, (), f"scorer_failed: {n} scores, {len(tokens)} token counts, {len(omitted)} flags")
    choice = scores if choice is None else choice
    if len(choice) != n:
        return RecallDecision(False, 0.0, (), f"scorer_failed: {n} scores, {len(choice)} choice scores")
    if any(not math.isfinite(s) for s in (*scores, *choice)):
        return RecallDecision(False, 0.0, (), "scorer_failed: non-finite score")
    if not any(omitted):
        return RecallDecision(False, 0.0, (), "nothing_omitted")
    hidden = [omitted[i] and i not in already_recalled for i in range(n)]
    if not any(hidden):
        return RecallDecision(False, 0.0, (), "all_recalled")
    evidence = relevance_mass(scores)
    share = peak_share(evidence, hidden)
    if share < theta or (theta >= 1.0 and share < 1.0):
        return RecallDecision(False, share, (), "below_theta")
    # One scorer's gate (engine.scoring.scorers.gate_scores) passes the same list as both.
    mass = evidence if choice is scores else relevance_mass(choice)
    candidates = [i for i in range(n) if hidden[i]]
    # Units at or under the median are background: they never fill the budget, unless none has
    # any relevance (θ = 0 asks to recall anyway).
    pool = [i for i in candidates if mass[i] > 0] or candidates

    def density(i: int) -> float:
        return math.inf if tokens[i] <= 0 else mass[i] / tokens[i]

    chosen: list[int] = []
    remaining = budget_tokens
    for i in sorted(pool, key=lambda i: (-density(i), i)):
        if tokens[i] <= remaining:
            chosen.append(i)
            remaining -= tokens[i]
    if not chosen:
        return RecallDecision(False, share, (), "over_budget")
    return RecallDecision(True, share, tuple(sorted(chosen)), "recall")


def render_excerpts(lines: Sequence[str], ranges: Sequence[Range], source_label: str) -> str:
    """One labelled block per range (in the given order): a header line, then the lines verbatim.

    `lines` are `split_lines` output; a block whose last line has no terminator (the text's final
    line) gets one so the next header starts on its own line.
    """
    parts: list[str] = []
    for first, last in ranges:
        if not 0 <= first <= last < len(lines):
            raise ValueError(f"range ({first}, {last}) outside 0..{len(lines) - 1}")
        nl = "\r\n" if lines[first].endswith("\r\n") else "\n"
        parts.append(f"[pflash: recalled {line_span_label(first, last)} of {source_label}]{nl}")
        block = list(lines[first : last + 1])
        if not block[-1].endswith("\n"):
            block[-1] += nl
        parts.extend(block)
    return "".join(parts)
