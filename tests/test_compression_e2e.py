"""Compression of a new long tool output through the real engine (threshold lowered to 300).
Model: Gemma 3 270M Q4_K_M, the fast base model (fixture `model_path`).
"""

from __future__ import annotations

import asyncio
import json
import re
import subprocess
import sys
import uuid
from pathlib import Path

import httpx
import pytest

from benchmarks.crash_matrix import FIRST_QUESTION, python_module
from tests.conftest import ROOT, Gateway

pytestmark = pytest.mark.engine


def tool_conversation(output: str, question: str = FIRST_QUESTION) -> list[dict]:
    return [
        {"role": "system", "content": "You are a coding agent. " * 30},
        {"role": "user", "content": question},
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "call_read1", "type": "function", "function": {"name": "read_file", "arguments": '{"path": "inventory.py"}'}}]},
        {"role": "tool", "tool_call_id": "call_read1", "content": output},
    ]


def post(server: Gateway, session: str, messages: list[dict], max_tokens: int = 8) -> httpx.Response:
    body = {"model": "m", "messages": messages, "max_tokens": max_tokens, "temperature": 0}
    response = httpx.post(server.url + "/v1/chat/completions", json=body, headers={"X-Session-Id": session}, timeout=120)
    assert response.status_code == 200, response.text
    return response


def transcript(server: Gateway, session: str) -> list[dict]:
    return httpx.get(f"{server.url}/v1/sessions/{session}/transcript").json()["messages"]


def assert_prefix_reused(server: Gateway, earlier: httpx.Response, later: httpx.Response) -> None:
    """The later turn re-used everything the earlier one read: the in-process engine reports it
    as cached tokens; an upstream must have received the earlier messages byte for byte."""
    if server.proxy is None:
        cached = later.json()["usage"]["prompt_tokens_details"]["cached_tokens"]
        assert cached >= earlier.json()["usage"]["prompt_tokens"] - 1
        return
    bodies = server.proxy.chat_bodies()
    before, after = bodies[-2]["messages"], bodies[-1]["messages"]
    assert after[: len(before)] == before


def test_long_tool_output_is_compressed_and_prefix_reused(any_gateway: Gateway) -> None:
    gateway = any_gateway
    session = "compress-" + uuid.uuid4().hex
    output = python_module()
    messages = tool_conversation(output)
    first = post(gateway, session, messages)
    assert first.headers["X-PFlash-Compressed"] == "true"
    original, kept = int(first.headers["X-PFlash-Original-Tokens"]), int(first.headers["X-PFlash-Kept-Tokens"])
    assert kept < original * 0.6 and original > 300
    assert first.headers["X-PFlash-Scorer"]

    seen = transcript(gateway, session)
    assert [m["content"] for m in seen[:3]] == [m["content"] or "" for m in messages[:3]]  # history untouched
    served = seen[3]["content"]
    assert served.startswith("[pflash: showing ")
    assert "def compute_invoice_total(items, tax_rate):" in served  # the relevant unit survived
    original_lines = output.splitlines()
    for marker in re.findall(r"\[… lines? (\d+)(?:–(\d+))? omitted …\]", served):
        first_line, last_line = int(marker[0]), int(marker[1] or marker[0])
        assert 1 <= first_line <= last_line <= len(original_lines)
    kept_lines = [line for line in served.splitlines()[1:] if not line.startswith("[… line")]
    assert all(line in original_lines for line in kept_lines)  # only whole original lines

    # The agent resends the same original output with one more turn: the prefix is reused whole.
    answer = first.json()["choices"][0]["message"]["content"] or ""
    follow = [*messages, {"role": "assistant", "content": answer}, {"role": "user", "content": "Thanks. Anything else?"}]
    second = post(gateway, session, follow)
    assert second.headers.get("X-PFlash-Compressed") is None  # nothing new and long: no compression event
    assert_prefix_reused(gateway, first, second)
    if gateway.proxy is not None:  # the upstream read the rewritten output, not the original
        assert gateway.proxy.chat_bodies()[-1]["messages"][3]["content"] == served
    assert transcript(gateway, session)[3]["content"] == served  # byte-identical re-render


def test_short_output_and_history_are_untouched(any_gateway: Gateway) -> None:
    gateway = any_gateway
    session = "short-" + uuid.uuid4().hex
    short = "def f():\n    return 1\n"
    response = post(gateway, session, tool_conversation(short))
    assert response.headers.get("X-PFlash-Compressed") is None
    assert transcript(gateway, session)[3]["content"] == short

    # A long output that is already history (cold: never served by this session) stays whole.
    cold = "cold-" + uuid.uuid4().hex
    long_output = python_module()
    history = [*tool_conversation(long_output), {"role": "assistant", "content": "Noted."},
               {"role": "user", "content": "Now summarise."}]
    response = post(gateway, cold, history)
    assert response.headers.get("X-PFlash-Compressed") is None
    assert transcript(gateway, cold)[3]["content"] == long_output


