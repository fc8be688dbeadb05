"""Cut a long text into line-aligned units that follow its structure, without a parser.

A unit is a run of whole lines; units cover every line exactly once, in order. The text's kind is
guessed once for the whole document (tool outputs are homogeneous) and decides where raw units
start:

- grep:  `path:line:` hits, consecutive hits of one file form a unit;
- log:   each record starts at a timestamp or level prefix; continuation lines (tracebacks,
         wrapped messages, blank lines) stay with their record;
- code:  a line at the base indentation starts a unit, so a top-level definition keeps its
         indented body; decorators and comments directly above stay with what they decorate,
         closers (`}`, `else:`, `except`) stay with what they close;
- prose: paragraphs (blank-line separated blocks; a markdown heading also starts one; fenced
         blocks are not cut).

Line-number prefixes (`     1→`, `  12\\t`, `12:`) are stripped for detection only.
Then small units merge forward (the last one backward) and big ones split at line boundaries,
preferring structure starts (raw unit starts, nested definitions), then blank lines, then any line;
a remainder of at most TAIL_SLACK × max_segment is not split.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Pattern

from policies.line_numbers import NUMBER_PREFIXES, grep_path


@dataclass(frozen=True)
class Unit:
    """Lines first..last (0-based, inclusive) of the original text."""

    first: int
    last: int
    tokens: int
    kind: str  # "code" | "grep" | "log" | "prose" | "blank"

    @property
    def n_lines(self) -> int:
        return self.last - self.first + 1


KINDS = ("code", "grep", "log", "prose", "blank")
# Units smaller than this (tokens) merge forward; larger ones split at line boundaries (the defaults
# of the settings min_segment and max_segment).
DEFAULT_MIN_SEGMENT, DEFAULT_MAX_SEGMENT = 32, 512
# Under a budget below TIGHT_SHARE of a message, units of TIGHT_KINDS are at most half as long: a
# 500-token unit would spend a fifth of a 15 % budget on the lines around its evidence. The default
# ranker, 5-fold cross-validation over train + validation sessions (`python -m benchmarks.train ranker`
# reports the 15 % point so cut): gold kept at 15 % 86.9 -> 90.2 %, at 18 % 89.9 -> 93.0 %, but at 22 %
# 95.0 -> 93.8 % and at 27 % 95.2 -> 94.9 %, so only below TIGHT_SHARE (the default budget curve never is).
TIGHT_SHARE = 0.2
# Prose keeps its full units: a retrieved passage is evidence only whole. On MTRAG search outputs
# (all prose) halving them cost 0.9 points of gold passages at 15 % with the ranker (validation, 79
# conversations), 3.3 at 12 % and 2.4 at 18 %; BM25 8.9 at 15 % (train + validation, 262). The 22 of
# 198 coding outputs (train + validation) that read as prose gained 3.1 points at 12-15 % from it
# and none at 18 %: 0.3 points over all coding outputs, so their units stay whole too.
TIGHT_KINDS = frozenset({"code", "grep", "log"})


def is_tight(keep_share: float) -> bool:
    """Whether keeping `keep_share` of a message cuts its units shorter (see TIGHT_SHARE)."""
    return keep_share < TIGHT_SHARE


def unit_limit(kind: str, tight: bool, min_segment: int, max_segment: int) -> int:
    """The longest unit of a document of `kind` (see TIGHT_SHARE and TIGHT_KINDS)."""
    return max(max_segment // 2, min_segment) if tight and kind in TIGHT_KINDS else max_segment

_GREP_SEPARATOR = re.compile(r"^--\s*$")

_LOG_START = re.compile(
    r"""^\[?(?:
        \d{4}[-/.]\d{2}[-/.]\d{2}[T\s_]\d{1,2}:\d{2}          # ISO-ish date and time
      | \d{1,2}:\d{2}:\d{2}                                  # time of day
      | [A-Z][a-z]{2}\s+\d{1,2}\s+\d{2}:\d{2}:\d{2}            # syslog
      | (?:TRACE|DEBUG|INFO|NOTICE|WARN|WARNING|ERROR|ERR|CRITICAL|FATAL|SEVERE|PANIC)\b
      | [IWEF]\d{4}\s+\d{2}:\d{2}:\d{2}                       # glog
      | \d{10}(?:\.\d+)?\s                                   # epoch seconds
      | (?:time|ts|timestamp)=                               # logfmt
      | \{\s*"(?:time|ts|timestamp|@timestamp|level|msg)"    # JSON lines
    )""",
    re.X,
)

_DEF_START = re.compile(
    r"""^(?:
        (?:async\s+)?def\s
      | class\s
      | (?:export\s+)?(?:default\s+)?(?:async\s+)?function\b
      | func\s
      | (?:pub(?:\([^)]*\))?\s+)?(?:async\s+)?(?:fn|struct|enum|trait|impl|mod)\b
      | impl\b
      | (?:interface|module|namespace|object|protocol|extension)\s
      | (?:public|private|protected|internal|static|abstract|final|override|export)\s
      | (?:export\s+)?(?:const|let|var)\s+\w+\s*=\s*(?:async\s*)?(?:function\b|\([^)]*\)\s*=>|\w+\s*=>)
      | (?:type|typedef)\s
    )""",
    re.X,
)
_DECORATOR = re.compile(r"^@[\w.]")
_COMMENT = re.compile(r"^(?:#(?!include|define|if|endif|else|pragma)|//|/\*|\*|--\s|;;|<!--)")
_CLOSER = re.compile(r"^(?:[)\]}]|(?:else|elif|except|finally|catch|end|rescue|ensure)\b)")
_CODE_START = re.compile(
    r"^(?:import|from|#include|#define|package|using|return|if|for|while|#!|//|/\*|\*/|"
    r"[\w.]+\s*(?:=|\+=|-=|\(.*\)\s*;?$))"
)
_HEADING = re.compile(r"^#{1,6}\s")
_FENCE = re.compile(r"^\s*(?:```|~~~)")


def _detect_numbering(texts: Sequence[str]) -> Pattern[str] | None:
    """The line-number prefix most non-blank lines carry with increasing numbers, if any."""
    nonblank = [t for t in texts if t.strip()]
    if len(nonblank) < 2:
        return None
    best: tuple[int, Pattern[str]] | None = None
    for pat in NUMBER_PREFIXES:
        nums = [int(m.group(1)) for t in nonblank if (m := pat.match(t))]
        if len(nums) < 2 or len(nums) < 0.6 * len(nonblank):
            continue
        rising = sum(1 for a, b in zip(nums, nums[1:]) if b > a)
        if rising < 0.8 * (len(nums) - 1):
            continue
        if best is None or len(nums) > best[0]:
            best = (len(nums), pat)
    return best[1] if best else None


def _strip_numbers(texts: Sequence[str]) -> list[str]:
    pat = _detect_numbering(texts)
    if pat is None:
        return list(texts)
    return [t[m.end() :] if (m := pat.match(t)) else t for t in texts]


def _indent(text: str) -> int:
    expanded = text.expandtabs(4)
    return len(expanded) - len(expanded.lstrip())


def _is_codeish(text: str) -> bool:
    s = text.strip()
    if not s:
        return False
    if text[0] in " \t":
        return True
    if _DEF_START.match(s) or _DECORATOR.match(s) or _CLOSER.match(s) or _CODE_START.match(s):
        return True
    return s[-1] in "{}();:,[]=\\"


def detect_kind(texts: Sequence[str]) -> str:
    """The document's kind from its (number-stripped, terminator-free) lines."""
    nonblank = [t for t in texts if t.strip()]
    if not nonblank:
        return "blank"
    n = len(nonblank)
    if sum(1 for t in nonblank if grep_path(t)) >= 0.5 * n:
        return "grep"
    # Records may carry long continuations (tracebacks), so a minority of starts is enough.
    if sum(1 for t in nonblank if _LOG_START.match(t)) >= 0.25 * n:
        return "log"
    if sum(1 for t in nonblank if _is_codeish(t)) >= 0.5 * n:
        return "code"
    return "prose"


