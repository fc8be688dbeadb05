"""The neutral conversation every API adapter produces and every engine consumes.

Plain, immutable data: no I/O, no wire format. OpenAI Chat Completions, Anthropic Messages and
OpenAI Responses all map onto these types, so sessions, compression and recall see one shape.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

Role = Literal["system", "user", "assistant", "tool"]
FinishReason = Literal["stop", "length", "tool_calls"]


@dataclass(frozen=True)
class ToolCall:
    """A function call the assistant made; `arguments` is a JSON object serialized as a string."""

    id: str
    name: str
    arguments: str


@dataclass(frozen=True)
class Attachment:
    """An image the client sent, kept beside the text placeholder that stands for it in `content`:
    a text-only engine reads the placeholder, a multimodal upstream gets the image back in its place."""

    placeholder: str  # the exact line in the message's content, e.g. "[image: 1 attachment omitted, png, 48 KB]"
    url: str  # a data: URL or an http(s) URL


@dataclass(frozen=True)
class Message:
    role: Role
    content: str
    tool_calls: tuple[ToolCall, ...] = ()
    # For role == "tool": the id of the call this message answers, and the tool's name if known.
    tool_call_id: str | None = None
    name: str | None = None
    is_error: bool = False
    attachments: tuple[Attachment, ...] = ()  # images behind placeholders in `content`, in order


@dataclass(frozen=True)
class ToolSpec:
    name: str
    description: str = ""
    parameters: dict[str, Any] = field(default_factory=dict, hash=False, compare=True)


@dataclass(frozen=True)
class SamplingParams:
    max_tokens: int | None = None
    temperature: float = 0.8
    top_p: float = 0.95
    stop: tuple[str, ...] = ()
    seed: int | None = None


@dataclass(frozen=True)
class SessionHints:
    """Every client-supplied hint of session identity, strongest first (see sessions/identity)."""

    x_session_id: str | None = None
    claude_code_session_id: str | None = None
    session_id_header: str | None = None
    prompt_cache_key: str | None = None
    metadata_user_id: str | None = None
    user: str | None = None
    # Which conversation of the session: Claude Code's sub-agent id (`x-claude-code-agent-id`),
    # Codex's thread (`thread-id`; its main thread's equals the session id).
    agent_id: str | None = None
    thread_id: str | None = None


@dataclass(frozen=True)
class Conversation:
    messages: tuple[Message, ...]
    tools: tuple[ToolSpec, ...] = ()
    # "auto" | "none" | "required" | {"name": ...}; None means the client did not say.
    tool_choice: str | dict[str, Any] | None = None
    params: SamplingParams = SamplingParams()
    hints: SessionHints = SessionHints()
    model: str = ""
    stream: bool = False
    # OpenAI chat's stream_options.include_usage; the other APIs always report usage.
    stream_usage: bool = False
    # False: at most one tool call per answer (OpenAI parallel_tool_calls=false, Anthropic
    # tool_choice.disable_parallel_tool_use=true).
    parallel_tool_calls: bool = True
    # Structured output: None, {"type": "json_object"} or {"type": "json_schema", "name": str,
    # "schema": {...}, "strict": bool} (Chat response_format, Responses text.format).
    response_format: dict[str, Any] | None = None


@dataclass(frozen=True)
class Usage:
    prompt_tokens: int
    completion_tokens: int
    cached_tokens: int

    @property
    def total_tokens(self) -> int:
        return self.prompt_tokens + self.completion_tokens


# Events an engine turn yields to the API layer, in order: any number of ReasoningDelta, TextDelta
# and ToolCallDelta, then exactly one Finished.
@dataclass(frozen=True)
class TextDelta:
    text: str


@dataclass(frozen=True)
class ReasoningDelta:
    """Reasoning text (a model's <think>…</think>, an upstream's reasoning_content), never answer text."""

    text: str


@dataclass(frozen=True)
class ToolCallDelta:
    index: int
    call: ToolCall


@dataclass(frozen=True)
class Finished:
    finish_reason: FinishReason
    usage: Usage
    # Why generation stopped on a stop sequence, if it did (Anthropic reports it).
    stop_sequence: str | None = None


TurnEvent = ReasoningDelta | TextDelta | ToolCallDelta | Finished