def test_pasted_session_transcript_is_compressed_by_the_default_scorer(gateway: Gateway) -> None:
    """A user pastes a session log (several `$ ` commands: a transcript no call asked for, so the
    ranker's unasked weight set scores it): compressed through the real engine, the code the agent
    opened twice is kept, and only whole original lines are served."""
    blocks = python_module().split("\n\n")
    log = []
    for k, block in enumerate(blocks):
        log += [f"$ sed -n '{10 * k + 1},{10 * k + 9}p' inventory.py", block]
    opened_again = next(b for b in blocks if b.startswith("def compute_invoice_total"))
    log += ["$ nl -ba inventory.py | sed -n '230,233p'", opened_again]
    paste = "\n".join(log) + "\n\nWhy does the invoice total come out wrong with a zero tax_rate?\n"
    session = "paste-" + uuid.uuid4().hex
    response = post(gateway, session, [{"role": "user", "content": paste}])
    assert response.headers["X-PFlash-Compressed"] == "true"
    assert response.headers["X-PFlash-Scorer"] == "ranker"
    served = transcript(gateway, session)[0]["content"]
    assert "    subtotal = sum(item.price * item.quantity for item in items)" in served
    assert "Why does the invoice total come out wrong with a zero tax_rate?" in served  # the question is pinned
    original_lines = paste.splitlines()
    kept = [line for line in served.splitlines()[1:] if not line.startswith("[… line")]
    assert kept and all(line in original_lines for line in kept)


def report_session_log(last_command: str) -> str:
    """A pasted session log: twelve files shown alike, then `last_command`, a test run and the question."""
    lines = []
    for k in range(12):
        lines.append(f"$ cat report/part_{k}.py")
        for j in range(6):
            lines += [f"def figure_{k}_{j}(rows):", f"    return sum(r.amount_{j} for r in rows) * {k + j + 1}"]
    lines += [last_command, "$ python -m pytest -q tests/test_report.py", "4 passed in 0.31s", "",
              "The quarterly report shows the wrong figures. What did I change, and is it right?"]
    return "\n".join(lines) + "\n"


def test_the_view_of_a_file_the_log_edits_later_is_kept(gateway: Gateway) -> None:
    """Twelve file views alike; a later `sed -i` edits one of them. The question names none, so
    only the edit (the ranker's `edited_later`) sets that view apart: kept when the log edits the
    file, left out when a later command merely reads it."""
    served = {}
    for label, command in (("edited", "$ sed -i 's/amount_3/amount_4/' report/part_7.py"),
                           ("read", "$ grep -c amount_3 report/part_7.py")):
        session = f"edited-{label}-" + uuid.uuid4().hex
        response = post(gateway, session, [{"role": "user", "content": report_session_log(command)}])
        assert response.headers["X-PFlash-Compressed"] == "true" and response.headers["X-PFlash-Scorer"] == "ranker"
        served[label] = transcript(gateway, session)[0]["content"]
    assert "def figure_7_3(rows):" in served["edited"]
    assert "def figure_7_3(rows):" not in served["read"]


def test_scorer_failure_serves_whole_through_real_engine(tmp_path: Path, model_path: Path) -> None:
    from engine.llama_engine import LlamaEngine, LlamaOptions
    from gateway.compressor import CompressionSettings
    from gateway.turns import TurnService
    from policies.conversation_types import Conversation, Message, SamplingParams, SessionHints, ToolCall
    from sessions.registry import SessionRegistry
    from sessions.store import SessionStore

    class BrokenScorer:
        name = "broken"

        def score(self, units: list[str], request: str) -> list[float]:
            raise RuntimeError("drafter crashed")

    engine = LlamaEngine(LlamaOptions(model_path=model_path, model_sha256="x", n_ctx=4096))
    registry = SessionRegistry(SessionStore(tmp_path, engine.fingerprint), 10**8)
    from engine.scoring.bundle import single

    turns = TurnService(engine, registry, single(BrokenScorer()),
                        CompressionSettings(300, "300:0.3 100000:0.3", 8, 64, 128, 0.11))
    output = python_module()
    conv = Conversation(
        messages=(Message("user", "Where is the invoice total?"),
                  Message("assistant", "", (ToolCall("call_1", "read_file", "{}"),)),
                  Message("tool", output, tool_call_id="call_1")),
        params=SamplingParams(max_tokens=4, temperature=0.0),
        hints=SessionHints(x_session_id="broken"),
    )

    async def run() -> list[object]:
        turn = await turns.prepare(conv, "")
        assert turn.compression is not None and not turn.compression.compressed
        assert turn.compression.reason.startswith("scorer_failed")
        assert turn.prompt.messages[2].content == output  # served whole
        return [event async for event in turns.stream(turn)]

    events = asyncio.run(run())
    assert type(events[-1]).__name__ == "Finished"
    asyncio.run(engine.close())


