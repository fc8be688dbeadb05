from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from policies.conversation_types import Message, ToolCall
from policies.recall import (
    RecallDecision,
    context_questions_for,
    decide_recall,
    gate_query,
    omitted_flags,
    rank_fusion,
    relevance_mass,
    render_excerpts,
)
from policies.rendering import split_lines
from policies.segmentation import Unit


def test_recall_when_the_best_hidden_unit_rivals_the_best_visible_one() -> None:
    # Five unrelated units put the median at 0, so mass equals score here.
    scores = [5.0, 0.5, 3.0, 1.5, 0.0, 0.0, 0.0, 0.0, 0.0]
    tokens = [100, 50, 60, 10, 10, 10, 10, 10, 10]
    omitted = [False, True, True, True, True, True, True, True, True]
    d = decide_recall(scores, tokens, omitted, frozenset(), theta=0.3, budget_tokens=65)
    assert d.recall and d.reason == "recall"
    assert d.peak_share == pytest.approx(3.0 / (3.0 + 5.0))
    # Densities: unit 3 (0.15) > unit 2 (0.05) > unit 1 (0.01); 10 + 60 > 65, so 2 is skipped
    # and 1 still fits; the units without relevance never come back.
    assert d.units == (1, 3)
    # The same question at a stricter θ: the kept unit answers it better; nothing comes back.
    assert decide_recall(scores, tokens, omitted, frozenset(), theta=0.5).reason == "below_theta"


def test_the_gate_does_not_grow_with_how_much_was_omitted() -> None:
    # Issue 12: a share of all omitted mass fired on 95 % of follow-ups because most of a
    # compressed message is omitted. The peak share sees only the best hidden unit.
    question_about_kept = [9.0] + [0.0] * 25 + [2.0] * 15  # the median unit scores 0
    omitted = [False] + [True] * 40
    d = decide_recall(question_about_kept, [10] * 41, omitted, frozenset(), theta=0.5)
    assert not d.recall and d.peak_share == pytest.approx(2.0 / 11.0)
    omitted_mass_share = sum(m for m, o in zip(relevance_mass(question_about_kept), omitted) if o) / sum(
        relevance_mass(question_about_kept))
    assert omitted_mass_share > 0.75  # what the old statistic would have (wrongly) recalled on
    question_about_omitted = list(question_about_kept)
    question_about_omitted[30] = 12.0  # one hidden unit answers better than anything kept
    d = decide_recall(question_about_omitted, [10] * 41, omitted, frozenset(), theta=0.5)
    assert d.recall and 30 in d.units and set(d.units) == set(range(26, 41))  # the relevant ones, room for all
    tight = decide_recall(question_about_omitted, [10] * 41, omitted, frozenset(), theta=0.5, budget_tokens=10)
    assert tight.units == (30,)  # densest first


def test_background_scores_shared_by_every_unit_carry_no_mass() -> None:
    scores = [6.0] + [0.4] * 40  # a term in every omitted unit gives each a little score
    omitted = [False] + [True] * 40
    d = decide_recall(scores, [10] * 41, omitted, frozenset(), theta=0.075)
    assert d.peak_share == 0.0 and not d.recall


def test_units_recalled_earlier_count_as_visible() -> None:
    scores = [1.0, 0.0, 8.0, 0.0, 0.0]
    omitted = [False, False, True, True, True]
    assert decide_recall(scores, [10] * 5, omitted, frozenset(), theta=0.5).units == (2,)
    # Once unit 2 is in history, it is what the model sees: nothing hidden rivals it.
    d = decide_recall(scores, [10] * 5, omitted, frozenset({2}), theta=0.5)
    assert not d.recall and d.peak_share == 0.0


