"""The θ recall gate through the real engine: omitted lines come back when a follow-up needs them.
Model: Gemma 3 270M Q4_K_M, the fast base model (fixture `model_path`).
"""

from __future__ import annotations

import re
import uuid

import httpx
import pytest

from tests.conftest import Gateway
from tests.test_compression_e2e import assert_prefix_reused, post, python_module, tool_conversation, transcript

pytestmark = pytest.mark.engine

RECALL_HEADER = re.compile(r"^\[pflash: recalled lines? (\d+)(?:–(\d+))? of (.+)\]$")


def reply_text(response: httpx.Response) -> str:
    return response.json()["choices"][0]["message"]["content"] or ""


def test_follow_up_about_omitted_line_recalls_it(any_gateway: Gateway) -> None:
    gateway = any_gateway
    session = "recall-" + uuid.uuid4().hex
    output = python_module()
    original_lines = output.splitlines()
    messages = tool_conversation(output)
    first = post(gateway, session, messages)
    assert first.headers["X-PFlash-Compressed"] == "true"
    served = transcript(gateway, session)[3]["content"]
    assert "def helper_37(values):" not in served  # omitted by the first cut

    # A follow-up about a kept line: the gate stays shut.
    history = [*messages, {"role": "assistant", "content": reply_text(first)}]
    kept_q = [*history, {"role": "user", "content": "In compute_invoice_total, how is tax_rate applied to the subtotal?"}]
    kept_reply = post(gateway, session, kept_q)
    assert kept_reply.headers["X-PFlash-Recall"] == "false"
    assert transcript(gateway, session)[-1]["content"] == kept_q[-1]["content"]

    # A follow-up about an omitted function: its lines come back, labelled, at the top of the turn.
    history = [*kept_q, {"role": "assistant", "content": reply_text(kept_reply)}]
    question = "What does helper_37 multiply the values by (helper_37)?"
    follow = [*history, {"role": "user", "content": question}]
    recalled = post(gateway, session, follow)
    assert recalled.headers["X-PFlash-Recall"] == "true"
    assert int(recalled.headers["X-PFlash-Recall-Tokens"]) > 0
    turn = transcript(gateway, session)[-1]["content"]
    assert turn.endswith(question) and turn.startswith("[pflash: recalled ")
    headers = [(i, m) for i, line in enumerate(turn.splitlines()) if (m := RECALL_HEADER.match(line))]
    assert headers and all(m.group(3) == "the output of read_file(call_read1)" for _, m in headers)
    body = turn.splitlines()
    for at, match in headers:
        first_line, last_line = int(match.group(1)), int(match.group(2) or match.group(1))
        assert body[at + 1 : at + 2 + last_line - first_line] == original_lines[first_line - 1 : last_line]
    assert "def helper_37(values):" in turn
    # Everything before the new turn came from the cache.
    assert_prefix_reused(gateway, kept_reply, recalled)

    # The same conversation resent later renders byte-identically (the excerpt is history now).
    before = transcript(gateway, session)
    again = post(gateway, session, follow)
    assert transcript(gateway, session) == before
    assert "X-PFlash-Recall" not in again.headers  # not a new question: the gate does not run again
    if gateway.proxy is not None:
        bodies = gateway.proxy.chat_bodies()
        assert bodies[-1]["messages"] == bodies[-2]["messages"]
    else:
        assert again.json()["usage"]["prompt_tokens_details"]["cached_tokens"] >= again.json()["usage"]["prompt_tokens"] - 2


def test_theta_one_turns_recall_off(start_gateway) -> None:  # type: ignore[no-untyped-def]
    server = start_gateway("--recall-theta", "1.0")
    session = "no-recall-" + uuid.uuid4().hex
    messages = tool_conversation(python_module())
    first = post(server, session, messages)
    follow = [*messages, {"role": "assistant", "content": reply_text(first)},
              {"role": "user", "content": "What does helper_37 multiply the values by (helper_37)?"}]
    response = post(server, session, follow)
    assert response.headers["X-PFlash-Recall"] == "false"
    assert transcript(server, session)[-1]["content"] == follow[-1]["content"]


