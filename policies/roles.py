"""Role normalisation for chat templates that insist on strict user/assistant alternation.

Real agents send shapes such templates refuse: Codex puts `developer` messages mid-history,
an Anthropic assistant turn made only of thinking leaves two user turns side by side, and a
client may split one turn into several messages. `alternate_roles` rewrites such a conversation
into the shape those templates accept without losing any text: system text after the start is
read as user text where it stands (Claude Code sends system reminders as role "system" turns,
sometimes last), and consecutive user (or assistant) messages merge into one. It is a pure
function of the messages, and appending messages never changes what came before but the last
merged turn, so the same history always renders the same prompt.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

from policies.conversation_types import Message

# Between merged texts, as the API adapters join adjacent text blocks.
SEPARATOR = "\n\n"


def _join(first: str, second: str) -> str:
    return f"{first}{SEPARATOR}{second}" if first and second else first or second


def alternate_roles(messages: Sequence[Message]) -> tuple[Message, ...]:
    out: list[Message] = []
    for message in messages:
        if message.role == "system":
            if all(m.role == "system" for m in out):  # still the leading system prompt
                out[:] = [Message("system", _join(out[0].content, message.content))] if out else [message]
                continue
            if not message.content:
                continue
            # Later system text is read as user text where it stands: a turn that comes later
            # never moves it, so the history renders the same bytes on every turn.
            message = Message("user", message.content)
        last = out[-1] if out else None
        if last is not None and message.role == last.role and message.role in ("user", "assistant"):
            out[-1] = replace(
                last,
                content=_join(last.content, message.content),
                tool_calls=(*last.tool_calls, *message.tool_calls),
            )
        else:
            out.append(message)
    return tuple(out)