def test_below_theta_and_edge_thetas() -> None:
    scores = [9.5, 0.5, 0.0, 0.0, 0.0]
    tokens = [10, 10, 10, 10, 10]
    omitted = [False, True, False, False, False]
    assert decide_recall(scores, tokens, omitted, frozenset(), theta=0.5) == RecallDecision(
        False, pytest.approx(0.05), (), "below_theta"  # type: ignore[arg-type]
    )
    assert decide_recall(scores, tokens, omitted, frozenset(), theta=0.0).units == (1,)
    # θ = 1.0: only when the visible units hold no relevance at all.
    assert not decide_recall(scores, tokens, omitted, frozenset(), theta=1.0).recall
    assert decide_recall([0.0, 0.5, 0.0, 0.0, 0.0], tokens, omitted, frozenset(), theta=1.0).recall
    # θ = 0.0 recalls even with no relevance anywhere, earliest units first.
    d = decide_recall([0.0, 0.0, 0.0], [10, 10, 10], [True, True, True], frozenset(), theta=0.0, budget_tokens=20)
    assert d.recall and d.units == (0, 1)
    with pytest.raises(ValueError):
        decide_recall(scores, tokens, omitted, frozenset(), theta=1.5)


def test_no_recall_cases() -> None:
    assert decide_recall([1.0], [5], [False], frozenset()).reason == "nothing_omitted"
    assert decide_recall([1.0, 1.0], [5, 5], [False, True], frozenset({1}), theta=0.0).reason == "all_recalled"
    assert decide_recall([1.0, 1.0], [5, 500], [False, True], frozenset(), theta=0.0, budget_tokens=100).reason == "over_budget"
    assert decide_recall([math.nan, 1.0], [5, 5], [False, True], frozenset()).reason.startswith("scorer_failed")
    assert decide_recall([1.0], [5, 5], [False, True], frozenset()).reason.startswith("scorer_failed")


def test_zero_score_units_are_not_recalled_when_relevant_ones_exist() -> None:
    d = decide_recall([1.0, 2.0, 0.0], [10, 10, 10], [False, True, True], frozenset(), budget_tokens=100)
    assert d.units == (1,)


def test_omitted_flags() -> None:
    units = [Unit(0, 3, 1, "code"), Unit(4, 6, 1, "code"), Unit(7, 9, 1, "code")]
    assert omitted_flags(units, [(0, 3), (9, 9)]) == [False, True, False]
    assert omitted_flags(units, []) == [True, True, True]


def test_render_excerpts() -> None:
    lines = split_lines("".join(f"l{i}\n" for i in range(1, 201)) + "last")
    out = render_excerpts(lines, [(119, 130), (199, 199), (200, 200)], "the grep output")
    expected = (
        "[pflash: recalled lines 120–131 of the grep output]\n"
        + "".join(f"l{i}\n" for i in range(120, 132))
        + "[pflash: recalled line 200 of the grep output]\nl200\n"
        + "[pflash: recalled line 201 of the grep output]\nlast\n"
    )
    assert out == expected
    with pytest.raises(ValueError):
        render_excerpts(lines, [(0, 201)], "x")


@st.composite
def recall_cases(draw: st.DrawFn) -> tuple[list[float], list[int], list[bool], frozenset[int], float, int]:
    n = draw(st.integers(1, 30))
    scores = draw(st.lists(st.floats(-2, 20, allow_nan=False), min_size=n, max_size=n))
    tokens = draw(st.lists(st.integers(0, 400), min_size=n, max_size=n))
    omitted = draw(st.lists(st.booleans(), min_size=n, max_size=n))
    recalled = draw(st.frozensets(st.integers(0, n - 1)))
    theta = draw(st.sampled_from([0.0, 0.075, 0.5, 1.0]))
    budget = draw(st.integers(0, 2048))
    return scores, tokens, omitted, recalled, theta, budget


