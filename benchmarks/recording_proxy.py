"""A pass-through HTTP proxy on 127.0.0.1 that records what a real client asked and what the
gateway answered: status, the conversation the gateway chose (X-PFlash-Branch) and the usage it
reported (cached and prompt tokens), read from the JSON body or the stream's last usage event."""

from __future__ import annotations

import asyncio
import json
import threading
import time
from dataclasses import dataclass, field
from typing import Any

from aiohttp import ClientSession, ClientTimeout, web

from benchmarks.recorded_calls import RecordedCall, recorded_calls
from gateway.process import free_port

_HOP_BY_HOP = {"host", "content-length", "connection", "accept-encoding", "transfer-encoding", "keep-alive"}


@dataclass
class Exchange:
    started: float
    method: str
    path: str
    headers: dict[str, str]  # the request's, lower-cased
    status: int = 0
    branch: str = ""
    prompt_tokens: int | None = None
    cached_tokens: int | None = None
    seconds: float = 0.0
    first_content_s: float | None = None  # the first streamed content (text or a call's arguments)
    label: str = field(default="")  # set by the caller: which invocation sent it
    calls: list[RecordedCall] = field(default_factory=list)  # the tool calls answered, judged against those offered


def usage_of(path: str, body: bytes) -> tuple[int, int] | None:
    """(prompt, cached) tokens from an Anthropic Messages or OpenAI Responses answer, streamed or not."""
    payloads: list[Any] = []
    text = body.decode("utf-8", "replace")
    if text.lstrip().startswith("{"):
        payloads.append(json.loads(text))
    else:
        payloads += [json.loads(line[6:]) for line in text.splitlines() if line.startswith("data: {")]
    for payload in reversed(payloads):
        usage = payload.get("usage") or (payload.get("response") or {}).get("usage")
        if not usage:
            continue
        if path.startswith("/v1/responses"):
            return usage["input_tokens"], usage["input_tokens_details"]["cached_tokens"]
        cached = usage.get("cache_read_input_tokens", 0)
        return usage.get("input_tokens", 0) + cached, cached
    return None


class RecordingProxy:
    def __init__(self, target: str) -> None:
        self.target = target.rstrip("/")
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.exchanges: list[Exchange] = []
        self.label = ""
        app = web.Application(client_max_size=64 * 1024 * 1024)
        app.router.add_route("*", "/{tail:.*}", self._forward)
        self._loop = asyncio.new_event_loop()
        ready = threading.Event()

        self._runner = web.AppRunner(app)

        async def serve() -> None:
            await self._runner.setup()
            await web.TCPSite(self._runner, "127.0.0.1", self.port).start()
            ready.set()

        def run() -> None:
            asyncio.set_event_loop(self._loop)
            self._loop.run_until_complete(serve())
            self._loop.run_forever()

        threading.Thread(target=run, daemon=True).start()
        ready.wait(10)

    async def _forward(self, request: web.Request) -> web.StreamResponse:
        raw = await request.read()
        headers = {k: v for k, v in request.headers.items() if k.lower() not in _HOP_BY_HOP}
        exchange = Exchange(time.time(), request.method, request.path,
                            {k.lower(): v for k, v in request.headers.items()}, label=self.label)
        self.exchanges.append(exchange)
        body = bytearray()
        async with ClientSession(timeout=ClientTimeout(total=None)) as session:
            async with session.request(request.method, self.target + request.path_qs, data=raw,
                                       headers=headers) as upstream:
                exchange.status = upstream.status
                exchange.branch = upstream.headers.get("X-PFlash-Branch", "")
                keep = {k: v for k, v in upstream.headers.items() if k.lower() not in _HOP_BY_HOP}
                response = web.StreamResponse(status=upstream.status, headers=keep)
                await response.prepare(request)
                try:
                    async for chunk in upstream.content.iter_any():
                        body.extend(chunk)
                        if exchange.first_content_s is None and b'"delta"' in body:
                            exchange.first_content_s = time.time() - exchange.started
                        await response.write(chunk)
                    await response.write_eof()
                except ConnectionError:
                    pass  # the client hung up: what the gateway said so far is still recorded
        exchange.seconds = time.time() - exchange.started
        found = usage_of(request.path, bytes(body)) if exchange.status < 300 and body else None
        if found is not None:
            exchange.prompt_tokens, exchange.cached_tokens = found
        if exchange.status < 300 and body and request.method == "POST":
            exchange.calls = recorded_calls(request.path, raw, bytes(body))
        return response

    def close(self) -> None:
        """Closes the listener and its connections before the loop stops: a handler left pending on a
        kept-alive connection is otherwise destroyed with the loop ("Task was destroyed but it is pending")."""
        try:
            asyncio.run_coroutine_threadsafe(self._runner.cleanup(), self._loop).result(timeout=10)
        finally:
            self._loop.call_soon_threadsafe(self._loop.stop)
