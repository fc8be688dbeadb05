"""How an upstream's refusal reaches the client: a prompt over the context is named by the error's
code or type first, by its wording only when it names neither, and an unrelated 400 never is."""

from __future__ import annotations

import json

import pytest

from engine.upstream_wire import rejection as _rejection


def refusal(status: int, error: object) -> tuple[int, str | None]:
    rejected = _rejection(status, json.dumps({"error": error}))
    return rejected.status, rejected.code


@pytest.mark.parametrize("error", [
    {"message": "whatever", "code": "context_length_exceeded"},  # OpenAI
    {"message": "request (5000 tokens) exceeds the available context size (4096 tokens)",
     "type": "exceed_context_size_error", "code": 400},  # llama.cpp server
    {"message": "This model's maximum context length is 4096 tokens. However, you requested 5000 tokens.",
     "type": "BadRequestError", "code": 400},  # vLLM: in words only
    {"message": "Requested tokens (5000) exceed context window of 4096"},  # llama-cpp-python's server
])
def test_a_prompt_over_the_context_is_context_length_exceeded(error: object) -> None:
    assert refusal(400, error) == (400, "context_length_exceeded")


@pytest.mark.parametrize("error", [
    {"message": "maximum number of tools exceeded (128)", "type": "invalid_request_error"},
    {"message": "the tool name is too long", "code": "invalid_value"},
    {"message": "maximum context length is 4096", "code": "model_not_found"},  # a code that says otherwise
])
def test_an_unrelated_400_stays_what_it_was(error: object) -> None:
    status, code = refusal(400, error)
    assert status == 400 and code != "context_length_exceeded"
