from __future__ import annotations

import pytest

from policies.admission import Admission, admit


@pytest.mark.parametrize(
    ("tokens", "is_new", "role", "expected"),
    [
        (20000, True, "tool", Admission(True, "new_long_message")),
        (16384, True, "user", Admission(True, "new_long_message")),
        (16383, True, "tool", Admission(False, "below_threshold")),
        (0, True, "user", Admission(False, "below_threshold")),
        (50000, False, "tool", Admission(False, "history")),
        (50000, False, "user", Admission(False, "history")),
        (50000, True, "assistant", Admission(False, "role")),
        (50000, True, "system", Admission(False, "role")),
    ],
)
def test_admit(tokens: int, is_new: bool, role: str, expected: Admission) -> None:
    assert admit(tokens, 16384, is_new, role) == expected


def test_threshold_is_inclusive() -> None:
    assert admit(100, 100, True, "tool").compress
    assert not admit(99, 100, True, "tool").compress
