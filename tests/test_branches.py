"""Conversations inside one session (policies/branches.py, gateway/branches.py), without a model:
the pure choice, then the turn service and the HTTP app on a fake engine."""

from __future__ import annotations

import asyncio
import tempfile
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from aiohttp.test_utils import TestClient, TestServer
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from engine.base import SavedState
from engine.scoring.bundle import bundle_of
from engine.scoring.scorers import Bm25Scorer
from gateway.app import create_app
from gateway.compressor import CompressionSettings
from gateway.config import Settings
from gateway.turns import TurnService
from policies.branches import BranchView, choose_branch, is_side_request, message_digest, request_digests
from policies.conversation_types import (
    Attachment,
    Conversation,
    Finished,
    Message,
    SessionHints,
    ToolCall,
    ToolSpec,
)
from sessions.identity import resolve_session
from sessions.registry import SessionRegistry
from sessions.store import SessionStore
from tests.fake_engine import FakeEngine

# --- the pure choice ----------------------------------------------------------------------------


def view(branch_id: str, digests: Sequence[str], hint: str = "", side: bool = False, last_used: float = 0.0,
         busy: bool = False) -> BranchView:
    return BranchView(branch_id, hint, side, tuple(digests), last_used, busy)


def test_a_request_continues_the_branch_whose_last_request_it_extends_furthest() -> None:
    branches = [view("short", "ab"), view("long", "abc"), view("other", "xy")]
    choice = choose_branch(tuple("abcd"), "", False, branches)
    assert (choice.branch_id, choice.common, choice.extends) == ("long", 3, True)
    # The same request again (a retry) still continues it.
    assert choose_branch(tuple("abc"), "", False, branches).branch_id == "long"


def test_an_agent_id_splits_branches_up_front() -> None:
    branches = [view("main", "ab"), view("sub", "xy", hint="agent:a1")]
    assert choose_branch(tuple("abc"), "agent:a1", False, branches).branch_id == "sub"  # same agent, other prefix
    assert choose_branch(tuple("abc"), "agent:a2", False, branches).branch_id is None  # a new sub-agent
    assert choose_branch(tuple("xyz"), "", False, branches).branch_id is None  # main never joins a sub-agent


def test_a_side_request_never_joins_the_agents_own_turns() -> None:
    branches = [view("main", "ab"), view("title", "ac", side=True)]
    assert choose_branch(tuple("abc"), "", True, branches).branch_id == "title"  # shares "a" with the title only
    assert choose_branch(tuple("zz"), "", True, [view("main", "ab")]).branch_id is None


def test_an_edited_conversation_joins_its_branch_unless_that_branch_is_busy() -> None:
    edited = tuple("abX")
    assert choose_branch(edited, "", False, [view("main", "abc")]) .branch_id == "main"
    assert choose_branch(edited, "", False, [view("main", "abc", busy=True)]).branch_id is None
    # Extending a busy branch waits for it instead (turns of one branch are serialised).
    assert choose_branch(tuple("abcd"), "", False, [view("main", "abc", busy=True)]).branch_id == "main"
    # Nothing in common (another system prompt or tool list): another conversation.
    assert choose_branch(tuple("zz"), "", False, [view("main", "abc")]).branch_id is None


def test_side_requests_are_tool_less_one_shots_in_agent_sessions() -> None:
    assert is_side_request(has_tools=False, structured_output=True, session_uses_tools=False)  # a title
    assert is_side_request(has_tools=False, structured_output=False, session_uses_tools=True)  # the classifier
    assert not is_side_request(has_tools=False, structured_output=False, session_uses_tools=False)  # a plain chat
    assert not is_side_request(has_tools=True, structured_output=True, session_uses_tools=True)


def test_digests_see_everything_that_reaches_the_prompt() -> None:
    base = Message("user", "hi")
    assert message_digest(base) == message_digest(Message("user", "hi"))
    assert len({message_digest(m) for m in (base, Message("system", "hi"), Message("user", "hi "),
                                            Message("tool", "hi", tool_call_id="c"))}) == 4
    tools = (ToolSpec("Read", "", {"type": "object"}),)
    assert request_digests(tools, [base])[1:] == request_digests((), [base])[1:]
    assert request_digests(tools, [base])[0] != request_digests((), [base])[0]


