"""An existing OpenAI-compatible serving engine (vLLM, SGLang, llama.cpp server) over HTTP.

The gateway keeps doing what it alone does — sessions, compression, recall, byte-identical history
— and forwards the rewritten conversation to the upstream's Chat Completions endpoint, whose own
prefix cache then sees a stable prefix. KV persistence is the upstream's business.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass
from typing import Any

import aiohttp

from engine.base import EngineEvent, EngineRejected, EngineUnavailable, PrefillDone, PreparedPrompt
from engine.constraints import OutputConstraint
from engine.reasoning import ReasoningSplitter
from engine.text_calls import TextCalls
from engine.upstream_grammar import UpstreamGrammars
from engine.upstream_wire import is_overflow, rejection, sse_data
from policies.conversation_types import (
    Finished,
    Message,
    ReasoningDelta,
    SamplingParams,
    TextDelta,
    ToolCall,
    ToolCallDelta,
    ToolSpec,
    Usage,
)

log = logging.getLogger("pflash.upstream")

# Per-message framing the upstream's chat template adds; a small over-estimate keeps the overflow
# check on the safe side when only message text is counted.
_MESSAGE_OVERHEAD = 8


@dataclass(frozen=True)
class UpstreamOptions:
    base_url: str  # e.g. http://127.0.0.1:8000/v1
    api_key: str | None = None
    model: str | None = None
    timeout: float = 600.0
    retries: int = 2
    n_ctx: int | None = None  # None: ask the upstream (/v1/models max_model_len, /props n_ctx)
    multimodal: bool = False  # images go on as image_url parts, not as their placeholders
    # The session's stable key, for a router with session affinity (vLLM's router, llm-d): the
    # replica that holds a session's prefix cache keeps getting its turns.
    session_header: str | None = "X-Session-Id"
    prompt_cache_key: bool = False  # also as OpenAI's `prompt_cache_key` (strict upstreams refuse it)
    tool_grammar: bool = True  # the gateway's tool-call grammar, to an upstream that takes one (llama-server)


def with_images(message: Message) -> str | list[dict[str, Any]]:
    """A message's content with each image placeholder replaced by the image, as OpenAI content
    parts; the text alone when no placeholder is left (compression may have dropped it)."""
    parts: list[dict[str, Any]] = []
    rest = message.content
    for image in message.attachments:
        before, found, after = rest.partition(image.placeholder)
        if not found:
            continue
        if before:
            parts.append({"type": "text", "text": before})
        parts.append({"type": "image_url", "image_url": {"url": image.url}})
        rest = after
    if not parts:
        return message.content
    if rest:
        parts.append({"type": "text", "text": rest})
    return parts


def _tool_images(messages: Sequence[Message]) -> dict[str, Any] | None:
    """The images of a run of tool results, as the user turn that follows them: OpenAI tool
    messages are text only, and a user turn between two results would split the run."""
    parts = [{"type": "image_url", "image_url": {"url": a.url}}
             for m in messages for a in m.attachments if a.placeholder in m.content]
    if not parts:
        return None
    return {"role": "user", "content": [{"type": "text", "text": "The images of the tool results above:"}, *parts]}


def to_openai_messages(messages: Sequence[Message], multimodal: bool = False) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for i, m in enumerate(messages):
        content = with_images(m) if multimodal and m.role == "user" and m.attachments else m.content
        item: dict[str, Any] = {"role": m.role, "content": content}
        if m.tool_calls:
            item["tool_calls"] = [
                {"id": c.id, "type": "function", "function": {"name": c.name, "arguments": c.arguments}}
                for c in m.tool_calls
            ]
            # Content stays a string even when empty: some servers reject null beside tool_calls.
        if m.role == "tool":
            item["tool_call_id"] = m.tool_call_id
        out.append(item)
        if multimodal and m.role == "tool" and (i + 1 == len(messages) or messages[i + 1].role != "tool"):
            run = i
            while run > 0 and messages[run - 1].role == "tool":
                run -= 1
            images = _tool_images(messages[run : i + 1])
            if images is not None:
                out.append(images)
    return out


def to_openai_tools(tools: Sequence[ToolSpec]) -> list[dict[str, Any]]:
    return [{"type": "function", "function": {"name": t.name, "description": t.description,
                                              "parameters": t.parameters or {"type": "object", "properties": {}}}}
            for t in tools]


def to_openai_constraint(constraint: OutputConstraint, has_tools: bool) -> dict[str, Any]:
    """tool_choice, parallel_tool_calls and response_format in Chat Completions' own shapes.

    Defaults are left out: some servers refuse an explicit "auto" unless started with their
    auto-tool-choice option (vLLM), and every server already defaults to it.
    """
    out: dict[str, Any] = {}
    if has_tools and constraint.tool_choice != "auto":
        out["tool_choice"] = (
            {"type": "function", "function": {"name": constraint.tool_name}}
            if constraint.tool_name else constraint.tool_choice
        )
    if has_tools and not constraint.parallel_tool_calls:
        out["parallel_tool_calls"] = False
    fmt = constraint.response_format
    if fmt is not None and fmt["type"] == "json_schema":
        out["response_format"] = {"type": "json_schema", "json_schema": {
            "name": fmt["name"], "schema": fmt["schema"], "strict": fmt["strict"]}}
    elif fmt is not None:
        out["response_format"] = {"type": "json_object"}
    return out


def schema_as_json_object(body: dict[str, Any]) -> dict[str, Any] | None:
    """The request with an OpenAI `json_schema` response_format rewritten to the llama.cpp-family
    form `{"type": "json_object", "schema": ...}`; None when it has no such format."""
    fmt = body.get("response_format")
    if not isinstance(fmt, dict) or fmt.get("type") != "json_schema":
        return None
    return {**body, "response_format": {"type": "json_object", "schema": fmt["json_schema"]["schema"]}}


class UpstreamEngine:
    def __init__(self, options: UpstreamOptions, count_tokens: Callable[[str], int], tokenizer_name: str) -> None:
        self._opts = options
        self._base = options.base_url.rstrip("/")
        if not self._base.endswith("/v1"):
            self._base += "/v1"
        self._root = self._base[: -len("/v1")]
        self._local_count = count_tokens
        self._tokenize_route: tuple[str, str] | None = None
        self.model_id = options.model or "upstream"
        self.n_ctx = options.n_ctx or 0
        self.fingerprint = f"upstream|{self._base}|{self.model_id}"
        self._session: aiohttp.ClientSession | None = None
        self._counters: dict[str, float] = {"upstream_requests": 0, "upstream_errors": 0, "upstream_retries": 0,
                                            "upstream_format_fallbacks": 0, "upstream_text_calls": 0,
                                            "upstream_grammar_requests": 0}
        self._grammars = UpstreamGrammars(options.tool_grammar)
        log.info("upstream %s; line-level token counts from %s", self._base, tokenizer_name)

    def _headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self._opts.api_key}"} if self._opts.api_key else {}

    @property
    def session(self) -> aiohttp.ClientSession:
        if self._session is None:
            timeout = aiohttp.ClientTimeout(total=self._opts.timeout, sock_connect=10)
            self._session = aiohttp.ClientSession(timeout=timeout, headers=self._headers())
        return self._session

    # --- lifecycle -------------------------------------------------------------------------------
    async def start(self) -> None:
        """Learn the model name, context size and a tokenizer route; a down upstream is not fatal."""
        try:
            async with self.session.get(self._base + "/models") as response:
                data = await response.json(content_type=None)
            entries = data.get("data") or []
            if entries and not self._opts.model:
                self.model_id = str(entries[0].get("id", self.model_id))
            if entries and not self.n_ctx:
                self.n_ctx = int(entries[0].get("max_model_len") or 0)
            async with self.session.get(self._root + "/props") as response:  # llama-server's
                props = await response.json(content_type=None) if response.status == 200 else {}
            if isinstance(props, dict):
                self.n_ctx = self.n_ctx or int((props.get("default_generation_settings") or {}).get("n_ctx") or 0)
                self._grammars.learn(props)
        except (aiohttp.ClientError, asyncio.TimeoutError, ValueError, TypeError, AttributeError) as exc:
            log.warning("upstream not reachable at start (%s); will retry per request", exc)
        self.n_ctx = self.n_ctx or 32768
        await self._find_tokenize_route()

    async def _find_tokenize_route(self) -> None:
        for path, field in (("/tokenize", "prompt"), ("/tokenize", "content"), ("/extras/tokenize", "input")):
            try:
                body = {field: "hello world"} | ({"model": self.model_id} if field == "prompt" else {})
                async with self.session.post(self._root + path, json=body) as response:
                    data = await response.json(content_type=None)
                if response.status == 200 and isinstance(data.get("tokens"), list):
                    self._tokenize_route = (path, field)
                    log.info("prompt tokens counted by the upstream's %s", path)
                    return
            except (aiohttp.ClientError, asyncio.TimeoutError, ValueError, AttributeError):
                continue
        log.info("upstream has no tokenizer endpoint: prompt tokens counted locally")

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None

    def idle(self) -> bool:
        return True  # the model runs on the upstream's machine: our cores are free for scoring

    def stats(self) -> dict[str, float]:
        return dict(self._counters)

    def prefetch(self, session_id: str) -> None:
        return None  # the upstream server holds its own cache

    # --- tokens ------------------------------------------------------------------------------------
    def count_tokens(self, text: str) -> int:
        return self._local_count(text)

    async def _count_remote(self, text: str) -> int | None:
        if self._tokenize_route is None:
            return None
        path, field = self._tokenize_route
        body = {field: text} | ({"model": self.model_id} if field == "prompt" else {})
        try:
            async with self.session.post(self._root + path, json=body) as response:
                data = await response.json(content_type=None)
            return len(data["tokens"]) if response.status == 200 else None
        except (aiohttp.ClientError, asyncio.TimeoutError, ValueError, KeyError, TypeError):
            return None

    async def prepare(
        self, messages: Sequence[Message], tools: Sequence[ToolSpec], constraint: OutputConstraint = OutputConstraint()
    ) -> PreparedPrompt:
        """The upstream enforces the constraint itself: it is forwarded (to_openai_constraint)."""
        text = "\n".join(m.content for m in messages) + (json.dumps(to_openai_tools(tools)) if tools else "")
        counted = await self._count_remote(text)
        if counted is None:
            counted = await asyncio.to_thread(self._local_count, text)
        n_tokens = counted + _MESSAGE_OVERHEAD * len(messages)
        return PreparedPrompt(tuple(messages), tuple(tools), n_tokens, constraint=constraint)

    # --- generation --------------------------------------------------------------------------------
    def stream(self, session_id: str, prompt: PreparedPrompt, params: SamplingParams) -> AsyncIterator[EngineEvent]:
        return self._stream(session_id, prompt, params)

    async def _stream(self, session_id: str, prompt: PreparedPrompt, params: SamplingParams) -> AsyncIterator[EngineEvent]:
        room = max(1, self.n_ctx - prompt.n_tokens)
        body: dict[str, Any] = {
            "model": self._opts.model or self.model_id,
            "messages": to_openai_messages(prompt.messages, self._opts.multimodal),
            "stream": True,
            "stream_options": {"include_usage": True},
            "temperature": params.temperature,
            "top_p": params.top_p,
            # Clamped to what fits: Claude Code asks for 32K-64K, which vLLM refuses as an overflow.
            "max_tokens": min(params.max_tokens or room, room),
            "user": session_id[:32],  # lets an upstream route a session to the same replica
        }
        if self._opts.prompt_cache_key:
            body["prompt_cache_key"] = session_id[:32]
        if params.stop:
            body["stop"] = list(params.stop)
        if params.seed is not None:
            body["seed"] = params.seed
        if prompt.tools:
            body["tools"] = to_openai_tools(prompt.tools)
        body.update(to_openai_constraint(prompt.constraint, bool(prompt.tools)))
        constrained = self._grammars.apply(body, prompt)
        self._counters["upstream_requests"] += 1
        self._counters["upstream_grammar_requests"] += constrained
        headers = {self._opts.session_header: session_id[:32]} if self._opts.session_header else None
        response = await self._post_answer(body, headers, constrained)
        calls: dict[int, dict[str, str]] = {}
        text_parts: list[str] = []
        reasoning = ReasoningSplitter()
        # A call the upstream left in the text (its server did not read the model's markup) is still a call.
        text_calls = TextCalls(t.name for t in prompt.tools) if prompt.parses_tool_calls else None
        usage: dict[str, Any] | None = None
        finish = "stop"
        started = False
        try:
            async for data in sse_data(response):
                if not started:
                    started = True
                    yield PrefillDone(prompt.n_tokens, 0, "upstream")
                if data.get("error"):
                    error = data["error"]
                    message = str(error.get("message") if isinstance(error, dict) else error)
                    if is_overflow(error):
                        raise EngineRejected(400, message, "context_length_exceeded")
                    raise EngineRejected(502, f"upstream error mid-answer: {message}")
                usage = data.get("usage") or usage
                for choice in data.get("choices") or []:
                    delta = choice.get("delta") or {}
                    # vLLM/SGLang/llama.cpp reasoning parsers: `reasoning_content` (newer vLLM: `reasoning`).
                    thought = delta.get("reasoning_content") or delta.get("reasoning")
                    if isinstance(thought, str) and thought:
                        yield ReasoningDelta(thought)
                    if isinstance(delta.get("content"), str):
                        # An upstream without a reasoning parser leaves <think> in the content.
                        for event in reasoning.feed(delta["content"]):
                            if isinstance(event, TextDelta):
                                text_parts.append(event.text)
                                event = TextDelta(text_calls.feed(event.text)) if text_calls else event
                            if not isinstance(event, TextDelta) or event.text:
                                yield event
                    for call in delta.get("tool_calls") or []:
                        slot = calls.setdefault(int(call.get("index", 0)), {"id": "", "name": "", "arguments": ""})
                        fn = call.get("function") or {}
                        slot["id"] = call.get("id") or slot["id"]
                        # A name arrives whole; llama_cpp.server repeats it in every chunk of the call.
                        slot["name"] = fn.get("name") or slot["name"]
                        slot["arguments"] += fn.get("arguments") or ""
                    finish = choice.get("finish_reason") or finish
        finally:
            response.release()
        for event in reasoning.finish():
            if isinstance(event, TextDelta):
                text_parts.append(event.text)
                event = TextDelta(text_calls.feed(event.text)) if text_calls else event
            if not isinstance(event, TextDelta) or event.text:
                yield event
        if text_calls is not None:
            rest, found = text_calls.finish() if not calls else (text_calls.flush(), [])
            if found:
                log.info("upstream wrote %d tool call(s) as text: read as calls", len(found))
                calls = {i: {"id": "", "name": name, "arguments": args} for i, (name, args) in enumerate(found)}
                self._counters["upstream_text_calls"] += 1
            if rest:
                yield TextDelta(rest)
        if not started:
            yield PrefillDone(prompt.n_tokens, 0, "upstream")
        for index in sorted(calls):
            slot = calls[index]
            call_id = slot["id"] if slot["id"] and slot["id"].replace("_", "").replace("-", "").isalnum() else f"call_{index}_{int(time.time() * 1000)}"
            yield ToolCallDelta(index, ToolCall(call_id, slot["name"], slot["arguments"] or "{}"))
        prompt_tokens = int((usage or {}).get("prompt_tokens") or prompt.n_tokens)
        completion_tokens = int((usage or {}).get("completion_tokens") or self._local_count("".join(text_parts)))
        cached = int(((usage or {}).get("prompt_tokens_details") or {}).get("cached_tokens") or 0)
        reason = "tool_calls" if calls else ("length" if finish == "length" else "stop")
        yield Finished(reason, Usage(prompt_tokens, completion_tokens, cached))  # type: ignore[arg-type]

    async def _post_answer(self, body: dict[str, Any], headers: dict[str, str] | None,
                           constrained: bool) -> aiohttp.ClientResponse:
        """The request, sent once more in a shape a refusing upstream takes: without the tool
        grammar, or with a json_schema response_format as llama-cpp-python's server words it."""
        try:
            return await self._post_with_retries(body, headers)
        except EngineRejected as exc:
            if exc.status == 400 and exc.code == "context_length_exceeded":
                raise
            if constrained and exc.status == 400:
                self._grammars.give_up(exc)
                return await self._post_with_retries({k: v for k, v in body.items()
                                                      if k not in ("grammar", "tool_choice")}, headers)
            fallback = schema_as_json_object(body)
            if fallback is None:
                raise
            log.info("upstream refused response_format json_schema (%s); retrying as json_object with the schema", exc)
            self._counters["upstream_format_fallbacks"] += 1
            return await self._post_with_retries(fallback, headers)

    async def _post_with_retries(self, body: dict[str, Any], headers: dict[str, str] | None = None) -> aiohttp.ClientResponse:
        delay = 0.25
        for attempt in range(self._opts.retries + 1):
            try:
                response = await self.session.post(self._base + "/chat/completions", json=body, headers=headers)
            except (aiohttp.ClientConnectionError, asyncio.TimeoutError) as exc:
                # Retry connect errors only: a request the upstream saw must not be sent twice.
                if attempt == self._opts.retries or not isinstance(exc, aiohttp.ClientConnectorError):
                    self._counters["upstream_errors"] += 1
                    raise EngineUnavailable(f"upstream {self._base} unreachable: {exc}") from exc
                self._counters["upstream_retries"] += 1
                await asyncio.sleep(delay)
                delay *= 2
                continue
            if response.status >= 400:
                text = await response.text()
                response.release()
                self._counters["upstream_errors"] += 1
                raise rejection(response.status, text)
            return response
        raise EngineUnavailable(f"upstream {self._base} unreachable")


# What servers call a prompt over the context: OpenAI's code, llama.cpp server's type.
