"""Role normalisation for chat templates that insist on strict user/assistant alternation.

Real agents send shapes such templates refuse: Codex puts `developer` messages mid-history,
an Anthropic assistant turn made only of thinking leaves two user turns side by side, and a
client may split one turn into several messages. `alternate_roles` rewrites such a conversation
into the shape those templates accept without losing any text: system text after the start
joins the next user turn, and consecutive user (or assistant) messages merge into one. It is a
pure function of the messages, so the same history always renders the same prompt.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

from policies.conversation import Message

# Between merged texts, as the API adapters join adjacent text blocks.
SEPARATOR = "\n\n"


def _join(first: str, second: str) -> str:
    return f"{first}{SEPARATOR}{second}" if first and second else first or second


def alternate_roles(messages: Sequence[Message]) -> tuple[Message, ...]:
    out: list[Message] = []
    held_system: list[str] = []  # mid-history system text waiting for the next user turn
    for message in messages:
        if message.role == "system":
            if all(m.role == "system" for m in out):  # still the leading system prompt
                out[:] = [Message("system", _join(out[0].content, message.content))] if out else [message]
            elif message.content:
                held_system.append(message.content)
            continue
        if message.role == "user" and held_system:
            message = replace(message, content=_join(SEPARATOR.join(held_system), message.content))
            held_system.clear()
        last = out[-1] if out else None
        if last is not None and message.role == last.role and message.role in ("user", "assistant"):
            out[-1] = replace(
                last,
                content=_join(last.content, message.content),
                tool_calls=(*last.tool_calls, *message.tool_calls),
            )
        else:
            out.append(message)
    if held_system:  # system text after the last user turn: a user turn of its own
        last = out[-1] if out else None
        if last is not None and last.role == "user":
            out[-1] = replace(last, content=_join(last.content, SEPARATOR.join(held_system)))
        else:
            out.append(Message("user", SEPARATOR.join(held_system)))
    return tuple(out)
