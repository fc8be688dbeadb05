"""The <think>…</think> splitter: the same split however the stream is chunked."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from engine.reasoning import ReasoningSplitter, prompt_opens_reasoning
from policies.conversation_types import ReasoningDelta, TextDelta


def split(chunks: list[str], starts_inside: bool = False) -> tuple[str, str]:
    splitter = ReasoningSplitter(starts_inside)
    events = [e for chunk in chunks for e in splitter.feed(chunk)] + splitter.finish()
    assert all(e.text for e in events), "no empty deltas"
    reasoning = "".join(e.text for e in events if isinstance(e, ReasoningDelta))
    answer = "".join(e.text for e in events if isinstance(e, TextDelta))
    return reasoning, answer


def chunked(text: str, cuts: list[int]) -> list[str]:
    points = sorted({min(c, len(text)) for c in cuts})
    edges = [0, *points, len(text)]
    return [text[a:b] for a, b in zip(edges, edges[1:])]


def test_qwen3_style_reasoning_is_split_from_the_answer() -> None:
    assert split(["<think>\nLet me add.\n</think>\n\n2 + 2 = 4"]) == ("Let me add.\n", "2 + 2 = 4")
    assert split(["<th", "ink>a</th", "ink>b"]) == ("a", "b")
    assert split(["  <think>x</think>y"]) == ("x", "y")


def test_no_markup_is_all_answer_and_late_tags_are_text() -> None:
    assert split(["plain answer"]) == ("", "plain answer")
    assert split(["Use <think> tags like <think>this</think>."]) == ("", "Use <think> tags like <think>this</think>.")
    assert split(["<"]) == ("", "<")
    assert split(["<thin"]) == ("", "<thin")


def test_prompt_that_opened_think_starts_in_reasoning() -> None:
    assert prompt_opens_reasoning("<|im_start|>assistant\n<think>\n")
    assert not prompt_opens_reasoning("<|im_start|>assistant\n")
    assert split(["step one</think>done"], starts_inside=True) == ("step one", "done")
    assert split(["unterminated </thi"], starts_inside=True) == ("unterminated </thi", "")


TEXTS = st.text(alphabet=st.sampled_from(list("ab <>/\nthink")), max_size=40)


@given(
    prefix=st.sampled_from(["", " ", "\n"]),
    reasoning=TEXTS.filter(lambda t: "</think>" not in t),
    answer=TEXTS,
    cuts=st.lists(st.integers(min_value=0, max_value=80), max_size=12),
)
def test_any_chunking_gives_the_one_shot_split(prefix: str, reasoning: str, answer: str, cuts: list[int]) -> None:
    text = f"{prefix}<think>{reasoning}</think>{answer}"
    whole = split([text])
    assert whole == (reasoning.lstrip(), answer.lstrip())
    assert split(chunked(text, cuts)) == whole


@given(text=TEXTS, cuts=st.lists(st.integers(min_value=0, max_value=40), max_size=12), inside=st.booleans())
def test_arbitrary_text_never_loses_or_invents_characters(text: str, cuts: list[int], inside: bool) -> None:
    whole = split([text], inside)
    assert split(chunked(text, cuts), inside) == whole
    reasoning, answer = whole
    # Only the tags and the whitespace after them are removed.
    kept = (reasoning + answer).replace(" ", "").replace("\n", "")
    assert len(kept) <= len(text.replace(" ", "").replace("\n", ""))