# --- raw units: where structure says a unit starts --------------------------------------------


def _starts_code(texts: Sequence[str]) -> list[int]:
    levels = [_indent(t) for t in texts if t.strip()]
    base = min(levels) if levels else 0
    starts = [0]
    seen_first = False
    for i, t in enumerate(texts):
        s = t.strip()
        if not s or _indent(t) > base:
            continue
        if not seen_first:
            seen_first = True
            continue
        if _CLOSER.match(s):
            continue
        prev = texts[i - 1].strip()
        prev_is_base = bool(prev) and _indent(texts[i - 1]) <= base
        # A decorator or comment directly above belongs to what follows it.
        if prev_is_base and (_DECORATOR.match(prev) or _COMMENT.match(prev)):
            continue
        # Adjacent top-level statements (an import block, a module docstring) stay together
        # until a blank line, the end of a body, or a new definition.
        if prev_is_base and not _DEF_START.match(s):
            continue
        starts.append(i)
    return starts


def _starts_grep(texts: Sequence[str]) -> list[int]:
    starts = [0]
    current: str | None = None
    for i, t in enumerate(texts):
        hit = grep_path(t)
        if hit is None:
            continue  # separators, blank and stray lines stay with the current file
        if current is not None and hit[0] != current and i > 0:
            starts.append(i)
        current = hit[0]
    return starts


