"""Run text through llama.cpp's own grammar engine, with only the model's vocabulary loaded.

A grammar sampler masks every token that cannot continue the grammar; feeding a text's tokens one
by one (and asking whether end-of-generation may follow) tells whether the grammar accepts the
text, exactly as the engine would while sampling, without evaluating the model.
"""

from __future__ import annotations

import ctypes
import math
from pathlib import Path

import llama_cpp


class GrammarChecker:
    def __init__(self, model_path: Path) -> None:
        self._llm = llama_cpp.Llama(model_path=str(model_path), vocab_only=True, verbose=False)
        self._vocab = llama_cpp.llama_model_get_vocab(self._llm.model)
        self._eos = llama_cpp.llama_vocab_eos(self._vocab)

    def _sampler(self, grammar: str) -> ctypes.c_void_p | None:
        return llama_cpp.llama_sampler_init_grammar(self._vocab, grammar.encode("utf-8"), b"root")

    def compiles(self, grammar: str) -> bool:
        sampler = self._sampler(grammar)
        if not sampler:
            return False
        llama_cpp.llama_sampler_free(sampler)
        return True

    def _allowed(self, sampler: ctypes.c_void_p, token: int) -> bool:
        data = (llama_cpp.llama_token_data * 1)(llama_cpp.llama_token_data(token, 0.0, 0.0))
        candidates = llama_cpp.llama_token_data_array(data, 1, -1, False)
        llama_cpp.llama_sampler_apply(sampler, ctypes.byref(candidates))
        return not math.isinf(data[0].logit)

    def accepts(self, grammar: str, text: str, complete: bool = True) -> bool:
        """Whether `text` is a prefix the grammar allows (and, with `complete`, a whole answer)."""
        sampler = self._sampler(grammar)
        assert sampler, "grammar does not compile"
        try:
            for token in self._llm.tokenize(text.encode("utf-8"), add_bos=False, special=False):
                if not self._allowed(sampler, token):
                    return False
                llama_cpp.llama_sampler_accept(sampler, token)  # only ever an allowed token: never aborts
            return not complete or self._allowed(sampler, self._eos)
        finally:
            llama_cpp.llama_sampler_free(sampler)
