"""The official anthropic SDK against a running pflash-gateway: Messages, streaming, count_tokens.

    .venv/bin/python examples/anthropic_sdk.py [--base-url http://127.0.0.1:8090] [--model pflash-local]

The key comes from PFLASH_GATEWAY_KEY (any value when the gateway runs without --api-keys).
"""

from __future__ import annotations

import argparse
import os
import uuid
from typing import Any

import anthropic


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--base-url", default="http://127.0.0.1:8090")  # the root URL, no /v1
    parser.add_argument("--model", default="pflash-local")
    args = parser.parse_args()

    client = anthropic.Anthropic(
        base_url=args.base_url,
        api_key=os.environ.get("PFLASH_GATEWAY_KEY", "unused"),
        # The header Claude Code sends; it keeps this conversation on one KV cache.
        default_headers={"X-Claude-Code-Session-Id": str(uuid.uuid4())},
    )
    system = "You are a concise assistant for Python developers."
    messages: list[dict[str, Any]] = [{"role": "user", "content": "What does `zip` do?"}]

    counted = client.messages.count_tokens(model=args.model, system=system, messages=messages)  # type: ignore[arg-type]
    print(f"count_tokens: {counted.input_tokens}")

    first = client.messages.create(model=args.model, max_tokens=48, system=system, messages=messages)  # type: ignore[arg-type]
    text = "".join(block.text for block in first.content if block.type == "text")
    print("message:", text.strip()[:200], f"[{first.stop_reason}]")

    messages += [{"role": "assistant", "content": text or "…"}, {"role": "user", "content": "Show a one-line example."}]
    print("stream: ", end="")
    with client.messages.stream(model=args.model, max_tokens=48, system=system, messages=messages) as stream:  # type: ignore[arg-type]
        for piece in stream.text_stream:
            print(piece, end="", flush=True)
        final = stream.get_final_message()
    usage = final.usage
    print(f"\n  {usage.input_tokens} new input tokens, {usage.cache_read_input_tokens} read from the session cache")


if __name__ == "__main__":
    main()
