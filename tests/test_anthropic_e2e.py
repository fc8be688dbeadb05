"""The official anthropic SDK against a live gateway on the real Gemma 3 270M engine.
Model: Gemma 3 270M Q4_K_M, the fast base model (fixture `model_path`).
"""

from __future__ import annotations

import json
import re
import uuid
from typing import Any

import anthropic
import pytest

from sessions.identity import session_hash
from tests.conftest import Gateway

pytestmark = pytest.mark.engine

# Any name is accepted (one local model); a Claude name would make this SDK warn about deprecations.
MODEL = "pflash-local"
# This SDK release has no `temperature` argument; the wire field is still accepted and honoured.
T0: dict[str, Any] = {"temperature": 0}
SYSTEM = "You are a careful assistant that reviews Python code and explains what it does. " * 8
TOOL_ID = re.compile(r"^[a-zA-Z0-9_-]+$")
READ_TOOL = {
    "name": "read_file",
    "description": "Read a file from the repository",
    "input_schema": {"type": "object", "properties": {"path": {"type": "string"}}, "required": ["path"]},
}


def client(gateway: Gateway, headers: dict[str, str] | None = None) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=gateway.url, api_key="x", max_retries=0, default_headers=headers)


def prompt_size(usage: Any) -> int:
    """Anthropic splits the prompt into fresh input and cache reads; the model read both."""
    return int(usage.input_tokens + usage.cache_read_input_tokens)


def session_header(key: str) -> str:
    # X-PFlash-Session is the first 16 hex digits of sha256(tenant, key); the test gateway has no
    # API keys, so the tenant is "". Matching it proves which hint named the session.
    return session_hash("", key)[:16]


def test_create_non_stream(gateway: Gateway) -> None:
    msg = client(gateway).messages.create(
        model=MODEL, max_tokens=8, extra_body=T0, system="You are terse.",
        messages=[{"role": "user", "content": "Name a color."}],
    )
    assert msg.type == "message" and msg.role == "assistant" and msg.model == MODEL
    assert msg.id.startswith("msg_")
    assert msg.stop_reason in ("end_turn", "max_tokens")
    assert msg.content and all(block.type == "text" for block in msg.content)
    assert isinstance(msg.content[0].text, str)  # type: ignore[union-attr]
    usage = msg.usage
    assert usage.input_tokens > 5 and 0 < usage.output_tokens <= 8
    assert usage.cache_creation_input_tokens == 0
    assert usage.cache_read_input_tokens is not None and usage.cache_read_input_tokens >= 0


def test_stream_events_and_final_message(gateway: Gateway) -> None:
    with client(gateway).messages.stream(
        model=MODEL, max_tokens=12, extra_body=T0,
        system=[{"type": "text", "text": "You are terse.", "cache_control": {"type": "ephemeral"}}],
        messages=[{"role": "user", "content": [{"type": "text", "text": "Count: one, two,"}]}],
    ) as stream:
        # The SDK adds its own helper events ("text", "input_json"); keep the wire events.
        wire = [e for e in stream if e.type not in ("text", "input_json", "citation", "thinking", "signature")]
        final = stream.get_final_message()
    names = [e.type for e in wire]
    assert names[0] == "message_start" and names[-2:] == ["message_delta", "message_stop"]
    body = [n for n in names[1:-2] if n != "ping"]
    # Each content block opens, streams, closes: start (delta)* stop, repeated.
    assert re.fullmatch(r"(content_block_start( content_block_delta)* content_block_stop ?)*", " ".join(body) + " ")
    start = wire[0]
    assert start.message.usage.input_tokens > 5  # type: ignore[union-attr]  # real count, before any output
    deltas = "".join(e.delta.text for e in wire if e.type == "content_block_delta" and e.delta.type == "text_delta")  # type: ignore[union-attr]
    assert final.stop_reason in ("end_turn", "max_tokens")
    assert "".join(b.text for b in final.content if b.type == "text") == deltas
    assert 0 < final.usage.output_tokens <= 12
    assert prompt_size(final.usage) == start.message.usage.input_tokens  # type: ignore[union-attr]