def test_a_tight_budget_cuts_shorter_units_and_recall_brings_them_back(start_gateway) -> None:  # type: ignore[no-untyped-def]
    """Under 20 % of a message kept, units are at most half `max_segment` (policies/segmentation.py);
    the gate re-derives those units from the kept-line map, so a follow-up about an omitted step
    brings back exact original lines."""
    from tests.test_compressor_units import long_functions

    server = start_gateway("--budget-curve", "300:0.15 100000:0.15")
    session = "tight-" + uuid.uuid4().hex
    output = long_functions(n=16)
    original_lines = output.splitlines()
    messages = tool_conversation(output, "Which step calls adjust_7?")
    first = post(server, session, messages)
    assert first.headers["X-PFlash-Compressed"] == "true"
    served = transcript(server, session)[3]["content"]
    assert "    rows = adjust_7(rows, 3)" in served and "    rows = checkpoint_12(rows)" not in served
    follow = [*messages, {"role": "assistant", "content": reply_text(first)},
              {"role": "user", "content": "What does checkpoint_12 do to the rows?"}]
    recalled = post(server, session, follow)
    assert recalled.headers["X-PFlash-Recall"] == "true"
    turn = transcript(server, session)[-1]["content"]
    headers = [(i, m) for i, line in enumerate(turn.splitlines()) if (m := RECALL_HEADER.match(line))]
    assert headers and "    rows = checkpoint_12(rows)" in turn
    body = turn.splitlines()
    for at, match in headers:
        first_line, last_line = int(match.group(1)), int(match.group(2) or match.group(1))
        assert body[at + 1 : at + 2 + last_line - first_line] == original_lines[first_line - 1 : last_line]


def test_a_follow_up_without_tools_recalls_an_omitted_line_in_its_own_conversation(gateway: Gateway) -> None:
    """Issue 51, bug 0: the first turn offered tools, the follow-up (an SDK script's last question)
    sends none. It is still this conversation's turn: the history is served compressed as before,
    and the recall gate brings the omitted function back."""
    session = "recall-notools-" + uuid.uuid4().hex
    tools = [{"type": "function", "function": {"name": "read_file", "description": "Read a file.",
                                               "parameters": {"type": "object", "properties": {"path": {"type": "string"}}}}}]
    messages = tool_conversation(python_module())

    def ask(turn_messages: list[dict], with_tools: bool) -> httpx.Response:
        body = {"model": "m", "messages": turn_messages, "max_tokens": 8, "temperature": 0,
                **({"tools": tools} if with_tools else {})}
        response = httpx.post(gateway.url + "/v1/chat/completions", json=body, headers={"X-Session-Id": session},
                              timeout=120)
        assert response.status_code == 200, response.text
        return response

    first = ask(messages, True)
    assert first.headers["X-PFlash-Compressed"] == "true"
    served = transcript(gateway, session)[3]["content"]
    question = "What does helper_37 multiply the values by (helper_37)?"
    follow = ask([*messages, {"role": "assistant", "content": reply_text(first)}, {"role": "user", "content": question}],
                 False)
    assert follow.headers["X-PFlash-Branch"] == first.headers["X-PFlash-Branch"]  # not a side request
    assert follow.headers["X-PFlash-Recall"] == "true"
    log = transcript(gateway, session)
    assert log[3]["content"] == served  # the history as it was served, compressed
    assert log[-1]["content"].startswith("[pflash: recalled ") and "def helper_37(values):" in log[-1]["content"]


def test_a_tight_budget_keeps_retrieved_prose_in_whole_passages(start_gateway) -> None:  # type: ignore[no-untyped-def]
    """Under 20 % of a message kept, code is cut into half-length units but prose is not
    (policies.segmentation.TIGHT_KINDS): a search output's passages are served whole or not at all."""
    server = start_gateway("--budget-curve", "300:0.15 100000:0.15")
    session = "tight-prose-" + uuid.uuid4().hex
    topics = ["harbour", "orchard", "railway", "library", "glacier", "vineyard", "observatory", "lighthouse",
              "quarry", "meadow", "bakery", "foundry", "canal", "theatre", "monastery", "brewery", "market", "bridge"]
    # About 55 tokens each: one unit at the test gateway's max_segment (64), two at half of it.
    passages = [[f"Document {i}: the {topic} survey.\n",
                 *(f"The {topic} committee recorded finding {j} of survey {i} in its annual report.\n"
                   for j in range(3))] for i, topic in enumerate(topics)]
    output = "\n".join("".join(p) for p in passages)
    messages = tool_conversation(output, "What did the survey find about the glacier committee?")
    assert post(server, session, messages).headers["X-PFlash-Compressed"] == "true"
    served = set(transcript(server, session)[3]["content"].splitlines())
    shown = [sum(line.rstrip("\n") in served for line in p) for p in passages]
    assert any(shown), "nothing of the output was kept"
    assert all(n in (0, len(p)) for n, p in zip(shown, passages)), f"a passage served in part: {shown}"
