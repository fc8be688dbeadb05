"""Prefix checkpoints through the real engine: a new session whose prompt shares the system prompt
and tools of an earlier one starts from that prefix's checkpoint, answers exactly as a cold prefill
would (Gemma 3: a sliding-window cache, which cannot be rolled back), in the same process and after
a restart; and a session killed while idle resumes from the state written after its turn.
Model: Gemma 3 270M (greedy; both engines).
"""

from __future__ import annotations

import asyncio
import hashlib
import secrets
import signal
import time
import uuid
from pathlib import Path
from typing import Any

import anthropic
import pytest

from engine.base import PrefillDone
from engine.batched_engine import BatchedLlamaEngine
from engine.llama_engine import LlamaEngine, LlamaOptions
from engine.prefix_checkpoints import CheckpointOptions
from policies.conversation_types import Message, SamplingParams, TextDelta, ToolCallDelta, ToolSpec
from sessions.checkpoints import CheckpointStore
from tests.conftest import Gateway
from tests.metrics_util import scrape, value

pytestmark = pytest.mark.engine

# Longer than Gemma's 512-token sliding window, so a restore that were not exact would show.
SYSTEM = "".join(f"Rule {i}: read the file before you change line {i * 3} of it, and say which tool you used.\n"
                 for i in range(60))
TOOLS = (ToolSpec("read_file", "Read a file of the repository.",
                  {"type": "object", "properties": {"path": {"type": "string"}}, "required": ["path"]}),)
CHECKPOINTS = CheckpointOptions(interval=0, min_tokens=64)


def make_engine(model_path: Path, store_root: Path, sequences: int, swa_full: bool = False) -> Any:
    options = LlamaOptions(model_path=model_path, model_sha256="test", n_ctx=4096, n_threads=2,
                           checkpoints=CHECKPOINTS, persist_idle=False, swa_full=swa_full)
    engine = LlamaEngine(options) if sequences == 1 else BatchedLlamaEngine(options, sequences=sequences)
    store = CheckpointStore(store_root, engine.fingerprint, 256 << 20, 256 << 20)
    engine.attach_checkpoints(store)
    return engine, store


async def ask(engine: Any, session: str, question: str) -> tuple[str, PrefillDone, int]:
    """The greedy answer (text and calls), the prefill's report, and where the system prompt and tools end."""
    prompt = await engine.prepare([Message("system", SYSTEM), Message("user", question)], TOOLS)
    text, prefill = [], None
    async for event in engine.stream(session, prompt, SamplingParams(max_tokens=24, temperature=0.0)):
        if isinstance(event, TextDelta):
            text.append(event.text)
        elif isinstance(event, ToolCallDelta):
            text.append(f"{event.call.name}({event.call.arguments})")
        elif isinstance(event, PrefillDone):
            prefill = event
    assert prefill is not None and prompt.checkpoint_marks
    return "".join(text), prefill, prompt.checkpoint_marks[0]


async def shared_prefix(engine: Any, question: str, other: str) -> int:
    """How many leading tokens the two questions' prompts share."""
    a, b = [(await engine.prepare([Message("system", SYSTEM), Message("user", q)], TOOLS)).tokens
            for q in (question, other)]
    return next(i for i, (x, y) in enumerate(zip(a, b)) if x != y)


