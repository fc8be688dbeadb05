"""The official openai SDK against a running pflash-gateway: Chat Completions and Responses.

    .venv/bin/python examples/openai_sdk.py [--base-url http://127.0.0.1:8090] [--model pflash-local]

The key comes from PFLASH_GATEWAY_KEY (any value when the gateway runs without --api-keys).
"""

from __future__ import annotations

import argparse
import os
import uuid

import openai


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--base-url", default="http://127.0.0.1:8090")
    parser.add_argument("--model", default="pflash-local")
    args = parser.parse_args()

    session = f"example-{uuid.uuid4().hex[:8]}"
    client = openai.OpenAI(
        base_url=args.base_url.rstrip("/") + "/v1",
        api_key=os.environ.get("PFLASH_GATEWAY_KEY", "unused"),
        default_headers={"X-Session-Id": session},  # one KV cache for this conversation
    )

    # Chat Completions, two turns: the second reuses the first turn's prefix.
    messages: list[dict[str, str]] = [
        {"role": "system", "content": "You are a concise assistant for Python developers."},
        {"role": "user", "content": "What does `enumerate` return?"},
    ]
    first = client.chat.completions.create(model=args.model, messages=messages, max_tokens=48)  # type: ignore[arg-type]
    answer = first.choices[0].message.content or ""
    print("chat:", answer.strip()[:200])
    messages += [{"role": "assistant", "content": answer}, {"role": "user", "content": "Give a one-line example."}]
    stream = client.chat.completions.create(model=args.model, messages=messages, max_tokens=48,  # type: ignore[arg-type]
                                            stream=True, stream_options={"include_usage": True})
    print("chat stream: ", end="")
    for chunk in stream:
        if chunk.choices and chunk.choices[0].delta.content:
            print(chunk.choices[0].delta.content, end="", flush=True)
        if chunk.usage is not None:
            cached = chunk.usage.prompt_tokens_details.cached_tokens if chunk.usage.prompt_tokens_details else 0
            print(f"\n  prompt {chunk.usage.prompt_tokens} tokens, {cached} from the session cache")

    # Responses (what Codex uses): continue with previous_response_id instead of resending.
    r1 = client.responses.create(model=args.model, instructions="Answer in one sentence.",
                                 input="What is a Python generator?", max_output_tokens=48)
    print("responses:", r1.output_text.strip()[:200])
    r2 = client.responses.create(model=args.model, instructions="Answer in one sentence.",
                                 input="And a coroutine?", previous_response_id=r1.id, max_output_tokens=48)
    assert r2.usage is not None
    print("responses (continued):", r2.output_text.strip()[:200])
    print(f"  input {r2.usage.input_tokens} tokens, {r2.usage.input_tokens_details.cached_tokens} cached")


if __name__ == "__main__":
    main()
