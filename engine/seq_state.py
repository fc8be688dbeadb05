"""One sequence's KV state out of a llama.cpp context and back (llama.cpp's sequence state API).

A state saved from one sequence restores into any sequence of a context of the same model, cache
settings and sequence count (llama.cpp writes the count of KV streams into it): the single-sequence
engine uses sequence 0, the batched engine the sequence a session is bound to. The engines put the
sequence count in their fingerprint, so a store never offers a state the context cannot take.
"""

from __future__ import annotations

import ctypes
import logging
from collections.abc import Sequence
from typing import Any

import numpy as np

from engine.base import SavedState, StateTier

log = logging.getLogger("pflash.engine")


def save_sequence(lib: Any, ctx: Any, seq: int, tokens: Sequence[int], tier: StateTier | None) -> SavedState | None:
    """A copy of the sequence's state covering `tokens`; None (logged) when llama.cpp copied less
    than the size it gave: a short copy would restore as a wrong state, or not at all."""
    size = lib.llama_state_seq_get_size(ctx, seq)
    # numpy's buffer, filled by llama.cpp in place: a ctypes array is zero-filled and string_at
    # copies it again, both holding the GIL (30-300 ms for a 58 MB state here, the event loop
    # frozen meanwhile). The tier's buffers are reused: fresh memory's first touch costs a VM
    # ~1.5 ms per MB.
    buf = tier.buffer(size) if tier is not None else np.empty(size, dtype=np.uint8)
    written = lib.llama_state_seq_get_data(ctx, (ctypes.c_uint8 * size).from_buffer(buf), size, seq) if size else 0
    if size == 0 or written != size:
        log.warning("state copy of sequence %d failed (%d of %d bytes, %d tokens): not kept", seq, written, size,
                    len(tokens))
        return None
    return SavedState(tuple(int(t) for t in tokens), memoryview(buf[:written]))


def restore_sequence(lib: Any, ctx: Any, seq: int, state: SavedState, n_ctx: int) -> bool:
    """Put `state` into sequence `seq` (emptied first); False if it does not fit or does not restore
    exactly the positions its token ids claim (the caller then prefills in full)."""
    memory = lib.llama_get_memory(ctx)
    lib.llama_memory_seq_rm(memory, seq, -1, -1)
    n = len(state.tokens)
    if n == 0 or n > n_ctx:
        return False
    kind = ctypes.c_uint8 * len(state.blob)
    # llama.cpp only reads the buffer; ctypes wants a writable one to share it without a copy.
    shared = isinstance(state.blob, memoryview) and not state.blob.readonly
    buf = kind.from_buffer(state.blob) if shared else kind.from_buffer_copy(state.blob)
    if lib.llama_state_seq_set_data(ctx, buf, len(state.blob), seq) == 0:
        return False
    return bool(lib.llama_memory_seq_pos_max(memory, seq) == n - 1)


def rollback_limits(window: int, n_ctx: int, n_ubatch: int, swa_full: bool) -> tuple[int, int]:
    """How many tokens a sequence's cache may be cut back: (the live context, a restored state).

    Without a sliding window, anywhere. A sliding-window cache keeps the window plus one batch,
    so half a batch at most: further silently corrupts its sliding layers (tests/test_agent_errors_e2e.py).
    A full-size one (swa_full) is cut anywhere while live, but a state restored from a save and cut
    back 720 tokens answered otherwise than a cold prefill (measured on Gemma 3): half a batch there too."""
    if window == 0:
        return n_ctx, n_ctx
    windowed = max(0, min(window, n_ubatch) // 2)
    return (n_ctx if swa_full else windowed), windowed