@pytest.mark.parametrize("sequences", [1, 2])
def test_a_new_session_starts_from_the_shared_prefix_and_answers_as_a_cold_prefill(
        model_path: Path, tmp_path: Path, sequences: int) -> None:
    async def run() -> None:
        engine, store = make_engine(model_path, tmp_path / "warm", sequences)
        _first, cold, mark = await ask(engine, "session-a", "Which rule is about line 30?")
        assert cold.restored_from == "none" and cold.cached_tokens == 0
        assert mark > 1000  # the system prompt and tools: where every session of this agent diverges

        warm_text, warm, _ = await ask(engine, "session-b", "Which tool reads a file?")
        # From the first prompt's own checkpoint, cut back the few tokens past "Which" (within the window).
        common = await shared_prefix(engine, "Which rule is about line 30?", "Which tool reads a file?")
        assert mark < common < mark + 8
        assert (warm.restored_from, warm.checkpoint_tokens, warm.cached_tokens) == ("checkpoint", common, common)
        again_text, again, _ = await ask(engine, "session-c", "Which tool reads a file?")  # the whole prompt
        assert again.restored_from == "checkpoint" and again.cached_tokens == again.prompt_tokens - 1
        stats = engine.stats()
        assert stats["checkpoint_hits"] == 2 and stats["checkpoint_misses"] == 1
        await engine.close()
        store.flush()
        store.close()

        # The reference: a cold prefill of the same prompt, on an engine with nothing cached.
        fresh, fresh_store = make_engine(model_path, tmp_path / "cold", sequences)
        cold_text, reference, _ = await ask(fresh, "session-b", "Which tool reads a file?")
        assert reference.cached_tokens == 0
        await fresh.close()
        fresh_store.close()
        assert warm_text == cold_text and again_text == cold_text and cold_text.strip()

        # After a restart: the checkpoint comes from disk.
        restarted, restarted_store = make_engine(model_path, tmp_path / "warm", sequences)
        after_text, after, _ = await ask(restarted, "session-d", "Which tool reads a file?")
        assert after.restored_from == "checkpoint" and after.cached_tokens >= mark
        assert restarted.stats()["checkpoint_hits"] == 1 and restarted_store.stats()["checkpoint_hits_disk"] == 1
        await restarted.close()
        restarted_store.close()
        assert after_text == cold_text

    asyncio.run(run())


FILE = "".join(f"line {i}: total = total + values[{i}]  # accumulate\n" for i in range(40))


@pytest.mark.parametrize("sequences", [1, 2])
def test_a_prompt_that_diverges_inside_a_checkpoint_reuses_their_common_prefix_where_the_cache_can_be_cut(
        model_path: Path, instruct_model_path: Path, tmp_path: Path, sequences: int) -> None:
    """Qwen's cache (no sliding window) is cut back to the longest common prefix of any checkpoint,
    as llama-server reuses any prefix, and answers as a cold prefill. Gemma's sliding window keeps
    to checkpoints that are whole prefixes of the prompt, even with a full-size window cache."""
    # The first prompt goes on for more than Gemma may cut back (256 tokens) after they part.
    first = f"Here is sum.py:\n{FILE}Which line adds values[7]? And here is mean.py:\n{FILE.replace('total', 'mean')}"
    second = f"Here is sum.py:\n{FILE}What does the function return?"

    async def run(model: Path, root: Path, swa_full: bool = False) -> tuple[str, PrefillDone, int, int]:
        engine, store = make_engine(model, root, sequences, swa_full)
        _text, cold, mark = await ask(engine, "session-a", first)
        assert cold.restored_from == "none"
        text, warm, _ = await ask(engine, "session-b", second)
        common = await shared_prefix(engine, first, second)
        await engine.close()
        store.close()
        return text, warm, mark, common

    async def both() -> None:
        text, warm, mark, common = await run(instruct_model_path, tmp_path / "qwen")
        assert common > mark + 300  # the file is shared too: far past the system prompt's checkpoint
        assert (warm.restored_from, warm.checkpoint_tokens, warm.cached_tokens) == ("checkpoint", common, common)
        reference, reference_store = make_engine(instruct_model_path, tmp_path / "cold", sequences)
        cold_text, cold, _ = await ask(reference, "session-b", second)
        await reference.close()
        reference_store.close()
        assert cold.cached_tokens == 0 and text == cold_text

        _, window, window_mark, window_common = await run(model_path, tmp_path / "gemma", swa_full=True)
        assert window_common > window_mark + 300
        assert (window.restored_from, window.cached_tokens) == ("checkpoint", window_mark)

    asyncio.run(both())


