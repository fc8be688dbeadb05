"""Long tool outputs built from real coding-agent sessions (`../shared/data/swe-*.jsonl.zst`), for the
retention benchmark and for training the relevance head: part of the package so that
`python -m benchmarks.train head` runs from an install (no import of `benchmarks/`).

A session is mini-swe-agent's: each assistant turn holds a THOUGHT and one ```bash``` command, each
tool output is a user message `<returncode>N</returncode><output>…</output>`. Two shapes of long
output are built, both padded to the compression threshold with outputs of other sessions of the
same repository (same files and vocabulary: the hardest distractors), the session's own text at a
seeded depth:

- `session_log`: the whole session as one terminal log (`$ command` then its output, in order);
  the request is the task.
- `tool_outputs`: one real tool output holding evidence; the request is what the agent had just
  asked for (its last thought and command, as the serving request finder reads a tool call), plus
  the task.

Labels: gold lines (the lines the verified patch removes) are the test metric. Weak labels mark, in
every output, the lines the agent went on to use: lines naming a path, identifier or line number
that its later commands and thoughts mention, and lines its patch touches.
"""

from __future__ import annotations

import hashlib
import io
import itertools
import json
import re
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from policies.rendering import split_lines

_BASH = re.compile(r"```bash\n(.*?)```", re.DOTALL)
_BODY = re.compile(r"<(output(?:_head|_tail)?)>\n?(.*?)</\1>", re.DOTALL)
# `cat -n` / `nl -ba` ("   71\t") and `grep -n` ("path:71:" or "71:") prefixes in front of a line.
_LINE_PREFIX = re.compile(r"^(?:\s*\d+\t|(?:[\w./-]+[:-])?\d+[:-])")
_THOUGHT = re.compile(r"THOUGHT:\s*(.*?)(?:```|$)", re.DOTALL)
_IDENT = re.compile(r"[A-Za-z_][A-Za-z0-9_]{3,}")
_PATH = re.compile(r"[\w.-]+(?:/[\w.-]+)+\.\w+|[\w-]+\.(?:py|rst|txt|cfg|toml|js|c|h)\b")
_LINENO = re.compile(r"(?:-n\s+|sed -n '|line\s+)(\d+)")

Count = Callable[[str], int]
MARGIN = 1.04  # outputs are built a little over the compression threshold so admission takes them all


def load_jsonl_zst(path: Path) -> list[dict[str, Any]]:
    import zstandard

    with path.open("rb") as fh, zstandard.ZstdDecompressor().stream_reader(fh) as reader:
        return [json.loads(line) for line in io.TextIOWrapper(reader, encoding="utf-8") if line.strip()]


def stable_fraction(*parts: object) -> float:
    """A deterministic number in [0, 1) from any parts: seeded choices without global state."""
    digest = hashlib.sha256("\x00".join(map(str, parts)).encode()).digest()
    return int.from_bytes(digest[:8], "big") / 2**64


def gold_key(line: str) -> str:
    return _LINE_PREFIX.sub("", line.rstrip("\r\n"), count=1).strip()


def issue_text(record: dict[str, Any]) -> str:
    """The PR description: the task itself, without mini-swe-agent's instruction boilerplate."""
    text = record["issue"]
    m = re.search(r"<pr_description>(.*?)</pr_description>", text, re.DOTALL)
    body = m.group(1) if m else text
    return re.sub(r"^\s*Consider the following PR description:\s*", "", body).strip()


def repo_of(record: dict[str, Any]) -> str:
    return str(record["id"]).split("__")[0]


@dataclass(frozen=True)
class ToolOutput:
    message_index: int  # index in the session's messages
    thought: str  # the assistant's words before its command
    command: str
    lines: tuple[str, ...]  # the output body's lines (inside <output>)


def tool_outputs(record: dict[str, Any]) -> list[ToolOutput]:
    """Every tool output of a session with the turn that asked for it."""
    out: list[ToolOutput] = []
    for (_, prev), (i, msg) in itertools.pairwise(enumerate(record["messages"])):
        if msg["role"] != "user" or "<returncode>" not in msg["content"] or prev["role"] != "assistant":
            continue
        cmd = _BASH.search(prev["content"])
        thought = _THOUGHT.search(prev["content"])
        body: list[str] = []
        for m in _BODY.finditer(msg["content"]):
            body.extend(split_lines(m.group(2).rstrip("\n") + "\n"))
        out.append(ToolOutput(i, (thought.group(1) if thought else prev["content"].split("```")[0]).strip(),
                              cmd.group(1).strip() if cmd else "", tuple(body)))
    return out


