"""Per-request values that agents inject into their system prompt, removed so the prefix cache holds.

A prefix cache reuses a session's KV only up to the first token that differs from the last turn.
Anything that changes on every request near the top of the prompt (the system prompt is the top)
therefore forces a full prefill of everything after it, every turn. Some agents put such values
there for their provider's billing or telemetry; they mean nothing to the model.

Each rule below is narrow on purpose: it names the exact line it applies to and the exact field
it removes, and leaves every other byte alone. Text that carries meaning for the model (a date,
a working directory, a git status, a model name) is never touched, even when it changes: the
model should see it. Pure functions, no I/O.
"""

from __future__ import annotations

import re

# Rule 1: Claude Code's billing header.
#
# Claude Code (2.1.x) opens its first system block with one line such as
#     x-anthropic-billing-header: cc_version=2.1.177.01c; cc_entrypoint=cli; cch=36ee5;
# `cch` is an attestation value Anthropic's API checks for billing; it changes on every request.
# The line is not an instruction to the model, and no other server reads it. Only the `cch=`
# field is removed; `cc_version` and `cc_entrypoint` stay (they are stable within a session, so
# keeping them costs no cache and changes as little as possible of what the client sent).
# Applied only on a line that starts with the header name, so the same text quoted elsewhere
# (a user pasting a log, say) is left alone.
_BILLING_LINE = re.compile(r"^(x-anthropic-billing-header:[^\n]*)$", re.MULTILINE | re.IGNORECASE)
_CCH_FIELD = re.compile(r"[ \t]*\bcch=[^;\s]*;?")


def _drop_cch(match: re.Match[str]) -> str:
    return _CCH_FIELD.sub("", match.group(1)).rstrip(" \t")


def strip_volatile_system(text: str) -> str:
    """`text` (a system prompt) without the per-request values of the rules above.

    Idempotent; text without any such value is returned unchanged (the same object).
    """
    if "x-anthropic-billing-header" not in text.lower():
        return text  # the common case, and cheap: no regex over a long prompt
    return _BILLING_LINE.sub(_drop_cch, text)