@settings(max_examples=300)
@given(recall_cases())
def test_recall_gate_invariants(case: tuple[list[float], list[int], list[bool], frozenset[int], float, int]) -> None:
    scores, tokens, omitted, recalled, theta, budget = case
    d = decide_recall(scores, tokens, omitted, recalled, theta, budget)
    assert d == decide_recall(list(scores), list(tokens), list(omitted), recalled, theta, budget)
    assert 0.0 <= d.peak_share <= 1.0 + 1e-12
    assert list(d.units) == sorted(set(d.units))
    assert all(omitted[i] and i not in recalled for i in d.units)
    assert sum(tokens[i] for i in d.units) <= budget
    assert d.recall == bool(d.units)
    if d.recall:
        assert d.peak_share >= theta
    mass = relevance_mass(scores)
    assert all(m >= 0 for m in mass)
    hidden = [o and i not in recalled for i, o in enumerate(omitted)]
    if any(hidden):
        top_hidden = max(m for m, h in zip(mass, hidden) if h)
        top_visible = max((m for m, h in zip(mass, hidden) if not h), default=0.0)
        if top_hidden + top_visible > 0:
            assert d.peak_share == pytest.approx(top_hidden / (top_hidden + top_visible))
        if top_hidden > top_visible and theta <= 0.5:
            assert d.recall or d.reason == "over_budget"  # the best match is hidden: bring it back


@settings(max_examples=100)
@given(st.integers(2, 25), st.integers(0, 2**32 - 1), st.integers(50, 500))
def test_recall_over_turns_never_repeats_a_unit(n: int, seed: int, budget: int) -> None:
    import random

    rng = random.Random(seed)
    tokens = [rng.randint(1, 200) for _ in range(n)]
    omitted = [rng.random() < 0.7 for _ in range(n)]
    recalled: frozenset[int] = frozenset()
    seen: list[int] = []
    for _turn in range(8):
        scores = [rng.random() * 10 for _ in range(n)]
        d = decide_recall(scores, tokens, omitted, recalled, theta=0.0, budget_tokens=budget)
        assert not set(d.units) & recalled
        seen.extend(d.units)
        recalled = recalled | set(d.units)
    assert len(seen) == len(set(seen))
    assert recalled <= {i for i in range(n) if omitted[i]}


def test_recall_brings_back_relevant_units_not_the_background() -> None:
    scores = [0.0] * 20 + [9.0, 1.0, 0.5, 8.0] + [0.0] * 6
    omitted = [False] * 20 + [True] * 10
    d = decide_recall(scores, [10] * 30, omitted, frozenset(), theta=0.5, budget_tokens=1000)
    assert d.units == (20, 21, 22, 23)  # the budget had room for the six others: no relevance


def test_gate_query_carries_earlier_user_questions_newest_first() -> None:
    messages = [Message("system", "You answer from the search results."),
                Message("user", "Which plans cover dental care?"),
                Message("assistant", "", (ToolCall("call_1", "search", "{}"),)),
                Message("tool", "[1] plan A covers dental\n", tool_call_id="call_1"),
                Message("assistant", "Plan A does."),
                Message("user", "   "),
                Message("user", "And what does it cost?"),
                Message("assistant", "40 a month."),
                Message("user", "For a family?")]
    last = len(messages) - 1
    assert gate_query(messages, last, 0) == "For a family?"
    assert gate_query(messages, last, 1) == "For a family?\n\nAnd what does it cost?"
    # blank user turns, tool outputs, the system prompt and assistant words are not questions
    assert gate_query(messages, last, 2) == "For a family?\n\nAnd what does it cost?\n\nWhich plans cover dental care?"
    assert gate_query(messages, last, 9) == gate_query(messages, last, 2)
    assert gate_query(messages, 1, 3) == "Which plans cover dental care?"  # nothing before the first
    # An output sent as a user message (Aider's /run, mini-swe-agent) is not a question either.
    aider = [*messages[:-1], Message("user", "I ran this command:\n\npytest\n\nAnd got this output:\n\nok\n"),
             Message("assistant", "Ok."), messages[-1]]
    assert gate_query(aider, len(aider) - 1, 1) == "For a family?\n\nAnd what does it cost?"


def test_context_questions_default_by_scorer_and_setting_wins() -> None:
    assert context_questions_for("hybrid", None) == 1
    assert context_questions_for("bm25", None) == 0  # also what a fallback to BM25 gets
    assert context_questions_for("embed", None) == context_questions_for("head", None) == 0
    assert context_questions_for("bm25", 2) == 2 and context_questions_for("hybrid", 0) == 0