def tool_history() -> list[dict[str, Any]]:
    return [
        {"role": "user", "content": "Show me setup.py"},
        {"role": "assistant", "content": [
            {"type": "text", "text": "I'll read it."},
            {"type": "tool_use", "id": "toolu_01A09q90qw90lq917835lq9", "name": "read_file", "input": {"path": "setup.py"}},
        ]},
        {"role": "user", "content": [
            {"type": "tool_result", "tool_use_id": "toolu_01A09q90qw90lq917835lq9",
             "content": [{"type": "text", "text": "from setuptools import setup\nsetup(name='demo', version='1.0')"}]},
        ]},
    ]


def test_tool_use_round_trip(gateway: Gateway) -> None:
    c = client(gateway)
    messages = tool_history()
    msg = c.messages.create(model=MODEL, max_tokens=16, extra_body=T0, tools=[READ_TOOL], messages=messages)
    assert msg.stop_reason in ("end_turn", "max_tokens", "tool_use")
    uses = [b for b in msg.content if b.type == "tool_use"]
    if uses:
        assert msg.stop_reason == "tool_use"
        assert len({u.id for u in uses}) == len(uses)
        for use in uses:
            assert TOOL_ID.match(use.id) and isinstance(use.input, dict)
    # The tool_use and tool_result reached the model: the prompt is longer than without them.
    without = c.messages.count_tokens(model=MODEL, tools=[READ_TOOL], messages=messages[:1])
    assert prompt_size(msg.usage) > without.input_tokens + 15
    # An error result is accepted too.
    errored = tool_history()
    errored[2]["content"][0]["is_error"] = True
    errored[2]["content"][0]["content"] = "ENOENT: no such file"
    again = c.messages.create(model=MODEL, max_tokens=4, extra_body=T0, tools=[READ_TOOL], messages=errored)
    assert again.stop_reason in ("end_turn", "max_tokens", "tool_use")


def test_count_tokens_matches_create(gateway: Gateway) -> None:
    c = client(gateway, {"X-Claude-Code-Session-Id": "count-" + uuid.uuid4().hex})
    body: dict[str, Any] = {
        "model": MODEL, "system": SYSTEM, "tools": [READ_TOOL],
        "messages": [{"role": "user", "content": "What does a typical setup.py contain?"}],
    }
    counted = c.messages.count_tokens(**body)
    msg = c.messages.create(**body, max_tokens=4, extra_body=T0)
    assert counted.input_tokens == prompt_size(msg.usage)


def overflow_system() -> str:
    return " ".join(f"word{i}" for i in range(3000))  # far past the 4096-token test context


def test_count_tokens_counts_an_overflowing_prompt(gateway: Gateway) -> None:
    counted = client(gateway).messages.count_tokens(
        model=MODEL, system=overflow_system(), messages=[{"role": "user", "content": "hi"}]
    )
    assert counted.input_tokens > 4096


@pytest.mark.parametrize("stream", [False, True])
def test_overflow_is_invalid_request_not_5xx(gateway: Gateway, stream: bool) -> None:
    with pytest.raises(anthropic.BadRequestError) as info:
        client(gateway).messages.create(
            model=MODEL, max_tokens=4, system=overflow_system(),
            messages=[{"role": "user", "content": "hi"}], stream=stream,
        )
    assert info.value.status_code == 400
    body = info.value.body
    assert isinstance(body, dict) and body["type"] == "error"
    assert body["error"]["type"] == "invalid_request_error"
    assert body["error"]["message"].startswith("prompt is too long")


def test_beta_path(gateway: Gateway) -> None:
    # Claude Code posts to /v1/messages?beta=true (this SDK's beta client no longer adds it).
    raw = client(gateway).beta.messages.with_raw_response.create(
        model=MODEL, max_tokens=4, extra_body=T0, messages=[{"role": "user", "content": "Hi"}],
        extra_query={"beta": "true"}, betas=["prompt-caching-2024-07-31"],
    )
    assert "beta=true" in str(raw.http_request.url)
    msg = raw.parse()
    assert msg.type == "message" and msg.stop_reason in ("end_turn", "max_tokens")


