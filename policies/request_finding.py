"""What the units of a long message are ranked against: the request that made it matter.

For a tool output (a tool message, or a user message in an agent's output wrapper:
policies/observations.py) that is the agent's own last turn: the call which produced it (name +
arguments, or the command of its fenced block), then the agent's words around it, the latest text
the user wrote, if short (MAX_SYSTEM_TOKENS) the system prompt, and the user text before the latest
(a follow-up such as "How can I create one?" names its subject there); a previous tool output or a
harness warning never enters it. For a long user paste it is the question the user wrote around the
pasted block; those lines are pinned so the question is never cut away. For a system prompt (cut
only when a one-shot side request cannot fit whole) it is the user text that follows it. The scored
text is trimmed to a token budget, most specific parts first.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Literal

from policies.conversation_types import Message, ToolCall
from policies.observations import (
    agent_command,
    is_user_words,
    latest_user_words,
    message_kind,
    without_command,
    wrapper_lines,
)
from policies.rendering import bare, split_lines

# Served-model tokens of request text. BM25 uses every word, and a task's text past its first
# lines still names what matters; a dense encoder reads only the head (engine/scoring/embedder.py). From
# 128 to 384 (tuning splits, gold kept at 27 %): bm25 78.3 -> 81.2 % on train, 79.6 -> 81.7 % on
# validation; hybrid 75.3 -> 80.6 % and 79.3 -> 83.9 %.
DEFAULT_SCORED_TOKENS = 384
DEFAULT_PINNED_TOKENS = 512

# A system prompt is mostly standing instructions, the same for every output; only a short one (a
# role line) says what the session is about. Under the former 128-token request a longer one never
# fit; at 384, 180 tokens of "You are a coding agent." turned the drafter's query to them.
MAX_SYSTEM_TOKENS = 64

# A question block is a few lines of the user's own prose; more than this is part of the paste.
MAX_QUESTION_LINES = 8
# How far into the head or tail of a paste a lone question line is looked for.
QUESTION_SEARCH_LINES = 20

CountTokens = Callable[[str], int]


@dataclass(frozen=True)
class RequestText:
    scored: str
    # 0-based inclusive line span of the target message to keep whatever the scores say.
    pinned_lines: tuple[int, int] | None
    # The message is a tool output whose producing call was found: the call says what is wanted.
    # Otherwise (a paste, an output without its call) the scorer has only the surrounding text.
    answers_call: bool = False


def _trim(text: str, limit: int, count_tokens: CountTokens, keep: Literal["head", "tail", "ends"]) -> str:
    """The longest head (or tail) of `text` within `limit` tokens: whole words, else characters.
    "ends" keeps both: a long user message puts its subject first (an issue's title) and its
    question last."""
    text = text.strip()
    if limit <= 0 or not text:
        return ""
    if count_tokens(text) <= limit:
        return text
    if keep == "ends":
        head = _trim(text, limit // 2, count_tokens, "head")
        rest = text[len(head):] if text.startswith(head) else text
        tail = _trim(rest, limit - count_tokens(head) - 1, count_tokens, "tail")
        return f"{head}\n{tail}" if head and tail else head or tail
    spans = [m.span() for m in re.finditer(r"\S+", text)]

    def by_words(k: int) -> str:
        if k == 0:
            return ""
        return text[: spans[k - 1][1]] if keep == "head" else text[spans[-k][0] :]

    def by_chars(k: int) -> str:
        return text[:k] if keep == "head" else text[len(text) - k :]

    for piece, hi in ((by_words, len(spans) - 1), (by_chars, len(text) - 1)):
        lo = 0
        while lo < hi:
            mid = (lo + hi + 1) // 2
            if count_tokens(piece(mid)) <= limit:
                lo = mid
            else:
                hi = mid - 1
        if lo > 0:
            return piece(lo).strip()
    return ""


def _assemble(
    parts: Sequence[tuple[int, str, Literal["head", "tail", "ends", "whole"]]],
    order: Sequence[int],
    max_tokens: int,
    count_tokens: CountTokens,
) -> str:
    """Trim parts in priority order into the budget; join the survivors in `order`."""
    remaining = max_tokens
    chosen: dict[int, str] = {}
    for k, (_, text, keep) in enumerate(parts):
        text = text.strip()
        if not text or remaining <= 0:
            continue
        separator = 1 if chosen else 0  # the "\n" joining parts may cost a token
        limit = remaining - separator
        if keep == "whole":
            piece = text if count_tokens(text) <= limit else ""
        else:
            piece = _trim(text, limit, count_tokens, keep)
        if piece:
            chosen[k] = piece
            remaining -= count_tokens(piece) + separator
    joined = "\n".join(chosen[k] for k in sorted(chosen, key=lambda k: order[k]))
    if count_tokens(joined) > max_tokens:
        joined = _trim(joined, max_tokens, count_tokens, "tail")
    return joined


def _producing_call(
    messages: Sequence[Message], target_index: int, call_id: str | None, name: str | None
) -> tuple[int, ToolCall] | None:
    """The assistant message index and call that this tool output answers."""
    if call_id:
        for i in range(target_index - 1, -1, -1):
            for call in messages[i].tool_calls:
                if call.id == call_id:
                    return i, call
    # Without an id, trust the nearest earlier call of the same name (or any, without a name).
    for i in range(target_index - 1, -1, -1):
        for call in reversed(messages[i].tool_calls):
            if name is None or call.name == name:
                return i, call
    return None


def _latest(messages: Sequence[Message], before: int, role: str) -> tuple[int, str] | None:
    for i in range(before - 1, -1, -1):
        if messages[i].role == role and messages[i].content.strip():
            return i, messages[i].content
    return None


def _producing_turn(
    messages: Sequence[Message], target_index: int
) -> tuple[int, str, str] | None:
    """For a tool output sent as a user message: the agent's turn before it, the command that turn
    ran (its last fenced block) and its words around the command."""
    for i in range(target_index - 1, -1, -1):
        if messages[i].role == "assistant":
            command = agent_command(messages[i].content)
            return (i, command, without_command(messages[i].content)) if command else None
    return None


def _tool_request(
    messages: Sequence[Message], target_index: int, count_tokens: CountTokens, max_tokens: int,
    max_pinned_tokens: int,
) -> RequestText:
    """A tool output, whatever role carried it, is ranked by what the agent's own last turn asked:
    its call (or the command of its fenced block), then its words, then the user's. A previous tool
    output or a harness warning never enters the request (policies/observations.py)."""
    target = messages[target_index]
    # (position in the conversation, text, how to trim), listed by priority.
    parts: list[tuple[int, str, Literal["head", "tail", "ends", "whole"]]] = []
    turn: tuple[int, str, str] | None = None
    if target.role == "tool":
        found = _producing_call(messages, target_index, target.tool_call_id, target.name)
        if found is not None:
            turn = (found[0], f"{found[1].name} {found[1].arguments}", messages[found[0]].content)
    else:
        turn = _producing_turn(messages, target_index)
    if turn is not None:
        parts.append((2 * turn[0] + 1, turn[1], "head"))
    # The agent's words around the call say what it wants from this output; the task is broader
    # and often long enough to use the whole budget, so it comes after them (tuning splits: +11
    # points of gold kept on train's tool outputs, equal on validation; BENCHMARKS.md).
    if turn is not None and turn[2].strip():
        parts.append((2 * turn[0], turn[2], "tail"))
    user = latest_user_words(messages, target_index)
    if user is not None:
        parts.append((2 * user, messages[user].content, "ends"))
    system = next((i for i, m in enumerate(messages[:target_index]) if m.role == "system"), None)
    if system is not None and count_tokens(messages[system].content) <= MAX_SYSTEM_TOKENS:
        parts.append((2 * system, messages[system].content, "whole"))
    # A follow-up question is often elliptical ("When should someone start doing it?"); the one before
    # it says what "it" is. Last in priority, so it only fills what the rest leaves (tuning splits,
    # MTRAG gold passages kept at 27 %: 94.8 -> 96.2 % on train, 94.1 -> 96.2 % on validation; one
    # earlier question beat all of them, 94.7 %, and the assistant's last answer, 91.8 %).
    # It goes last in the text, as in the recall gate's query: a dense encoder reads only the head.
    earlier = latest_user_words(messages, user) if user is not None else None
    if earlier is not None:
        parts.append((2 * target_index, messages[earlier].content, "tail"))
    scored = _assemble(parts, [p[0] for p in parts], max_tokens, count_tokens)
    wrapper = wrapper_lines(target.content) if target.role != "tool" else None
    pinned = wrapper if wrapper is not None and count_tokens(
        "".join(split_lines(target.content)[wrapper[0] : wrapper[1] + 1])) <= max_pinned_tokens else None
    return RequestText(scored=scored, pinned_lines=pinned, answers_call=turn is not None)


# --- long user pastes -----------------------------------------------------------------------------

_CUE = re.compile(
    r"^(?:why|what|how|where|when|which|who|can|could|would|please|fix|explain|find|summari[sz]e|"
    r"tell|show|help|is|are|does|do|did|should|list|debug|identify|review|look|check)\b",
    re.I,
)
_PASTE_PREFIX = re.compile(
    r"^(?:\s|\d{4}-\d{2}-\d{2}|\d{1,2}:\d{2}:\d{2}|\[|\{|[\w./-]+:\d+[:-]|(?:TRACE|DEBUG|INFO|WARN|ERROR|FATAL)\b)"
)
_FENCE = re.compile(r"^\s*(?:```|~~~)")


def _is_prose(text: str) -> bool:
    """A line the user plausibly typed: unindented words, not a log/grep/code shape."""
    s = text.strip()
    if not s or _PASTE_PREFIX.match(text) or _FENCE.match(text):
        return False
    if s[-1] in "{};(,=" or len(s.split()) < 2:
        return False
    visible = [c for c in s if not c.isspace()]
    letters = sum(1 for c in visible if c.isalpha())
    return letters >= 0.6 * len(visible)


def _is_question(text: str) -> bool:
    s = text.strip()
    return _is_prose(text) and (s.endswith("?") or bool(_CUE.match(s)))


def _edge_block(texts: Sequence[str], from_end: bool) -> tuple[int, int] | None:
    """The run of prose lines at the start (or end) of a paste, if it reads as the user's ask."""
    n = len(texts)
    idx = list(range(n - 1, -1, -1)) if from_end else list(range(n))
    k = 0
    while k < n and not texts[idx[k]].strip():
        k += 1
    run: list[int] = []
    while k < n and _is_prose(texts[idx[k]]) and len(run) <= MAX_QUESTION_LINES:
        run.append(idx[k])
        k += 1
    if not run or len(run) > MAX_QUESTION_LINES:
        return None
    rest = [i for i in idx[k:] if texts[i].strip()]
    if not rest:
        return None  # the whole message is prose: no separate paste to tell apart
    asks = any(_is_question(texts[i]) for i in run)
    # Without a question, accept it only when clearly set apart from a non-prose paste.
    if not asks and _is_prose(texts[rest[0]]):
        return None
    return (min(run), max(run))


def _user_request(
    messages: Sequence[Message],
    target_index: int,
    count_tokens: CountTokens,
    max_tokens: int,
    max_pinned_tokens: int,
) -> RequestText:
    lines = split_lines(messages[target_index].content)
    texts = [bare(line) for line in lines]

    def text_of(span: tuple[int, int]) -> str:
        return "".join(lines[span[0] : span[1] + 1])

    def fits(span: tuple[int, int]) -> bool:
        return count_tokens(text_of(span)) <= max_pinned_tokens

    head = _edge_block(texts, from_end=False)
    tail = _edge_block(texts, from_end=True)
    blocks = [b for b in (head, tail) if b is not None and fits(b)]
    if blocks:
        asking = [b for b in blocks if any(_is_question(texts[i]) for i in range(b[0], b[1] + 1))]
        # One pinned span: the block that asks, the later one when both (or neither) do.
        pinned = (asking or blocks)[-1]
        parts: list[tuple[int, str, Literal["head", "tail", "whole"]]] = [(pinned[0], text_of(pinned), "tail")]
        parts += [(b[0], text_of(b), "tail") for b in blocks if b != pinned]
        scored = _assemble(parts, [p[0] for p in parts], max_tokens, count_tokens)
        return RequestText(scored=scored, pinned_lines=pinned)
    # A lone question line near either end (the paste may wrap around it).
    nonblank = [i for i, t in enumerate(texts) if t.strip()]
    near = nonblank[-QUESTION_SEARCH_LINES:][::-1] + nonblank[:QUESTION_SEARCH_LINES]
    for i in near:
        if texts[i].strip().endswith("?") and _is_prose(texts[i]) and fits((i, i)):
            return RequestText(scored=_trim(texts[i], max_tokens, count_tokens, "tail"), pinned_lines=(i, i))
    # No ask inside the paste: rank against what came before it, else the paste's own opening.
    parts = []
    user = latest_user_words(messages, target_index)
    if user is not None:
        parts.append((2 * user, messages[user].content, "ends"))
    assistant = _latest(messages, target_index, "assistant")
    if assistant is not None:
        parts.append((2 * assistant[0], assistant[1], "tail"))
    if not parts:
        parts.append((0, messages[target_index].content, "head"))
    scored = _assemble(parts, [p[0] for p in parts], max_tokens, count_tokens)
    return RequestText(scored=scored, pinned_lines=None)


def _system_request(messages: Sequence[Message], target_index: int, count_tokens: CountTokens,
                    max_tokens: int) -> RequestText:
    """A system prompt cut because a one-shot request cannot fit whole (gateway/turns.py): the
    instructions that matter are those about what the request asks, the user text after them."""
    parts: list[tuple[int, str, Literal["head", "tail", "ends", "whole"]]] = [
        (i, m.content, "ends") for i, m in enumerate(messages) if i > target_index and is_user_words(m)][::-1]
    if not parts:
        parts.append((0, messages[target_index].content, "head"))
    scored = _assemble(parts, [p[0] for p in parts], max_tokens, count_tokens)
    return RequestText(scored=scored, pinned_lines=None)


def find_request(
    messages: Sequence[Message],
    target_index: int,
    count_tokens: CountTokens,
    max_scored_tokens: int = DEFAULT_SCORED_TOKENS,
    max_pinned_tokens: int = DEFAULT_PINNED_TOKENS,
) -> RequestText:
    """The request text to rank the target message's units against (see module doc).

    `pinned_lines` (a user paste's question, a wrapped output's opening lines) indexes
    `split_lines(target.content)`.
    """
    if not 0 <= target_index < len(messages):
        raise ValueError(f"target_index {target_index} outside 0..{len(messages) - 1}")
    kind = message_kind(messages[target_index])
    if kind == "tool_output":
        return _tool_request(messages, target_index, count_tokens, max_scored_tokens, max_pinned_tokens)
    if kind in ("user", "harness"):
        return _user_request(messages, target_index, count_tokens, max_scored_tokens, max_pinned_tokens)
    if kind == "system":
        return _system_request(messages, target_index, count_tokens, max_scored_tokens)
    raise ValueError(f"target must be a tool, user or system message, not {kind!r}")
