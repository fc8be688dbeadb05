"""A sequence's state copy is kept only when llama.cpp copied all of it.
Model: none (a stand-in for llama.cpp's two state calls)."""

from __future__ import annotations

import ctypes
from typing import Any

import pytest

from engine.seq_state import save_sequence


class FakeLib:
    def __init__(self, size: int, copies: int) -> None:
        self.size, self.copies = size, copies

    def llama_state_seq_get_size(self, ctx: Any, seq: int) -> int:
        return self.size

    def llama_state_seq_get_data(self, ctx: Any, buf: Any, size: int, seq: int) -> int:
        ctypes.memset(buf, 7, self.copies)
        return self.copies


def test_a_whole_copy_is_kept_with_its_tokens() -> None:
    state = save_sequence(FakeLib(64, 64), None, 0, [1, 2, 3], None)
    assert state is not None and state.tokens == (1, 2, 3) and bytes(state.blob) == b"\x07" * 64


@pytest.mark.parametrize("size, copies", [(64, 0), (64, 40), (0, 0)])
def test_a_failed_or_short_copy_is_not_a_state(size: int, copies: int, caplog: pytest.LogCaptureFixture) -> None:
    assert save_sequence(FakeLib(size, copies), None, 3, [1, 2, 3], None) is None
    assert "state copy of sequence 3 failed" in caplog.text
