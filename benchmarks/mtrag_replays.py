"""MTRAG conversations replayed as a RAG agent sends them: the first question, a `search` call, its
long tool output mixing the gold passages with on-topic distractors (other tasks' passages of the same
collection, seeded order), then the conversation's later turns. Read by the recall and RAG retention
sections.
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass
from typing import Any

DATA = "mtrag-un-reference.jsonl.zst"
CALL_ID = "call_search"


@dataclass
class Replay:
    id: str
    collection: str
    messages: list[Any]  # policies.conversation_types.Message, the client's view
    tool_index: int
    question_indices: list[int]  # later user turns, in order; the last has gold passages
    gold_spans: list[tuple[int, int]]  # 0-based inclusive line spans of the gold passages' text
    tokens: int
    question_tokens: list[int]


def _passage_block(k: int, doc_id: str, text: str) -> str:
    body = "\n".join(line.rstrip() for line in text.strip().splitlines() if line.strip())
    return f"[{k}] document {doc_id}\n{body}\n\n"


def build_replays(records: list[dict[str, Any]], count: Any, target: int, limit: int | None,
                  seed: int, distractors: list[dict[str, Any]] | None = None, need_followup: bool = True,
                  ) -> tuple[list[Replay], dict[str, int]]:
    """Replays of `records`; distractor passages come from `distractors` (default: the same
    records): passages are not labels, so a split's conversations may draw on every collection.
    Without `need_followup`, one-question conversations are kept too (no question indices)."""
    from policies.conversation_types import Message, ToolCall
    from policies.rendering import split_lines

    pool: dict[str, dict[str, str]] = {}  # collection -> document_id -> text
    for r in distractors if distractors is not None else records:
        for c in r.get("contexts") or []:
            pool.setdefault(r["Collection"], {}).setdefault(c["document_id"], c["text"])
    skipped = {"no gold passage": 0, "no follow-up": 0, "not enough distractors": 0}
    replays: list[Replay] = []
    for r in sorted(records, key=lambda r: r["task_id"]):
        if limit is not None and len(replays) >= limit:
            break
        turns = r["input"]
        gold = {c["document_id"]: c["text"] for c in r.get("contexts") or []}
        if not gold:
            skipped["no gold passage"] += 1
            continue
        users = [i for i, t in enumerate(turns) if t["speaker"] == "user"]
        if len(users) < (2 if need_followup else 1):
            skipped["no follow-up"] += 1
            continue
        rng = random.Random(f"{seed}:{r['task_id']}")
        others = [d for d in sorted(pool[r["Collection"]]) if d not in gold]
        rng.shuffle(others)
        chosen = list(gold)
        size = sum(count(t) for t in gold.values())
        for d in others:
            if size >= target:
                break
            chosen.append(d)
            size += count(pool[r["Collection"]][d])
        if size < target:
            skipped["not enough distractors"] += 1
            continue
        rng.shuffle(chosen)  # gold passages at seeded places among the distractors
        blocks: list[str] = []
        spans: list[tuple[int, int]] = []
        line_no = 0
        for k, d in enumerate(chosen, 1):
            block = _passage_block(k, d, gold.get(d) or pool[r["Collection"]][d])
            n = len(split_lines(block))
            if d in gold:
                spans.append((line_no + 1, line_no + n - 2))  # the text lines: header and blank excluded
            blocks.append(block)
            line_no += n
        text = "".join(blocks)
        first_q = turns[users[0]]["text"]
        messages = [
            Message("user", first_q),
            Message("assistant", "", (ToolCall(CALL_ID, "search", json.dumps({"query": first_q})),)),
            Message("tool", text, tool_call_id=CALL_ID, name="search"),
        ]
        question_indices: list[int] = []
        for t in turns[users[0] + 1 :]:
            if t["speaker"] == "user":
                question_indices.append(len(messages))
                messages.append(Message("user", t["text"]))
            else:
                messages.append(Message("assistant", t["text"]))
        if need_followup and (not question_indices or messages[-1].role != "user"):
            skipped["no follow-up"] += 1
            continue
        replays.append(Replay(r["task_id"], r["Collection"], messages, 2, question_indices, spans, count(text),
                              [count(messages[i].content) for i in question_indices]))
    return replays, skipped