@given(st.lists(st.lists(st.sampled_from("abc"), max_size=5), max_size=5), st.lists(st.sampled_from("abc"), max_size=6))
def test_the_choice_is_a_branch_of_the_request_kind_that_shares_the_most(branches: list[list[str]],
                                                                         request: list[str]) -> None:
    views = [view(f"b{i}", d, last_used=i) for i, d in enumerate(branches)]
    choice = choose_branch(tuple(request), "", False, views)
    extended = [v for v in views if v.digests and tuple(request[: len(v.digests)]) == v.digests]
    if extended:
        assert choice.extends and choice.common == max(len(v.digests) for v in extended)
    elif choice.branch_id is not None:
        chosen = next(v for v in views if v.branch_id == choice.branch_id)
        carried = len(chosen.digests) > 1 and tuple(request[1 : len(chosen.digests)]) == chosen.digests[1:]
        assert choice.common > 1 or carried or not chosen.digests


# --- the turn service on a fake engine ------------------------------------------------------------

READ = (ToolSpec("Read", "Read a file.", {"type": "object"}),)
LOG = "\n".join([f"INFO step {i} finished building module number {i} without trouble" for i in range(30)]
                + ["ERROR disk quota exceeded while writing the cache of module 7"]
                + [f"INFO cleanup {i} removed temporary files of module {i}" for i in range(30)])


def scripted(system: str, questions: Sequence[str], hint: SessionHints, tools: tuple[ToolSpec, ...] = READ,
             structured: bool = False) -> list[Conversation]:
    """A conversation's requests in order, each the whole history so far (as clients send them):
    a question, a tool call, the long log as its result, then the next question."""
    history: list[Message] = [Message("system", system)]
    out: list[Conversation] = []
    for i, question in enumerate(questions):
        history.append(Message("user", question))
        out.append(Conversation(tuple(history), tools, hints=hint,
                                response_format={"type": "json_object"} if structured else None))
        if tools:
            history += [Message("assistant", "", (ToolCall(f"c{i}", "Read", "{}"),)),
                        Message("tool", f"{LOG}\nrun {i}", tool_call_id=f"c{i}")]
            out.append(Conversation(tuple(history), tools, hints=hint))
        history.append(Message("assistant", f"answer {i}"))
    return out


def conversations() -> dict[str, list[Conversation]]:
    return {
        "main": scripted("You are the main agent.", ["Why did the build fail?", "Which module was it?"],
                         SessionHints(x_session_id="s")),
        "sub": scripted("You are a sub-agent.", ["List the cleanup steps.", "How many were there?"],
                        SessionHints(x_session_id="s", agent_id="a1")),
        "title": scripted("Name the session.", ["Why did the build fail?"], SessionHints(x_session_id="s"), (), True),
    }


def service(store: Path, ram_budget: int = 1 << 30) -> tuple[TurnService, FakeEngine, SessionRegistry]:
    engine = FakeEngine()
    registry = SessionRegistry(SessionStore(store, engine.fingerprint, 1, 1 << 30), ram_budget, "off")
    engine.attach_tier(registry)
    compression = CompressionSettings(threshold=60, budget_curve="60:0.3 100000:0.3", min_segment=2, max_segment=8,
                                      request_tokens=64, fallback_spread=0.0)
    return TurnService(engine, registry, bundle_of(Bm25Scorer()), compression), engine, registry


async def run_turn(turns: TurnService, conv: Conversation) -> tuple[str, Finished]:
    turn = await turns.prepare(conv, "")
    finished = None
    async for event in turns.stream(turn):
        if isinstance(event, Finished):
            finished = event
    assert finished is not None
    return turn.prompt.text or "", finished


def served_in_order(order: Sequence[str]) -> tuple[dict[tuple[str, int], str], dict[tuple[str, int], Finished], dict[str, float]]:
    """Serve the scripted conversations' requests in `order` (names; each takes its next request)."""
    scripts = conversations()
    with tempfile.TemporaryDirectory() as tmp:
        turns, _engine, registry = service(Path(tmp))
        steps = {name: 0 for name in scripts}
        texts: dict[tuple[str, int], str] = {}
        usage: dict[tuple[str, int], Finished] = {}

        async def play() -> None:
            for name in order:
                step = steps[name]
                texts[name, step], usage[name, step] = await run_turn(turns, scripts[name][step])
                steps[name] += 1

        asyncio.run(play())
        registry.close()
        return texts, usage, turns.stats()


def solo(name: str) -> dict[tuple[str, int], str]:
    return served_in_order([name] * len(conversations()[name]))[0]