def _starts_log(texts: Sequence[str]) -> list[int]:
    return [0] + [i for i, t in enumerate(texts) if i > 0 and _LOG_START.match(t)]


def _starts_prose(texts: Sequence[str]) -> list[int]:
    starts = [0]
    in_fence = False
    seen_first = False
    for i, t in enumerate(texts):
        s = t.strip()
        if _FENCE.match(t):
            if not in_fence and seen_first and (not texts[i - 1].strip()):
                starts.append(i)
            in_fence = not in_fence
            seen_first = True
            continue
        if in_fence or not s:
            continue
        if seen_first and (not texts[i - 1].strip() or _HEADING.match(s)):
            starts.append(i)
        seen_first = True
    return sorted(set(starts))


_STARTS = {"code": _starts_code, "grep": _starts_grep, "log": _starts_log, "prose": _starts_prose}


def _split_points(texts: Sequence[str], kind: str, raw_starts: Sequence[int]) -> tuple[set[int], set[int]]:
    """Preferred cut positions (cut before line i): (structure starts, lines after a blank)."""
    structure = set(raw_starts)
    for i, t in enumerate(texts):
        s = t.strip()
        if kind == "code":
            if s and _DEF_START.match(s):
                # Move the cut above decorators/comments at the same indentation.
                j, level = i, _indent(t)
                while j > 0:
                    above = texts[j - 1].strip()
                    if not above or _indent(texts[j - 1]) != level:
                        break
                    if not (_DECORATOR.match(above) or _COMMENT.match(above)):
                        break
                    j -= 1
                structure.add(j)
        elif kind == "grep":
            if i > 0 and _GREP_SEPARATOR.match(texts[i - 1]):
                structure.add(i)
            hit, prev = grep_path(t), grep_path(texts[i - 1]) if i > 0 else None
            if hit and prev and hit[0] == prev[0] and hit[1] != prev[1] + 1:
                structure.add(i)  # a jump in line numbers is a new hit region
    after_blank = {i for i in range(1, len(texts)) if texts[i].strip() and not texts[i - 1].strip()}
    return structure, after_blank


# --- sizing -------------------------------------------------------------------------------------

# A remainder up to this many max_segments stays one unit: cutting a passage a little over the
# limit leaves a small tail that ranks apart from its head and is dropped alone.
TAIL_SLACK = 1.25


def _merge_small(
    spans: list[tuple[int, int]], tok: Sequence[int], min_segment: int, max_segment: int
) -> list[tuple[int, int]]:
    def size(span: tuple[int, int]) -> int:
        return sum(tok[span[0] : span[1] + 1])

    def giant(span: tuple[int, int]) -> bool:
        return span[0] == span[1] and tok[span[0]] > max_segment

    out: list[tuple[int, int]] = []
    pending: tuple[int, int] | None = None
    for span in spans:
        if pending is not None:
            if giant(span) and out and not giant(out[-1]):
                # Merging into a line that must stay alone would be undone by the split: go back.
                out[-1] = (out[-1][0], pending[1])
                pending = None
            elif giant(span):
                out.append(pending)
                pending = None
            else:
                span = (pending[0], span[1])
                pending = None
        if size(span) < min_segment:
            pending = span
        else:
            out.append(span)
    if pending is not None:
        if out and not giant(out[-1]):
            out[-1] = (out[-1][0], pending[1])
        else:
            out.append(pending)
    return out


