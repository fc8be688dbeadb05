"""The upstream's wire: its SSE stream read line by line, and its errors mapped to the client's
(an overflow stays the client's 400; the gateway's own credentials or URL are a 502 that says so)."""

from __future__ import annotations

import asyncio
import json
import re
from collections.abc import AsyncIterator
from typing import Any

import aiohttp

from engine.base import EngineRejected

_OVERFLOW_CODES = {"context_length_exceeded", "exceed_context_size_error", "context_window_exceeded"}
# Only for an error that names no such code (vLLM's and SGLang's say it in words): the phrases
# they use, never a bare "maximum" or "too long" ("maximum number of tools exceeded" is not one).
_OVERFLOW_WORDS = re.compile(r"context (?:length|window|size)|maximum context|prompt is too long|"
                             r"too many (?:input )?tokens|exceeds? (?:the )?(?:available )?context", re.I)


def is_overflow(error: object) -> bool:
    """Whether an upstream error (its `error` object, or its text) says the prompt is over the
    context: by its code or type first, by its wording only when it names no code."""
    if isinstance(error, dict):
        code, kind = error.get("code"), error.get("type")
        if code in _OVERFLOW_CODES or kind in _OVERFLOW_CODES:
            return True
        if isinstance(code, str) and code:
            return False  # a code of its own (OpenAI's are specific); a `type` is only a class of error
        error = error.get("message") or ""
    return bool(_OVERFLOW_WORDS.search(str(error)))


def rejection(status: int, text: str) -> EngineRejected:
    error: object = {}
    try:
        error = json.loads(text).get("error") or {}
        message = error.get("message") if isinstance(error, dict) else str(error)
    except (ValueError, AttributeError):
        message = text[:500]
    message = message or f"upstream answered {status}"
    if status in (400, 413) and is_overflow(error if isinstance(error, dict) and error else message):
        return EngineRejected(400, message, "context_length_exceeded")
    if status in (401, 403):
        # The gateway's own credentials or configuration, not the client's request.
        return EngineRejected(502, f"the upstream refused the gateway's credentials (HTTP {status}: {message}); "
                                   "check the upstream API key")
    if status == 404:
        return EngineRejected(502, f"the upstream has no such endpoint or model (HTTP 404: {message}); "
                                   "check the upstream URL and model name")
    if 400 <= status < 500:
        return EngineRejected(400 if status != 429 else 429, f"upstream rejected the request: {message}")
    return EngineRejected(502, f"upstream error {status}: {message}")


# One SSE line may carry a whole tool call's arguments (a file written in one go): far over
# aiohttp's 128 KiB readline limit, so lines are split here with a generous cap of our own.
MAX_SSE_LINE = 16 * 1024 * 1024


async def sse_lines(response: aiohttp.ClientResponse) -> AsyncIterator[bytes]:
    buffer = b""
    try:
        async for chunk in response.content.iter_any():
            buffer += chunk
            *lines, buffer = buffer.split(b"\n")
            for line in lines:
                yield line
            if len(buffer) > MAX_SSE_LINE:
                raise EngineRejected(502, f"the upstream sent an SSE line over {MAX_SSE_LINE // (1024 * 1024)} MiB")
    except (aiohttp.ClientError, asyncio.TimeoutError) as exc:
        raise EngineRejected(502, f"the upstream stream broke mid-answer: {exc or type(exc).__name__}") from exc
    if buffer:
        yield buffer


async def sse_data(response: aiohttp.ClientResponse) -> AsyncIterator[dict[str, Any]]:
    """The JSON objects of an SSE stream's `data:` lines, until [DONE]."""
    async for raw in sse_lines(response):
        line = raw.decode("utf-8", errors="replace").strip()
        if not line.startswith("data:"):
            continue
        payload = line[5:].strip()
        if payload == "[DONE]":
            return
        try:
            data = json.loads(payload)
        except ValueError:
            continue
        if isinstance(data, dict):
            yield data