def two_turns(c: anthropic.Anthropic, metadata: dict[str, str] | None = None,
              system: Any = SYSTEM, system_2: Any = None) -> tuple[Any, Any]:
    """Two turns of one conversation; returns the raw responses (headers + parsed body)."""
    extra: dict[str, Any] = {"metadata": metadata} if metadata else {}
    history: list[dict[str, Any]] = [{"role": "user", "content": "What does `def add(a, b): return a + b` do?"}]
    first = c.messages.with_raw_response.create(
        model=MODEL, max_tokens=12, extra_body=T0, system=system, messages=history, **extra)
    reply = first.parse()
    history += [
        {"role": "assistant", "content": [b.model_dump(exclude_none=True) for b in reply.content] or "…"},
        {"role": "user", "content": "Is it pure?"},
    ]
    second = c.messages.with_raw_response.create(
        model=MODEL, max_tokens=4, extra_body=T0, system=system_2 or system, messages=history, **extra)
    return first, second


def assert_prefix_reused(first: Any, second: Any, key: str | None) -> None:
    one, two = first.parse(), second.parse()
    if key is not None:
        assert first.headers["X-PFlash-Session"] == second.headers["X-PFlash-Session"] == session_header(key)
    # Everything the first turn's prompt covered is reused, at least.
    assert two.usage.cache_read_input_tokens >= prompt_size(one.usage) - 1
    assert two.usage.input_tokens > 0  # the new question itself was read


def test_prefix_reuse_with_claude_code_session_header(gateway: Gateway) -> None:
    key = str(uuid.uuid4())
    first, second = two_turns(client(gateway, {"X-Claude-Code-Session-Id": key}))
    assert_prefix_reused(first, second, key)


def test_prefix_reuse_with_legacy_metadata_user_id(gateway: Gateway) -> None:
    key = str(uuid.uuid4())
    user_id = f"user_{'ab12' * 16}_account_{uuid.uuid4()}_session_{key}"
    first, second = two_turns(client(gateway), {"user_id": user_id})
    assert_prefix_reused(first, second, key)


def test_prefix_reuse_with_json_metadata_user_id(gateway: Gateway) -> None:
    key = str(uuid.uuid4())
    user_id = json.dumps({"device_id": "d" * 64, "account_uuid": str(uuid.uuid4()), "session_id": key})
    first, second = two_turns(client(gateway), {"user_id": user_id})
    assert_prefix_reused(first, second, key)


def billing_system(cch: str) -> list[dict[str, Any]]:
    return [
        {"type": "text", "text": f"x-anthropic-billing-header: cc_version=2.1.177.01c; cc_entrypoint=cli; cch={cch};"},
        {"type": "text", "text": "You are Claude Code, Anthropic's official CLI for Claude.\n" + SYSTEM,
         "cache_control": {"type": "ephemeral"}},
    ]


def test_rotating_billing_value_does_not_break_the_prefix(gateway: Gateway) -> None:
    # No session hint: the prefix-hash identity must survive the rotating value as well.
    first, second = two_turns(client(gateway), system=billing_system("36ee5"), system_2=billing_system("0aaa9"))
    assert first.headers["X-PFlash-Session"] == second.headers["X-PFlash-Session"]
    assert_prefix_reused(first, second, None)


# --------------------------------------------------------------------------------------------
# Replay of a realistic Claude Code request: compression of a long Read result, then prefix reuse
# --------------------------------------------------------------------------------------------

