"""Upstream mode in front of llama.cpp's own llama-server (build 11434, built once by
scripts/build_llama_server.sh, about 7 minutes the first time): the gateway sends its tool-call
grammar, so a call names an offered tool with arguments its schema accepts, as in process.
Model: Qwen2.5-Coder-0.5B-Instruct (the served default; its template renders the tools).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import jsonschema
import openai
import pytest

from benchmarks.capture_replay import LlamaServer, llama_server_binary
from tests.conftest import ROOT, Gateway
from tests.metrics_util import scrape, value

pytestmark = pytest.mark.engine

# A path the model would not write by itself: asked about calc.py it writes "calc.py", which this
# schema refuses; only a grammar makes the call valid.
READ = {"type": "function", "function": {
    "name": "read_file", "description": "Read a file of the repository.",
    "parameters": {"type": "object", "properties": {"path": {"type": "string", "enum": ["src/calc.py", "README.md"]}},
                   "required": ["path"], "additionalProperties": False}}}
ASK = [{"role": "user", "content": "What does calc.py print? Read it first with the read_file tool."}]


@pytest.fixture(scope="module")
def real_llama_server(instruct_model_path: Path) -> Iterator[str]:
    binary = llama_server_binary(ROOT)
    assert binary is not None, "scripts/build_llama_server.sh failed: see its output"
    server = LlamaServer(binary, instruct_model_path, 4096, instruct_model_path.parent / "llama-server-11434.log")
    yield server.url
    server.stop()


def answers(gateway: Gateway, seeds: range) -> tuple[list[tuple[str, str, str]], list[str]]:
    """The tool calls the gateway returns, one answer per seed, as (finish_reason, name, arguments),
    and the answers' texts."""
    client = openai.OpenAI(base_url=gateway.url + "/v1", api_key="x", max_retries=0)
    calls, texts = [], []
    for seed in seeds:
        response = client.chat.completions.create(model="m", messages=ASK, tools=[READ], temperature=0.7, seed=seed,
                                                  max_tokens=96)  # type: ignore[arg-type]
        choice = response.choices[0]
        calls += [(choice.finish_reason, c.function.name, c.function.arguments)  # type: ignore[union-attr]
                  for c in choice.message.tool_calls or []]
        texts.append(choice.message.content or "")
    return calls, texts


def valid(name: str, arguments: str) -> bool:
    try:
        jsonschema.validate(json.loads(arguments), READ["function"]["parameters"])  # type: ignore[index]
    except (ValueError, jsonschema.ValidationError):
        return False
    return name == "read_file"


def test_the_grammar_goes_to_llama_server_and_every_call_it_returns_is_valid(
        start_gateway, real_llama_server: str, instruct_model_path: Path) -> None:  # type: ignore[no-untyped-def]
    upstream = ("--engine", "upstream", "--upstream-url", real_llama_server + "/v1", "--tokenizer",
                str(instruct_model_path), "--upstream-n-ctx", "4096")
    seeds = range(4)
    server = start_gateway(*upstream)
    constrained, _ = answers(server, seeds)
    assert value(scrape(server.url), "pflash_upstream_events_total", event="grammar_requests") == len(seeds)
    assert len(constrained) >= 2 and all(finish == "tool_calls" and valid(name, args)
                                         for finish, name, args in constrained)
    assert server.stop() == 0

    # The same requests without the grammar: the model names the file as the tool ("calc.py"),
    # llama-server passes it on as text, and the client gets no call it can run.
    loose = start_gateway(*upstream, "--no-upstream-tool-grammar", store=server.store.parent / "loose")
    unconstrained, texts = answers(loose, seeds)
    assert value(scrape(loose.url), "pflash_upstream_events_total", event="grammar_requests") == 0
    assert not any(valid(name, args) for _finish, name, args in unconstrained)
    assert any('"name": "calc.py"' in text for text in texts)