def _split_big(
    span: tuple[int, int],
    tok: Sequence[int],
    min_segment: int,
    max_segment: int,
    structure: set[int],
    after_blank: set[int],
) -> list[tuple[int, int]]:
    a, b = span
    prefix = [0]
    for i in range(a, b + 1):
        prefix.append(prefix[-1] + tok[i])

    def tokens(first: int, last: int) -> int:
        return prefix[last - a + 1] - prefix[first - a]

    pieces: list[tuple[int, int]] = []
    s = a
    while s <= b:
        e = s - 1
        while e + 1 <= b and tokens(s, e + 1) <= max_segment:
            e += 1
        if e < s:  # one line over max_segment: its own unit, never cut inside
            pieces.append((s, s))
            s += 1
            continue
        if tokens(s, b) <= TAIL_SLACK * max_segment:  # includes e == b: the rest fits max_segment
            pieces.append((s, b))
            break
        # Cut before c: piece s..c-1 fits. Best tier first, then the latest cut (fullest piece);
        # cuts leaving a piece or a remainder under min_segment only when nothing else exists.
        best: tuple[int, int, int] | None = None
        for c in range(s + 1, e + 2):
            good = tokens(s, c - 1) >= min_segment and tokens(c, b) >= min_segment
            tier = 0 if c in structure else 1 if c in after_blank else 2
            key = (0 if good else 1, tier, -c)
            if best is None or key < best:
                best = key
        assert best is not None
        c = -best[2]
        if best[0] == 1:
            c = e + 1  # no well-sized cut: fill the piece
        pieces.append((s, c - 1))
        s = c
    return pieces


def segment(
    lines: Sequence[str],
    line_tokens: Sequence[int],
    min_segment: int = 32,
    max_segment: int = 512,
    tight: bool = False,
) -> list[Unit]:
    """Units of whole lines covering every line once, in order (see module doc). `tight`: the
    budget keeps under TIGHT_SHARE of the text, so units of TIGHT_KINDS are cut shorter.

    `lines` may carry terminators (as `split_lines` gives them) or not.
    """
    if len(lines) != len(line_tokens):
        raise ValueError(f"{len(lines)} lines but {len(line_tokens)} token counts")
    if min_segment < 0 or max_segment < 1 or min_segment > max_segment:
        raise ValueError(f"need 0 <= min_segment <= max_segment, 1 <= max_segment; got {min_segment}, {max_segment}")
    if any(t < 0 for t in line_tokens):
        raise ValueError("token counts must be non-negative")
    if not lines:
        return []
    texts = _strip_numbers([line.rstrip("\r\n") for line in lines])
    kind = detect_kind(texts)
    max_segment = unit_limit(kind, tight, min_segment, max_segment)
    raw_starts = _STARTS.get(kind, _starts_prose)(texts)
    bounds = list(raw_starts) + [len(texts)]
    spans = [(bounds[k], bounds[k + 1] - 1) for k in range(len(raw_starts))]
    spans = _merge_small(spans, line_tokens, min_segment, max_segment)
    structure, after_blank = _split_points(texts, kind, raw_starts)
    units: list[Unit] = []
    for span in spans:
        for first, last in _split_big(span, line_tokens, min_segment, max_segment, structure, after_blank):
            blank = all(not texts[i].strip() for i in range(first, last + 1))
            units.append(Unit(first, last, sum(line_tokens[first : last + 1]), "blank" if blank else kind))
    return units


def check_units(units: Sequence[Unit], line_tokens: Sequence[int]) -> str | None:
    """Why `units` are not a valid cover of these lines (in order, once each), or None."""
    nxt = 0
    for k, u in enumerate(units):
        if u.first != nxt or u.last < u.first:
            return f"unit {k} spans {u.first}..{u.last}, expected to start at {nxt}"
        if u.last >= len(line_tokens):
            return f"unit {k} ends at {u.last}, past the last line {len(line_tokens) - 1}"
        if u.tokens != sum(line_tokens[u.first : u.last + 1]):
            return f"unit {k} token count {u.tokens} does not match its lines"
        nxt = u.last + 1
    if nxt != len(line_tokens):
        return f"units cover {nxt} of {len(line_tokens)} lines"
    return None