SERVICE_HEAD = '''"""Inventory service: stock levels, reservations and restocking for the shop backend."""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from datetime import datetime, timezone

from shop.db import Session, transaction
from shop.events import publish

log = logging.getLogger(__name__)


class InventoryError(Exception):
    """Base class for inventory failures surfaced to the API layer."""


class UnknownSku(InventoryError):
    def __init__(self, sku: str) -> None:
        super().__init__(f"unknown SKU: {sku}")
        self.sku = sku


class InsufficientStock(InventoryError):
    def __init__(self, sku: str, wanted: int, available: int) -> None:
        super().__init__(f"{sku}: wanted {wanted}, only {available} available")
        self.sku, self.wanted, self.available = sku, wanted, available


@dataclass
class StockLevel:
    sku: str
    on_hand: int
    reserved: int = 0
    updated_at: datetime = field(default_factory=lambda: datetime.now(timezone.utc))

    @property
    def available(self) -> int:
        return self.on_hand - self.reserved


def reserve_stock(session: Session, sku: str, quantity: int, order_id: str) -> StockLevel:
    """Hold `quantity` units of `sku` for an order; raises UnknownSku for a SKU we never stocked."""
    level = session.get(StockLevel, sku)
    if level is None:
        log.warning("reserve for missing SKU %s (order %s)", sku, order_id)
        raise UnknownSku(sku)
    if level.available < quantity:
        raise InsufficientStock(sku, quantity, level.available)
    with transaction(session):
        level.reserved += quantity
        level.updated_at = datetime.now(timezone.utc)
    publish("stock.reserved", {"sku": sku, "quantity": quantity, "order": order_id})
    return level


def release_stock(session: Session, sku: str, quantity: int, order_id: str) -> StockLevel:
    """Give back a reservation when an order is cancelled; never drops below zero."""
    level = session.get(StockLevel, sku)
    if level is None:
        raise UnknownSku(sku)
    with transaction(session):
        level.reserved = max(0, level.reserved - quantity)
        level.updated_at = datetime.now(timezone.utc)
    publish("stock.released", {"sku": sku, "quantity": quantity, "order": order_id})
    return level
'''

ENTITIES = ["warehouse", "supplier", "shipment", "price_rule", "purchase_order", "transfer"]


def service_source() -> str:
    """About 2,000 tokens of plausible Python: the head above plus one small CRUD block per entity."""
    blocks = [SERVICE_HEAD]
    for name in ENTITIES:
        cls = "".join(part.title() for part in name.split("_"))
        blocks.append(f'''
@dataclass
class {cls}:
    id: str
    name: str
    active: bool = True


def list_{name}s(session: Session, active_only: bool = True) -> list[{cls}]:
    """All {name.replace("_", " ")}s, newest first."""
    query = session.query({cls})
    if active_only:
        query = query.filter({cls}.active.is_(True))
    return query.order_by({cls}.id.desc()).all()


def deactivate_{name}(session: Session, {name}_id: str) -> None:
    item = session.get({cls}, {name}_id)
    if item is not None:
        with transaction(session):
            item.active = False
''')
    return "".join(blocks)


def numbered(text: str) -> str:
    # Claude Code's Read tool numbers lines as "<padded number>→<line>".
    return "\n".join(f"{i:>6}→{line}" for i, line in enumerate(text.splitlines(), start=1))


def cc_tool(name: str, summary: str, /, **properties: str) -> dict[str, Any]:
    return {
        "name": name,
        "description": summary,
        "input_schema": {
            "type": "object",
            # Real schemas also describe each property; left out to fit the 4096-token test context.
            "properties": {key: {"type": kind} for key, kind in properties.items()},
            "required": list(properties)[:1],
            "additionalProperties": False,
            "$schema": "http://json-schema.org/draft-07/schema#",
        },
    }


CC_TOOLS = [
    cc_tool("Task", "Launch a new agent to handle a complex, multi-step task.", description="string", prompt="string"),
    cc_tool("Bash", "Executes a bash command in a persistent shell session.", command="string", timeout="number"),
    cc_tool("Glob", "Fast file pattern matching that works with any codebase size.", pattern="string", path="string"),
    cc_tool("Grep", "A powerful search tool built on ripgrep.", pattern="string", path="string", glob="string"),
    cc_tool("LS", "Lists files and directories in a given path.", path="string"),
    cc_tool("ExitPlanMode", "Prompts the user to exit plan mode and start coding.", plan="string"),
    cc_tool("Read", "Reads a file from the local filesystem.", file_path="string", offset="number", limit="number"),
    cc_tool("Edit", "Performs exact string replacements in files.", file_path="string", old_string="string", new_string="string"),
    cc_tool("MultiEdit", "Makes multiple edits to a single file in one operation.", file_path="string", edits="array"),
    cc_tool("Write", "Writes a file to the local filesystem.", file_path="string", content="string"),
    cc_tool("NotebookEdit", "Replaces the contents of a cell in a Jupyter notebook.", notebook_path="string", new_source="string"),
    cc_tool("WebFetch", "Fetches content from a URL and processes it.", url="string", prompt="string"),
    cc_tool("TodoWrite", "Create and manage a structured task list for the session.", todos="array"),
    cc_tool("WebSearch", "Search the web and use the results to inform responses.", query="string"),
    cc_tool("BashOutput", "Retrieves output from a running background bash shell.", bash_id="string"),
]