SOLO = {name: solo(name) for name in conversations()}


@st.composite
def interleavings(draw: st.DrawFn) -> list[str]:
    left = {name: len(requests) for name, requests in conversations().items()}
    order: list[str] = []
    while any(left.values()):
        name = draw(st.sampled_from(sorted(n for n, k in left.items() if k)))
        order.append(name)
        left[name] -= 1
    return order


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(order=interleavings())
def test_branch_choice_never_changes_the_bytes_served_for_a_conversation(order: list[str]) -> None:
    """However the main agent, a sub-agent and a side request interleave under one session id,
    each request is served the bytes it gets when its conversation runs alone (its own kept-line
    maps: the sub-agent's copy of the same log is cut for its own question), and each turn finds
    its conversation's whole last prompt cached."""
    texts, usage, stats = served_in_order(order)
    for (name, step), text in texts.items():
        assert text == SOLO[name][name, step], (name, step)
        if step > 0:
            assert usage[name, step].usage.cached_tokens >= usage[name, step - 1].usage.prompt_tokens
    assert stats.get("compressions", 0) == 4  # each log, once per conversation that read it
    assert not any(k.startswith("branch_prefix_lost") for k in stats)
    assert stats["branches_opened:main"] == 1 and stats["branches_opened:agent"] == 1
    assert stats["branches_opened:side"] == 1 and stats["side_requests"] == 1


# --- the HTTP app on a fake engine -------------------------------------------------------------


class GatedEngine(FakeEngine):
    """Holds every turn after its prefill until released, and records which ran at once."""

    def __init__(self) -> None:
        super().__init__()
        self.gate = asyncio.Event()
        self.live: list[str] = []  # a list, not a set: two turns of one branch at once would show twice
        self.together: set[tuple[str, ...]] = set()  # turns seen running at the same moment (sorted ids)

    async def _turn(self, session_id: str, prompt: Any) -> Any:  # type: ignore[override]
        self.live.append(session_id)
        self.together.add(tuple(sorted(self.live)))
        try:
            await self.gate.wait()
            async for event in super()._turn(session_id, prompt):
                yield event
        finally:
            self.live.remove(session_id)


def app_settings(store: Path) -> Settings:
    return Settings(store_dir=store, scorer="bm25", recall_embedder=False, ranker_embedder=False, threshold=60,
                    min_segment=2, max_segment=8, budget_curve="60:0.3 100000:0.3", keepalive_seconds=0.2)


async def start_app(store: Path, engine: FakeEngine) -> TestClient:
    client = TestClient(TestServer(create_app(app_settings(store), lambda _s: engine)))
    await client.start_server()
    return client


def anthropic_body(system: str, *turns: str) -> dict[str, Any]:
    messages = [{"role": "user" if i % 2 == 0 else "assistant", "content": t} for i, t in enumerate(turns)]
    return {"model": "m", "max_tokens": 8, "system": system, "messages": messages,
            "tools": [{"name": "Read", "input_schema": {"type": "object"}}]}


CLAUDE = {"X-Claude-Code-Session-Id": "cc-1"}
SUB = {**CLAUDE, "x-claude-code-agent-id": "a3dcce6b791608bc7"}


