"""Which message may be compressed: only a new, long tool output or user paste.

History is never compressed (it must be re-served byte-identically from its kept-line map, or
whole), and system/assistant text is never cut.
"""

from __future__ import annotations

from dataclasses import dataclass

DEFAULT_THRESHOLD = 16384

COMPRESSIBLE_ROLES = frozenset({"tool", "user"})

REASON_ADMITTED = "new_long_message"
REASON_HISTORY = "history"
REASON_ROLE = "role"
REASON_BELOW_THRESHOLD = "below_threshold"


@dataclass(frozen=True)
class Admission:
    compress: bool
    reason: str


def admit(message_tokens: int, threshold: int, is_new: bool, role: str) -> Admission:
    """Compress iff the message is new, from a tool or the user, and at least `threshold` tokens."""
    if not is_new:
        return Admission(False, REASON_HISTORY)
    if role not in COMPRESSIBLE_ROLES:
        return Admission(False, REASON_ROLE)
    if message_tokens < threshold:
        return Admission(False, REASON_BELOW_THRESHOLD)
    return Admission(True, REASON_ADMITTED)