CC_SYSTEM_TEXT = (
    "You are an interactive CLI tool that helps users with software engineering tasks. Use the "
    "instructions below and the tools available to you to assist the user.\n\n"
    "# Tone and style\nBe concise, direct, and to the point. Answer in fewer than 4 lines unless asked for detail.\n\n"
    "# Doing tasks\nUse the search tools to understand the codebase. Read files before editing them.\n\n"
    "<env>\nWorking directory: /home/dev/shop\nIs directory a git repo: Yes\nPlatform: linux\n"
    "Today's date: 2025-06-01\n</env>"
)


def claude_code_body(cch: str, messages: list[dict[str, Any]]) -> dict[str, Any]:
    return {
        "model": "claude-sonnet-4-5-20250929",
        "max_tokens": 16,
        "system": [
            {"type": "text", "text": f"x-anthropic-billing-header: cc_version=2.1.177.01c; cc_entrypoint=cli; cch={cch};"},
            {"type": "text", "text": "You are Claude Code, Anthropic's official CLI for Claude.",
             "cache_control": {"type": "ephemeral"}},
            {"type": "text", "text": CC_SYSTEM_TEXT, "cache_control": {"type": "ephemeral"}},
        ],
        "tools": CC_TOOLS,
        "messages": messages,
        "metadata": {"user_id": f"user_{'9f' * 32}_account_{uuid.uuid4()}_session_{uuid.uuid4()}"},
        "stream": False,
        "extra_body": T0,  # Claude Code's own wire field; this SDK has no argument for it
    }


@pytest.mark.filterwarnings("ignore:The model .* is deprecated:DeprecationWarning")  # Claude Code's real model name
def test_claude_code_replay_compresses_then_reuses_prefix(gateway: Gateway) -> None:
    c = client(gateway, {"X-Claude-Code-Session-Id": str(uuid.uuid4()), "anthropic-beta": "claude-code-20250219"})
    source = numbered(service_source())
    history: list[dict[str, Any]] = [
        {"role": "user", "content": [
            {"type": "text", "text": "<system-reminder>\nAs you answer the user's questions, you can use the "
                                     "following context: the project uses pytest.\n</system-reminder>"},
            {"type": "text", "text": "How does reserve_stock in src/shop/inventory/service.py handle an unknown SKU?"},
        ]},
        {"role": "assistant", "content": [
            {"type": "text", "text": "I'll read the inventory service."},
            {"type": "tool_use", "id": "toolu_01Xa9bQ3", "name": "Read",
             "input": {"file_path": "/home/dev/shop/src/shop/inventory/service.py"}},
        ]},
        {"role": "user", "content": [
            {"type": "tool_result", "tool_use_id": "toolu_01Xa9bQ3", "content": source,
             "cache_control": {"type": "ephemeral"}},
        ]},
    ]
    first = c.messages.with_raw_response.create(**claude_code_body("1c2d3", history))
    assert first.headers["X-PFlash-Compressed"] == "true", first.headers.get("X-PFlash-Compression-Reason")
    original = int(first.headers["X-PFlash-Original-Tokens"])
    assert original > 1800  # the Read result alone is far over the 300-token test threshold
    assert int(first.headers["X-PFlash-Kept-Tokens"]) < original * 0.6
    one = first.parse()
    assert one.stop_reason in ("end_turn", "max_tokens", "tool_use")

    # Next turn: Claude Code resends everything (the original Read result, a new cch) plus the reply.
    history += [
        {"role": "assistant", "content": [b.model_dump(exclude_none=True) for b in one.content] or "…"},
        {"role": "user", "content": "And what does release_stock do when the reservation is smaller?"},
    ]
    second = c.messages.with_raw_response.create(**claude_code_body("9e8f7", history))
    two = second.parse()
    assert second.headers["X-PFlash-Session"] == first.headers["X-PFlash-Session"]
    assert two.usage.cache_read_input_tokens >= prompt_size(one.usage) - 1
    # Only the new turn was prefilled: the reply, the question, and any excerpts recall brought back.
    assert two.usage.input_tokens < 200 + int(second.headers.get("X-PFlash-Recall-Tokens", "0"))
