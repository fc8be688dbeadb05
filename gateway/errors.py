"""One error type for the whole gateway, rendered in each client's own API shape."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

ErrorKind = Literal[
    "invalid_request_error",
    "authentication_error",
    "permission_error",
    "not_found_error",
    "request_too_large",
    "rate_limit_error",
    "overloaded_error",
    "api_error",
]

ApiFlavor = Literal["openai", "anthropic", "responses"]


@dataclass
class ApiError(Exception):
    status: int
    message: str
    kind: ErrorKind = "invalid_request_error"
    code: str | None = None
    param: str | None = None
    retry_after: int | None = None

    def __str__(self) -> str:
        return f"{self.status} {self.kind}: {self.message}"


def invalid(message: str, param: str | None = None, code: str | None = None) -> ApiError:
    return ApiError(400, message, "invalid_request_error", code=code, param=param)


def context_overflow(prompt_tokens: int, limit: int) -> ApiError:
    return ApiError(
        400,
        f"prompt is too long: {prompt_tokens} tokens > {limit} maximum "
        f"(this model's context length is {limit} tokens)",
        "invalid_request_error",
        code="context_length_exceeded",
    )


def overloaded(message: str, retry_after: int) -> ApiError:
    """Busy or briefly unavailable: every SDK retries it after Retry-After."""
    return ApiError(503, message, "overloaded_error", code="server_is_overloaded", retry_after=retry_after)


def http_status(err: ApiError, flavor: ApiFlavor) -> int:
    # Anthropic's own status for overloaded is 529 (its SDK and Claude Code retry it).
    return 529 if flavor == "anthropic" and err.kind == "overloaded_error" else err.status


def error_body(err: ApiError, flavor: ApiFlavor) -> dict[str, Any]:
    """The JSON body of an error response in the client's API shape."""
    if flavor == "anthropic":
        return {"type": "error", "error": {"type": err.kind, "message": err.message}}
    # overloaded_error is Anthropic's word; OpenAI says server_error + code server_is_overloaded.
    kind = "server_error" if err.kind in ("overloaded_error", "api_error") else err.kind
    body: dict[str, Any] = {"message": err.message, "type": kind, "param": err.param, "code": err.code}
    return {"error": body}