def terminal_log(record: dict[str, Any]) -> list[str]:
    """The session's tool outputs in order, each after the command that produced it."""
    out: list[str] = []
    for t in tool_outputs(record):
        out.append("$ " + (t.command.splitlines()[0] if t.command else "") + "\n")
        out.extend(t.lines)
    return out


# --- weak labels ------------------------------------------------------------------------------------------


def _patch_lines(patch: str) -> set[str]:
    return {ln[1:].strip() for ln in patch.splitlines()
            if ln[:1] in "-+" and not ln.startswith(("---", "+++")) and len(ln[1:].strip()) > 3}


def used_later(record: dict[str, Any], output: ToolOutput) -> list[bool]:
    """Per line of `output`: did the agent go on to use it? A line counts when its text is touched
    by the patch, when a later command or thought names a path or an identifier of four or more
    characters that the line defines or names (a `def`/`class`/assignment target, or the only
    identifiers of a grep hit), or when a later command asks for its line number."""
    later = [m for m in record["messages"][output.message_index + 1:] if m["role"] == "assistant"]
    said = "\n".join(m["content"] for m in later)
    named = set(_IDENT.findall(said))
    paths = {p.rsplit("/", 1)[-1] for p in _PATH.findall(said)}
    linenos = {int(n) for n in _LINENO.findall(said)}
    touched = _patch_lines(str(record.get("patch", "")))
    flags: list[bool] = []
    for line in output.lines:
        key = gold_key(line)
        prefix = re.match(r"\s*(\d+)\t", line) or re.match(r"(?:[\w./-]+:)?(\d+)[:-]", line)
        hit = bool(key) and key in touched
        if not hit and prefix is not None and int(prefix.group(1)) in linenos:
            hit = True
        if not hit:
            defined = re.match(r"\s*(?:async\s+)?(?:def|class)\s+(\w+)|\s*(\w+)\s*=[^=]", key)
            name = next((g for g in defined.groups() if g), None) if defined else None
            if name is not None and name in named:
                hit = True
            elif any(p in line for p in paths if len(p) > 4) and len(key) < 200:
                hit = bool(re.match(r"[\w./-]+:\d+", line))  # a grep hit in a file the agent opened
        flags.append(hit)
    return flags


# --- long outputs ---------------------------------------------------------------------------------------------


@dataclass
class LongOutput:
    """One long tool output as the gateway would receive it, with what a benchmark needs."""

    id: str
    repo: str
    kind: str  # "session_log" | "tool_output"
    lines: list[str]
    own: list[bool]  # per line: from this session (not padding)
    gold: frozenset[str]  # distinct gold lines present in the own lines (gold_key form)
    task: str
    thought: str  # the asking turn's words ("" for a session log)
    command: str  # the asking turn's command ("" for a session log)
    weak: list[bool]  # per line: used later by the agent (own lines only)
    # A tool output's session before it, as mini-swe-agent sent it: (role, content) messages, the
    # earlier outputs as user messages, ending with the asking turn.
    history: tuple[tuple[str, str], ...] = ()

    @property
    def text(self) -> str:
        return "".join(self.lines)


def _pad(own: list[str], donors: Iterable[list[str]], need_tokens: int, count: Count, depth: float
         ) -> tuple[list[str], list[bool]]:
    pad: list[str] = []
    got = 0
    for lines in donors:
        for line in lines:
            if got >= need_tokens:
                break
            pad.append(line)
            got += count(line)
        if got >= need_tokens:
            break
    cut = int(depth * len(pad))
    return pad[:cut] + own + pad[cut:], [False] * cut + [True] * len(own) + [False] * (len(pad) - cut)


