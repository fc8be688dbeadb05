"""Per-request values that agents inject into their system prompt, removed so the prefix cache holds.

A prefix cache reuses KV only up to the first token that differs from a prompt already computed.
Anything that changes on every request or in every session near the top of the prompt (the
system prompt is the top) therefore forces a full prefill of everything after it: every turn, and
in every new session, of a prefix all sessions share. Some agents put such values there for their
provider's billing or telemetry; they mean nothing to the model.

Each rule below is narrow on purpose: it names the exact line it applies to and leaves every
other byte alone. Text that carries meaning for the model (a date, a working directory, a git
status, a model name) is never touched, even when it changes: the model should see it. Pure
functions, no I/O.
"""

from __future__ import annotations

import re

# Rule 1: Claude Code's billing header.
#
# Claude Code (2.1.x) opens its first system block with one line such as
#     x-anthropic-billing-header: cc_version=2.1.328.01c; cc_entrypoint=cli; cch=36ee5;
# `cch` is an attestation value that changes on every request, and the three hex digits after the
# version are a hash of a few characters of the session's first user message, so they differ
# between sessions and between sub-agents spawned with different tasks. Either one breaks the
# prefix shared by every session at its first tokens. The line is addressed to Anthropic's
# billing, not to the model, and no other server's model reads it (SGLang and vLLM-MLX drop it
# too), so the whole line goes, with the line breaks after it. Applied only to a line that starts
# with the header name, so the same text quoted elsewhere (a user pasting a log) is left alone.
_BILLING_LINE = re.compile(r"^x-anthropic-billing-header:[^\n]*(?:\n+|$)", re.MULTILINE | re.IGNORECASE)


def strip_volatile_system(text: str) -> str:
    """`text` (a system prompt) without the per-request values of the rules above.

    Idempotent; text without any such value is returned unchanged (the same object).
    """
    if "x-anthropic-billing-header" not in text.lower():
        return text  # the common case, and cheap: no regex over a long prompt
    return _BILLING_LINE.sub("", text)