async def test_a_sub_agent_between_main_turns_costs_the_main_agent_nothing(tmp_path: Path) -> None:
    engine = FakeEngine()
    client = await start_app(tmp_path, engine)
    try:
        first = await (await client.post("/v1/messages", json=anthropic_body("main", "list files"), headers=CLAUDE)).json()
        sub = await client.post("/v1/messages", json=anthropic_body("sub-agent", "ls"), headers=SUB)
        assert sub.status == 200 and sub.headers["X-PFlash-Branch"] == "agent agent:a3dcce6b791608bc7"
        title = await client.post("/v1/messages", headers=CLAUDE, json={
            "model": "m", "max_tokens": 8, "system": "Name it.", "messages": [{"role": "user", "content": "ls"}],
            "output_config": {"format": {"type": "json_schema", "schema": {"type": "object"}}}})
        assert title.headers["X-PFlash-Branch"] == "side"
        second = await client.post("/v1/messages", json=anthropic_body("main", "list files", "ok", "thanks"),
                                   headers=CLAUDE)
        assert second.headers["X-PFlash-Branch"] == "main"
        usage = (await second.json())["usage"]
        prompt = first["usage"]["input_tokens"] + first["usage"]["cache_read_input_tokens"]
        assert usage["cache_read_input_tokens"] >= prompt  # restored from the RAM tier, not re-prefilled
        assert second.headers.get("X-PFlash-Restored-From") == "ram"

        listed = await (await client.get("/v1/sessions")).json()
        assert len(listed["data"]) == 1  # one session ...
        kinds = sorted((b["kind"], b["hint"]) for b in listed["data"][0]["branches"])
        assert kinds == [("agent", "agent:a3dcce6b791608bc7"), ("main", ""), ("side", "")]  # ... three conversations
        one = await (await client.get("/v1/sessions/cc-1")).json()
        assert {b["tier"] for b in one["branches"]} <= {"context", "ram"} and len(one["branches"]) == 3
        metrics = await (await client.get("/metrics")).text()
        assert 'pflash_branch_turns_total{kind="main"} 2.0' in metrics
        assert 'pflash_branches_opened_total{kind="agent"} 1.0' in metrics
        assert 'pflash_branch_prefix_lost_total{kind="main"} 0.0' in metrics
        assert "pflash_side_requests_total 1.0" in metrics

        assert (await client.delete("/v1/sessions/cc-1")).status == 200
        assert (await (await client.get("/v1/sessions")).json())["data"] == []  # the branches went with it
    finally:
        await client.close()


async def test_turns_of_one_branch_are_serialised_and_of_two_branches_interleave(tmp_path: Path) -> None:
    engine = GatedEngine()
    client = await start_app(tmp_path, engine)
    try:
        main = [asyncio.ensure_future(client.post("/v1/messages", json=anthropic_body("main", "q"), headers=CLAUDE))
                for _ in range(2)]
        sub = asyncio.ensure_future(client.post("/v1/messages", json=anthropic_body("sub", "q"), headers=SUB))
        for _ in range(100):
            await asyncio.sleep(0.01)
            if len(engine.live) == 2:
                break
        engine.gate.set()
        responses = await asyncio.gather(*main, sub)
        assert [r.status for r in responses] == [200, 200, 200]
        assert len(engine.prompts) == 3
        assert max(len(s) for s in engine.together) == 2  # the main agent and its sub-agent at once ...
        main_id = responses[0].headers["X-PFlash-Session"]
        # ... never the main agent's two turns (one branch: serialised)
        assert all(sum(sid.startswith(main_id) for sid in group) <= 1 for group in engine.together)
    finally:
        await client.close()


def test_a_side_requests_state_leaves_ram_first(tmp_path: Path) -> None:
    """The RAM tier holds two states: a side request's goes to disk, the agents' stay."""

    async def scenario() -> SessionRegistry:
        registry = SessionRegistry(SessionStore(tmp_path, "fp", 1, 1 << 30), 2500, "always")
        for sid, kind in (("a" * 64, "main"), ("b" * 64, "agent"), ("c" * 64, "side")):
            record = await registry.get_or_create(sid, "", "x-session-id", kind=kind)
            await registry.save_record(record)
        return registry

    registry = asyncio.run(scenario())
    registry.stash("a" * 64, SavedState((1,), b"x" * 1000))
    registry.stash("c" * 64, SavedState((1,), b"x" * 1000))  # the classifier's one-shot prompt
    registry.stash("b" * 64, SavedState((1,), b"x" * 1000))
    registry.settle()
    tiers = {info.session_id[0]: info.tier for info in registry.list(None)}
    assert tiers == {"a": "ram", "b": "ram", "c": "disk"}
    assert registry.counters["side_states_spilled"] == 1 and registry.counters["side_states_stashed"] == 1
    registry.close()


async def test_a_session_deleted_while_its_turn_runs_stays_deleted(tmp_path: Path) -> None:
    """The turn's write-ahead comes after the DELETE: it must not bring the session (or its
    branches' list) back, in memory or on disk."""
    engine = GatedEngine()
    engine.gate.set()
    client = await start_app(tmp_path, engine)
    try:
        assert (await client.post("/v1/messages", json=anthropic_body("main", "q"), headers=CLAUDE)).status == 200
        engine.gate.clear()
        running = asyncio.ensure_future(client.post("/v1/messages", json=anthropic_body("main", "q", "ok", "more"),
                                                    headers=CLAUDE))
        for _ in range(100):
            await asyncio.sleep(0.01)
            if engine.live:
                break
        assert (await client.delete("/v1/sessions/cc-1")).status == 200
        engine.gate.set()
        assert (await running).status == 200
        await asyncio.sleep(0.2)
        assert (await client.get("/v1/sessions/cc-1")).status == 404
        assert (await (await client.get("/v1/sessions")).json())["data"] == []
        assert not any(p.is_dir() for p in (tmp_path / "sessions").glob("*/*"))
    finally:
        await client.close()