def build_long_outputs(records: Sequence[dict[str, Any]], pool: Sequence[dict[str, Any]], count: Count,
                       target_tokens: int, cap_tokens: int, seed: int = 0, kinds: Sequence[str] = ("session_log", "tool_output"),
                       ) -> list[LongOutput]:
    """Long outputs for `records`, padded with logs of `pool` sessions of the same repository
    (other repositories only when those run out). A session log over `cap_tokens` is cut to a
    window around its first gold line; a tool output is used whole (the longest evidence-bearing
    one per session)."""
    logs = {r["id"]: terminal_log(r) for r in pool}
    out: list[LongOutput] = []
    for record in sorted(records, key=lambda r: r["id"]):
        rid, repo = record["id"], repo_of(record)
        golds = {g.strip() for g in record["gold_lines"] if g.strip()}
        same = sorted((p["id"] for p in pool if repo_of(p) == repo and p["id"] != rid))
        other = sorted((p["id"] for p in pool if repo_of(p) != repo))
        k = int(stable_fraction(seed, rid, "rotate") * max(len(same), 1))
        donors = [logs[d] for d in same[k:] + same[:k] + other]
        task = issue_text(record)
        if "session_log" in kinds:
            own = terminal_log(record)
            hits = [i for i, x in enumerate(own) if gold_key(x) in golds]
            if hits:
                toks = [count(x) for x in own]
                if sum(toks) > cap_tokens:
                    start = max(0, min(hits[0] - int(len(own) * stable_fraction(seed, rid, "depth") * 0.5), len(own)))
                    end, used = start, 0
                    while end < len(own) and used + toks[end] <= cap_tokens:
                        used += toks[end]
                        end += 1
                    own = own[start:end]
                present = frozenset(gold_key(x) for x in own) & golds
                lines, mine = _pad(own, donors, target_tokens - sum(count(x) for x in own), count,
                                   stable_fraction(seed, rid, "place"))
                if present:
                    out.append(LongOutput(f"{rid}#log", repo, "session_log", lines, mine, present, task, "", "",
                                          [False] * len(lines)))
        if "tool_output" in kinds:
            outputs = [t for t in tool_outputs(record) if any(gold_key(x) in golds for x in t.lines)]
            if outputs:
                best = max(outputs, key=lambda t: len(t.lines))
                own = list(best.lines)
                if sum(count(x) for x in own) <= cap_tokens:
                    present = frozenset(gold_key(x) for x in own) & golds
                    weak_own = used_later(record, best)
                    lines, mine = _pad(own, donors, target_tokens - sum(count(x) for x in own), count,
                                       stable_fraction(seed, rid, "place-output"))
                    weak = [False] * len(lines)
                    j = 0
                    for i, is_own in enumerate(mine):
                        if is_own:
                            weak[i] = weak_own[j]
                            j += 1
                    out.append(LongOutput(f"{rid}#out{best.message_index}", repo, "tool_output", lines, mine, present,
                                          task, best.thought, best.command, weak,
                                          tuple((m["role"], m["content"]) for m in record["messages"][: best.message_index])))
    return out


# How mini-swe-agent wraps an output it sends as a user message: the lines before the output's own.
WRAPPER_HEAD, WRAPPER_TAIL = "<returncode>0</returncode>\n<output>\n", "</output>"
WRAPPER_LINES = 2


def serving_messages(output: LongOutput, with_turn: bool = True, as_user: bool = False) -> list[Any]:
    """The conversation as the gateway would receive it, ending with the long output: the task,
    then (for a tool output, unless `with_turn` is False) the agent's asking turn as a tool call.
    `as_user`: a tool output as mini-swe-agent sends it, the whole session before it with every
    output a user message, the long one in its wrapper (WRAPPER_LINES lines before its own)."""
    from policies.conversation_types import Message, ToolCall

    if as_user:
        history = [Message(role, content) for role, content in output.history]  # type: ignore[arg-type]
        return [*history, Message("user", WRAPPER_HEAD + output.text + WRAPPER_TAIL)]
    tool = Message("tool", output.text, tool_call_id="call_1", name="bash")
    if output.kind != "tool_output" or not with_turn:
        return [Message("user", output.task), tool]
    turn = Message("assistant", output.thought, (ToolCall("call_1", "bash", json.dumps({"command": output.command})),))
    return [Message("user", output.task), turn, tool]


def gold_shown(output: LongOutput, visible: Sequence[tuple[int, int]]) -> float:
    """Share of the output's distinct gold lines that one of its own shown lines holds (padding does
    not count)."""
    shown = {gold_key(output.lines[i]) for a, b in visible for i in range(a, b + 1) if output.own[i]}
    return len(output.gold & shown) / len(output.gold)


def gold_units(output: LongOutput, units: Sequence[Any]) -> list[bool]:
    """Per unit (first..last line spans): does it show one of the session's own gold lines?"""
    return [any(output.own[i] and gold_key(output.lines[i]) in output.gold for i in range(u.first, u.last + 1))
            for u in units]