def test_rank_fusion_sums_reciprocal_ranks_and_ties_share_the_better_rank() -> None:
    dense = [0.9, 0.1, 0.5, 0.3]
    lexical = [0.0, 4.0, 0.0, 0.0]  # three units tie at 0: each gets rank 1, whatever its position
    fused = rank_fusion([dense, lexical], k=10)
    assert fused == pytest.approx([1 / 10 + 1 / 11, 1 / 13 + 1 / 10, 1 / 11 + 1 / 11, 1 / 12 + 1 / 11])
    assert rank_fusion([[1.0, math.nan, 2.0]], k=10) == pytest.approx([1 / 11, 1 / 12, 1 / 10])  # non-finite last
    assert rank_fusion([]) == []
    with pytest.raises(ValueError):
        rank_fusion([[1.0, 2.0], [1.0]])


@settings(max_examples=200)
@given(st.lists(st.tuples(st.floats(-5, 5, allow_nan=False), st.floats(0, 9, allow_nan=False)), min_size=1, max_size=40),
       st.randoms(use_true_random=False))
def test_rank_fusion_depends_on_ranks_only_never_on_position(pairs: list[tuple[float, float]], rng: object) -> None:
    dense, lexical = [p[0] for p in pairs], [p[1] for p in pairs]
    fused = rank_fusion([dense, lexical])
    order = list(range(len(pairs)))
    rng.shuffle(order)  # type: ignore[attr-defined]
    shuffled = rank_fusion([[dense[i] for i in order], [lexical[i] for i in order]])
    assert shuffled == pytest.approx([fused[i] for i in order])
    assert rank_fusion([[4 * d for d in dense], lexical]) == pytest.approx(fused)  # scale-free
    assert all(0 < f <= 2 / 10 + 1e-12 for f in fused)
    for i in range(len(pairs)):  # better in both scorers never fuses lower
        for j in range(len(pairs)):
            if dense[i] >= dense[j] and lexical[i] >= lexical[j]:
                assert fused[i] >= fused[j] - 1e-12


def test_the_fused_gate_fires_on_what_one_scorer_ranks_first_among_the_hidden() -> None:
    # The kept unit 0 is the encoder's best match; hidden unit 5 is BM25's best by far and the
    # encoder's second. The encoder's peak share alone stays under θ; fused ranks reach it.
    dense = [0.90, 0.20, 0.25, 0.30, 0.10, 0.60, 0.15, 0.05, 0.12]
    lexical = [0.5, 0.0, 0.0, 0.2, 0.0, 6.0, 0.0, 0.0, 0.0]
    omitted = [False] + [True] * 8
    tokens = [40] * 9
    alone = decide_recall(dense, tokens, omitted, frozenset(), theta=0.43)
    assert not alone.recall and alone.peak_share < 0.43
    fused = decide_recall(rank_fusion([dense, lexical]), tokens, omitted, frozenset(), theta=0.43, choice=dense)
    assert fused.recall and 5 in fused.units
    # Units come back in the encoder's order of density: the budget for one takes unit 5, not BM25's runner-up.
    tight = decide_recall(rank_fusion([dense, lexical]), tokens, omitted, frozenset(), theta=0.43, budget_tokens=40,
                          choice=dense)
    assert tight.units == (5,)


@settings(max_examples=200)
@given(recall_cases())
def test_choice_orders_what_comes_back_and_never_whether(case: tuple[list[float], list[int], list[bool], frozenset[int], float, int]) -> None:
    scores, tokens, omitted, recalled, theta, budget = case
    d = decide_recall(scores, tokens, omitted, recalled, theta, budget)
    assert d == decide_recall(scores, tokens, omitted, recalled, theta, budget, choice=scores)
    reversed_choice = [-s for s in scores]
    other = decide_recall(scores, tokens, omitted, recalled, theta, budget, choice=reversed_choice)
    assert other.peak_share == d.peak_share
    assert other.recall == d.recall or "over_budget" in (other.reason, d.reason)
    assert decide_recall(scores, tokens, omitted, recalled, theta, budget, choice=scores[:-1]).reason.startswith(
        "scorer_failed")