def test_a_compacted_history_takes_its_kept_maps_with_it() -> None:
    """Kept-line maps live as long as their message is still sent: after the agent compacts its
    history (the log no longer resent), the record forgets the log's map."""
    scripts = conversations()["main"]
    with tempfile.TemporaryDirectory() as tmp:
        turns, _engine, registry = service(Path(tmp))

        async def play() -> tuple[int, int]:
            for conv in scripts[:2]:
                await run_turn(turns, conv)
            record = await registry.find(resolve_session(scripts[0], "").session_id, "")
            assert record is not None
            before = len(record.kept_maps)
            compacted = Conversation((Message("system", "You are the main agent."),
                                      Message("user", "Summary: the build failed on module 7. Go on.")), READ,
                                     hints=scripts[0].hints)
            await run_turn(turns, compacted)
            return before, len(record.kept_maps)

        before, after = asyncio.run(play())
        registry.close()
    assert (before, after) == (1, 0)


def test_each_turn_prepares_its_prompt_once_when_nothing_changes_it() -> None:
    """A side request checks whether it fits with the same prompt it is then served: rendered and
    tokenized once, not twice. A turn whose new long output is compressed needs two (whole, then
    compressed); any other turn one."""
    scripts = conversations()
    with tempfile.TemporaryDirectory() as tmp:
        turns, engine, registry = service(Path(tmp))
        calls: list[int] = []
        real_prepare = engine.prepare

        async def counting(*args: object, **kwargs: object) -> object:
            calls.append(1)
            return await real_prepare(*args, **kwargs)  # type: ignore[arg-type]

        engine.prepare = counting  # type: ignore[method-assign]

        async def run() -> list[int]:
            counts = []
            for conv in (scripts["main"][0], scripts["title"][0], scripts["main"][1]):
                calls.clear()
                turn = await turns.prepare(conv, "")
                turns.finish(turn)
                counts.append((len(calls), turn.compression is not None and turn.compression.compressed))
            return counts

        counts = asyncio.run(run())
        registry.close()
    assert counts[0] == (1, False)  # a question: one preparation
    assert counts[1] == (1, False)  # the title (a side request): one, not a fit check and then the prompt
    assert counts[2] == (2, True)  # the long log compressed: the whole prompt's check, then the compressed one


def test_a_long_new_message_is_counted_once_per_turn_and_off_the_event_loop() -> None:
    """Choosing what to compress counts the long message's tokens: once per turn (prepare and the
    rewrite shared it), in a worker thread (a 100K-token paste takes the loop ~0.1 s to count)."""
    scripts = conversations()
    long_text = scripts["main"][1].messages[-1].content
    with tempfile.TemporaryDirectory() as tmp:
        turns, engine, registry = service(Path(tmp))
        threads: list[int] = []
        real_count = engine.count_tokens

        def counting(text: str) -> int:
            if text == long_text:
                threads.append(threading.get_ident())
            return real_count(text)

        engine.count_tokens = counting  # type: ignore[method-assign]

        async def run() -> tuple[int, bool]:
            turn = await turns.prepare(scripts["main"][0], "")
            turns.finish(turn)
            turn = await turns.prepare(scripts["main"][1], "")
            turns.finish(turn)
            return threading.get_ident(), turn.compression is not None and turn.compression.compressed

        loop_thread, compressed = asyncio.run(run())
        registry.close()
    assert compressed
    assert len(threads) == 1, f"the long message was counted {len(threads)} times"
    assert loop_thread not in threads


def test_another_image_behind_the_same_placeholder_is_another_message() -> None:
    placeholder = "[image: 1 attachment omitted, png, 48 KB]"
    plain = Message("user", f"What is in this picture?\n{placeholder}")
    cat = Message("user", plain.content, attachments=(Attachment(placeholder, "data:image/png;base64,Y2F0"),))
    dog = Message("user", plain.content, attachments=(Attachment(placeholder, "data:image/png;base64,ZG9n"),))
    assert len({message_digest(plain), message_digest(cat), message_digest(dog)}) == 3
    assert message_digest(Message("user", "hi")) == message_digest(Message("user", "hi"))
