"""Claude Code's own request through the real engine: under tool_choice "auto" every tool call the
answer holds names a tool the request offered, with arguments its schema accepts, whatever the
sampler draws; without the grammar the same draws call tools that do not exist.
Model: Qwen2.5-Coder-0.5B-Instruct (the served default), the captured request `claude/001.json`
with the task of the first real run ("What does calc.py print? Read it first."), Claude Code's
temperature 1, 20 seeds each way. The 13K-token prompt is prefilled once (the turns share it).
"""

from __future__ import annotations

import asyncio
import json
from dataclasses import replace
from pathlib import Path
from typing import Any

import jsonschema
import pytest

from engine.constraints import output_constraint
from engine.llama_engine import LlamaEngine, LlamaOptions
from gateway.api.messages import parse_request
from policies.conversation_types import SamplingParams, ToolCallDelta

# 40 turns of up to 128 tokens on a 13K-token prompt: 605 s alone on a 2-core Xeon, past the suite's
# 600 s default.
pytestmark = [pytest.mark.engine, pytest.mark.instruct, pytest.mark.timeout(1200)]

CAPTURE = Path(__file__).resolve().parents[2] / "shared" / "captures" / "claude" / "001.json"
TASK = "What does calc.py print? Read it first."
SEEDS = range(20)


def claude_code_request() -> dict[str, Any]:
    body = json.loads(CAPTURE.read_text(encoding="utf-8"))["body"]
    for message in body["messages"]:
        for block in message["content"] if isinstance(message["content"], list) else []:
            if block.get("text") == "Use a sub-agent to list the files here, then tell me.":
                block["text"] = TASK
    return body


def judged(calls: list[tuple[str, str]], schemas: dict[str, dict[str, Any]]) -> tuple[int, list[str]]:
    """(valid calls, what was wrong with the others)"""
    valid, wrong = 0, []
    for name, arguments in calls:
        if name not in schemas:
            wrong.append(f"{name}: not offered")
            continue
        try:
            jsonschema.validate(json.loads(arguments), schemas[name])
            valid += 1
        except (ValueError, jsonschema.ValidationError) as exc:
            wrong.append(f"{name}: {str(exc).splitlines()[0][:120]}")
    return valid, wrong


@pytest.mark.skipif(not CAPTURE.is_file(), reason="../shared/captures is not beside this checkout")
def test_every_call_names_an_offered_tool_with_valid_arguments_and_without_the_grammar_not(
        instruct_model_path: Path) -> None:
    conversation = parse_request(claude_code_request(), {})
    schemas = {t.name: t.parameters for t in conversation.tools}
    constraint = output_constraint(conversation.tool_choice, conversation.parallel_tool_calls,
                                   conversation.response_format, conversation.tools)

    async def run() -> tuple[list[tuple[str, str]], list[tuple[str, str]]]:
        engine = LlamaEngine(LlamaOptions(model_path=instruct_model_path, model_sha256="test", n_ctx=16384,
                                          n_threads=2))
        prompt = await engine.prepare(conversation.messages, conversation.tools, constraint)
        assert prompt.grammar is not None and not prompt.grammar.loose
        found: dict[bool, list[tuple[str, str]]] = {True: [], False: []}
        for seed in SEEDS:
            for with_grammar in (True, False):
                turn = prompt if with_grammar else replace(prompt, grammar=None)
                # A call held to an offered tool's schema runs longer than a made-up one (the model
                # copies an Agent description into its arguments), and a call the limit cuts is no call.
                params = SamplingParams(max_tokens=128, temperature=1.0, seed=seed)
                async for event in engine.stream("claude", turn, params):
                    if isinstance(event, ToolCallDelta):
                        found[with_grammar].append((event.call.name, event.call.arguments))
        await engine.close()
        return found[True], found[False]

    constrained, free = asyncio.run(run())
    valid, wrong = judged(constrained, schemas)
    print(f"\nwith the grammar: {len(constrained)} calls, all valid; without: {len(free)} calls, "
          f"wrong: {judged(free, schemas)[1]}")
    assert not wrong and valid == len(constrained) >= 1
    assert judged(free, schemas)[1], "without the grammar every call was valid: this test could not fail"