def claude_like(server: Gateway, session: str, question: str) -> tuple[Any, dict[str, str]]:
    client = anthropic.Anthropic(base_url=server.url, api_key="unused", default_headers={"X-Session-Id": session})
    # Claude Code's first system block: its version suffix hashes part of the first user message
    # (so it differs between these sessions) and `cch` changes on every request.
    suffix = hashlib.sha256(question.encode()).hexdigest()[:3]
    billing = f"x-anthropic-billing-header: cc_version=2.1.328.{suffix}; cc_entrypoint=sdk-cli; cch={secrets.token_hex(3)[:5]};"
    raw = client.messages.with_raw_response.create(
        model="pflash-local", max_tokens=4,
        system=[{"type": "text", "text": billing}, {"type": "text", "text": SYSTEM}],
        tools=[{"name": "read_file", "description": "Read a file of the repository.",
                "input_schema": {"type": "object", "properties": {"path": {"type": "string"}}}}],
        messages=[{"role": "user", "content": question}])
    return raw.parse(), dict(raw.headers)


def test_a_second_agent_session_reads_the_shared_prefix_from_a_checkpoint_before_and_after_a_restart(
        start_gateway: Any, tmp_path: Path) -> None:
    flags = ("--checkpoint-min-tokens", "64")
    server = start_gateway(*flags)
    first, headers = claude_like(server, "cp-a-" + uuid.uuid4().hex, "List the files.")
    assert first.usage.cache_read_input_tokens == 0 and headers["x-pflash-restored-from"] == "none"
    shared_prompt = first.usage.input_tokens
    second, headers = claude_like(server, "cp-b-" + uuid.uuid4().hex, "Read calc.py and tell me what it prints.")
    assert headers["x-pflash-restored-from"] == "checkpoint"
    cached = second.usage.cache_read_input_tokens
    assert cached >= 0.8 * shared_prompt  # the system prompt and tools: most of the first prompt
    samples = scrape(server.url)
    assert value(samples, "pflash_checkpoint_turns_total", result="hit") == 1
    assert value(samples, "pflash_checkpoint_tokens_reused_total") == cached
    assert value(samples, "pflash_checkpoints", tier="ram") >= 1
    server.stop()

    restarted = start_gateway(*flags)
    assert value(scrape(restarted.url), "pflash_checkpoints", tier="disk") >= 1
    third, headers = claude_like(restarted, "cp-c-" + uuid.uuid4().hex, "What does calc.py do?")
    assert headers["x-pflash-restored-from"] == "checkpoint" and third.usage.cache_read_input_tokens >= cached
    overview = __import__("httpx").get(restarted.url + "/v1/overview", timeout=30).json()
    # The system prompt's checkpoint, or (Gemma may cut a restored state back half a batch) the
    # second session's prompt, which shares a few tokens more.
    assert any(c["origin"] in ("system", "prompt") and c["hits"] >= 1 for c in overview["checkpoints"]["list"])
    assert overview["totals"]["checkpoint_hits"] == 1


def test_a_session_killed_while_idle_resumes_from_the_state_written_after_its_turn(
        start_gateway: Any, tmp_path: Path) -> None:
    server = start_gateway("--checkpoint-min-tokens", "64")
    session = "killed-" + uuid.uuid4().hex
    client = anthropic.Anthropic(base_url=server.url, api_key="unused", default_headers={"X-Session-Id": session})
    history: list[dict[str, Any]] = [{"role": "user", "content": SYSTEM + "\nWhich rule is about line 30?"}]
    reply = client.messages.create(model="pflash-local", max_tokens=8, messages=history)
    first_prompt = reply.usage.input_tokens
    deadline = time.time() + 30  # the engine writes the state once it is idle, on the store's I/O thread
    while value(scrape(server.url), "pflash_store_writes_total", kind="kv") < 1 and time.time() < deadline:
        time.sleep(0.2)
    assert value(scrape(server.url), "pflash_states_persisted_total") >= 1
    server.stop(signal.SIGKILL)

    restarted = start_gateway("--checkpoint-min-tokens", "64")
    client = anthropic.Anthropic(base_url=restarted.url, api_key="unused", default_headers={"X-Session-Id": session})
    history += [{"role": "assistant", "content": "".join(b.text for b in reply.content if b.type == "text") or "ok"},
                {"role": "user", "content": "And line 33?"}]
    raw = client.messages.with_raw_response.create(model="pflash-local", max_tokens=4,
                                                   messages=history)
    assert raw.headers["x-pflash-restored-from"] == "disk"
    assert raw.parse().usage.cache_read_input_tokens >= first_prompt - 1
