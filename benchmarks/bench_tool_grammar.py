"""What the lazy tool-call grammar costs a prose answer: decode speed with the grammar (tool_choice
"auto", parallel calls: the shape agents send) against the same turn without it, on both models."""

from __future__ import annotations

import asyncio
import statistics
import time
from dataclasses import replace
from pathlib import Path

from benchmarks.common import BenchContext, Section, md_table, spread
from engine.constraints import output_constraint
from engine.llama_engine import LlamaEngine, LlamaOptions
from policies.conversation_types import Finished, Message, SamplingParams, TextDelta, ToolSpec

TITLE = "Lazy tool-call grammar: the cost on a prose answer"
GOAL = 0.10  # issue 52: within 10 % of no grammar
TOOLS = (
    ToolSpec("Read", "Read a file.", {"type": "object", "properties": {"file_path": {"type": "string"},
                                                                       "offset": {"type": "integer"}},
                                      "required": ["file_path"]}),
    ToolSpec("Bash", "Run a shell command.", {"type": "object", "properties": {"command": {"type": "string"},
                                                                              "timeout": {"type": "number"}},
                                              "required": ["command"]}),
    ToolSpec("Grep", "Search files.", {"type": "object", "properties": {"pattern": {"type": "string"},
                                                                        "path": {"type": "string"}},
                                       "required": ["pattern"]}),
)
QUESTION = "Without using any tool, explain in a few paragraphs how a hash map resolves collisions."
TOKENS = 128


async def decode_rates(path: Path, reps: int) -> tuple[list[float], list[float], int]:
    """Tokens per second of the answer after its first token, with and without the grammar, interleaved."""
    engine = LlamaEngine(LlamaOptions(model_path=path, model_sha256="bench", n_ctx=4096, persist_idle=False))
    prompt = await engine.prepare([Message("user", QUESTION)], TOOLS, output_constraint(None, True, None, TOOLS))
    assert prompt.grammar is not None
    rates: dict[bool, list[float]] = {True: [], False: []}
    produced = 0
    for rep in range(reps):
        for with_grammar in ((True, False) if rep % 2 == 0 else (False, True)):
            turn = prompt if with_grammar else replace(prompt, grammar=None)
            first, count = None, 0
            async for event in engine.stream("bench", turn, SamplingParams(max_tokens=TOKENS, temperature=0.0)):
                if isinstance(event, TextDelta):
                    first = first or time.perf_counter()
                elif isinstance(event, Finished):
                    count = event.usage.completion_tokens
            if first is not None and count > 1:
                rates[with_grammar].append((count - 1) / (time.perf_counter() - first))
            produced = max(produced, count)
    await engine.close()
    return rates[True], rates[False], produced


def run(ctx: BenchContext) -> Section:
    if ctx.model_path is None:
        return Section(TITLE, f"Skipped: no model ({ctx.model_error}).")
    from engine.models.parts import QWEN_CODER_05B, assemble

    reps = 2 if ctx.quick else 6
    models = [("Gemma 3 270M", ctx.model_path), ("Qwen2.5-Coder-0.5B", assemble(QWEN_CODER_05B, ctx.cache_dir / "models"))]
    rows, verdicts = [], []
    for name, path in ctx.progress(models, "grammar cost"):
        with_grammar, without, produced = asyncio.run(decode_rates(path, reps))
        ratio = statistics.median(with_grammar) / statistics.median(without)
        rows.append([name, produced, spread(without, 1), spread(with_grammar, 1), f"{ratio:.3f}"])
        verdicts.append(f"{name}: {1 - ratio:+.1%} slower with the grammar "
                        f"({'within' if ratio >= 1 - GOAL else 'outside'} the 10 % goal)")
    text = ("A prose question with three tools offered under `tool_choice` auto and parallel calls (the lazy "
            "grammar: free text until the call markup opens), greedy, up to "
            f"{TOKENS} tokens, the single-sequence engine; decode rate after the first token in tokens per "
            f"second, median (min–max) of {reps} interleaved runs each way.\n\n"
            + md_table(["model", "answer tokens", "without grammar tok/s", "with grammar tok/s", "ratio"], rows)
            + "\n" + "".join(f"- {v}\n" for v in verdicts))
    return Section(TITLE, text, [], model="Gemma 3 270M Q4_K_M and Qwen2.5-Coder-0.5B-Instruct Q4_K_M")
