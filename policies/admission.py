"""Which message may be compressed: only a new, long tool output or user paste.

History is never compressed (it must be re-served byte-identically from its kept-line map, or
whole), and system/assistant text is never cut.
"""

from __future__ import annotations

from dataclasses import dataclass

DEFAULT_THRESHOLD = 16384

COMPRESSIBLE_ROLES = frozenset({"tool", "user"})
# A one-shot side request that cannot fit the context whole may have its system text cut too:
# nothing is cached for it, and whole is not an option (gateway/turns.py).
ONE_SHOT_ROLES = COMPRESSIBLE_ROLES | {"system"}

REASON_ADMITTED = "new_long_message"
REASON_HISTORY = "history"
REASON_ROLE = "role"
REASON_BELOW_THRESHOLD = "below_threshold"


@dataclass(frozen=True)
class Admission:
    compress: bool
    reason: str


def admit(message_tokens: int, threshold: int, is_new: bool, role: str,
          roles: frozenset[str] = COMPRESSIBLE_ROLES) -> Admission:
    """Compress iff the message is new, of one of `roles` (a tool or the user), and at least
    `threshold` tokens."""
    if not is_new:
        return Admission(False, REASON_HISTORY)
    if role not in roles:
        return Admission(False, REASON_ROLE)
    if message_tokens < threshold:
        return Admission(False, REASON_BELOW_THRESHOLD)
    return Admission(True, REASON_ADMITTED)