def test_compress_cli_json(tmp_path: Path, model_path: Path) -> None:
    source = tmp_path / "inventory.py"
    source.write_text(python_module())
    request = tmp_path / "request.txt"
    request.write_text("Where is the invoice total computed?")
    result = subprocess.run(
        [sys.executable, "-m", "gateway.cli", "compress", "--input", str(source), "--request-file", str(request),
         "--keep-ratio", "0.3", "--json", "--model", str(model_path), "--store-dir", str(tmp_path / "store"),
         "--min-segment", "8", "--max-segment", "64"],
        cwd=ROOT, capture_output=True, text=True, timeout=120,
    )
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    assert report["compressed"] is True and report["scorer"] == "ranker"
    assert report["total_lines"] == len(python_module().splitlines())
    assert report["kept_tokens"] <= 0.3 * report["total_tokens"]
    lines = python_module().splitlines()
    invoice_line = lines.index("def compute_invoice_total(items, tax_rate):") + 1
    assert any(a <= invoice_line <= b for a, b in report["kept_ranges"])
    assert report["text"].startswith("[pflash: showing ")


def test_a_follow_up_search_is_ranked_with_the_question_before_it(gateway: Gateway) -> None:
    """"How can I open one?" names nothing; the question before it does (policies/request_finding.py).
    Many passages say "open"; the one about what the earlier question named must be kept."""
    offers = ["a brokerage account", "a checking account", "a savings account", "a credit union membership",
              "a business account", "a joint account", "a student account", "a travel card",
              "a money market account", "a certificate of deposit", "a custodial account", "a trading account"]
    passages = [f"How to open {what}: visit a branch or open it online with an ID and a first deposit.\n"
                f"Most banks let you open {what} in minutes; fees and minimums vary.\n" for what in offers]
    passages.insert(7, "A Roth IRA holds retirement savings paid in after tax; withdrawals in retirement are "
                       "tax free.\nEligibility for a Roth IRA depends on earned income below the yearly limit.\n")
    passages += [f"Branch hours for region {k}: weekdays nine to five, Saturdays until noon.\n" for k in range(8)]
    output = "\n".join(passages)
    messages = [
        {"role": "user", "content": "What is a Roth IRA and who is eligible for it?"},
        {"role": "assistant", "content": "It is a retirement account; let me know what else you need."},
        {"role": "user", "content": "How can I open one?"},
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "call_s1", "type": "function", "function": {"name": "search", "arguments": '{"query": "open one"}'}}]},
        {"role": "tool", "tool_call_id": "call_s1", "content": output},
    ]
    session = "follow-up-" + uuid.uuid4().hex
    response = post(gateway, session, messages)
    assert response.headers["X-PFlash-Compressed"] == "true"
    served = transcript(gateway, session)[4]["content"]
    assert "Eligibility for a Roth IRA depends on earned income" in served
    kept_offers = [what for what in offers if f"How to open {what}:" in served]
    assert len(kept_offers) < len(offers)  # compressed among passages that all say "open"


def test_a_mini_swe_agent_output_sent_as_user_is_ranked_by_the_agents_turn(gateway: Gateway) -> None:
    """mini-swe-agent sends outputs as user messages: the new one is ranked by the agent's command
    and intent, not by the previous output (which alone fills the request budget), and keeps its
    return-code wrapper. Through the official openai SDK."""
    import openai

    session = "mini-swe-" + uuid.uuid4().hex
    listing = "\n".join(f"{n}:def helper_{n % 40}(values):  # scaled norm of the values" for n in range(1, 160))
    messages = [
        {"role": "system", "content": "You are a helpful assistant that can interact multiple times with a computer "
                                      "shell to solve programming tasks."},
        {"role": "user", "content": "<pr_description>\nInvoices are wrong.\n</pr_description>"},
        {"role": "assistant", "content": "THOUGHT: Find the helpers.\n\n```bash\ngrep -n 'def helper' inventory.py\n```"},
        {"role": "user", "content": f"<returncode>0</returncode>\n<output>\n{listing}\n</output>"},
        {"role": "assistant", "content": "THOUGHT: I must read compute_invoice_total and how the tax rate is "
                                         "applied.\n\n```bash\ncat inventory.py\n```"},
        {"role": "user", "content": f"<returncode>0</returncode>\n<output>\n{python_module()}\n</output>"},
    ]
    client = openai.OpenAI(base_url=gateway.url + "/v1", api_key="unused", max_retries=0,
                           default_headers={"X-Session-Id": session})
    raw = client.chat.completions.with_raw_response.create(model="m", messages=messages, max_tokens=4, temperature=0)
    assert raw.headers["X-PFlash-Compressed"] == "true"
    seen = transcript(gateway, session)
    assert [m["kind"] for m in seen] == ["system", "user", "assistant", "tool_output", "assistant", "tool_output"]
    served = seen[-1]["content"].splitlines()
    assert served[1:3] == ["<returncode>0</returncode>", "<output>"]  # after the note: the wrapper, pinned
    assert "def compute_invoice_total(items, tax_rate):" in served
