"""Token counting from a GGUF's vocabulary alone (no weights), for the CLI and upstream engines."""

from __future__ import annotations

from pathlib import Path


class GgufTokenizer:
    def __init__(self, model_path: Path) -> None:
        from llama_cpp import Llama

        self._llm = Llama(model_path=str(model_path), vocab_only=True, verbose=False)

    def count_tokens(self, text: str) -> int:
        return len(self._llm.tokenize(text.encode("utf-8"), add_bos=False, special=False))
