"""Prefill and decode rates of the two embedded models at 2K / 8K / 16K / 30K prompt tokens: what
the instruct default (Qwen2.5-Coder-0.5B-Instruct) costs against the fast Gemma 3 270M.

The model alone, in process (llama-cpp-python, the gateway's engine settings: f16 KV, n_batch =
n_ubatch = 512, all cores), on a prompt of real code from this repository, so both tokenizers see
the same text. Decode is 32 greedy tokens after the prompt.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from pathlib import Path

from benchmarks.common import ROOT, BenchContext, Section, md_table

TITLE = "Prefill rate: Qwen2.5-Coder-0.5B-Instruct (served default) vs Gemma 3 270M"
SIZES = (2048, 8192, 16384, 30720)
QUICK_SIZES = (512, 2048)
DECODE_TOKENS = 32


@dataclass(frozen=True)
class Rate:
    model: str
    tokens: int
    prefill_s: float
    decode_s: float

    @property
    def prefill_rate(self) -> float:
        return self.tokens / self.prefill_s

    @property
    def decode_rate(self) -> float:
        return DECODE_TOKENS / self.decode_s


def code_text() -> str:
    """Real source text, long enough for 30K tokens in either vocabulary."""
    files = sorted(p for d in ("engine", "gateway", "sessions", "policies") for p in (ROOT / d).glob("*.py"))
    return "\n\n".join(p.read_text(encoding="utf-8") for p in files)


def measure(model_path: Path, label: str, sizes: tuple[int, ...], text: str) -> list[Rate]:
    import llama_cpp

    threads = os.cpu_count() or 1
    llm = llama_cpp.Llama(model_path=str(model_path), n_ctx=max(sizes) + DECODE_TOKENS + 16, n_batch=512,
                          n_ubatch=512, n_threads=threads, n_threads_batch=threads, swa_full=False, verbose=False)
    all_tokens = llm.tokenize(text.encode("utf-8"), add_bos=True, special=False)
    rates = []
    for size in sizes:
        if len(all_tokens) < size:
            raise RuntimeError(f"the code text has only {len(all_tokens)} tokens for {label}, {size} asked")
        llm.reset()
        llm._ctx.kv_cache_clear()
        started = time.perf_counter()
        llm.eval(all_tokens[:size])
        prefilled = time.perf_counter()
        sampler = llm._init_sampler(temp=0.0)
        for _ in range(DECODE_TOKENS):
            token = sampler.sample(llm._ctx, -1)
            llm.eval([token])
        rates.append(Rate(label, size, prefilled - started, time.perf_counter() - prefilled))
    llm.close()
    return rates


def run(ctx: BenchContext) -> Section:
    from engine.model_parts import GEMMA_3_270M, QWEN_CODER_05B, assemble

    sizes = QUICK_SIZES if ctx.quick else SIZES
    text = code_text()
    models = [(QWEN_CODER_05B.label, assemble(QWEN_CODER_05B, ctx.cache_dir / "models")),
              (GEMMA_3_270M.label, assemble(GEMMA_3_270M, ctx.cache_dir / "models"))]
    rates = {label: measure(path, label, sizes, text) for label, path in ctx.progress(models, "prefill")}
    qwen, gemma = rates[QWEN_CODER_05B.label], rates[GEMMA_3_270M.label]
    rows = [[f"{q.tokens:,}", f"{q.prefill_s:.1f}", f"{q.prefill_rate:,.0f}", f"{q.decode_rate:.1f}",
             f"{g.prefill_s:.1f}", f"{g.prefill_rate:,.0f}", f"{g.decode_rate:.1f}",
             f"{q.prefill_s / g.prefill_s:.1f}×"] for q, g in zip(qwen, gemma)]
    table = md_table(["prompt tokens", "Qwen prefill s", "Qwen tok/s", "Qwen decode tok/s", "Gemma prefill s",
                      "Gemma tok/s", "Gemma decode tok/s", "Qwen / Gemma time"], rows)
    return Section(TITLE, model=f"{QWEN_CODER_05B.label} and {GEMMA_3_270M.label}", markdown=(
        "Models: Qwen2.5-Coder-0.5B-Instruct Q4_K_M (what `make serve` runs) and Gemma 3 270M Q4_K_M (the "
        "drafter and the test suite's model), each alone in process with the gateway's engine settings "
        "(f16 KV, n_batch = n_ubatch = 512, all cores), prefilling the first N tokens of this repository's "
        f"own source in its own vocabulary, then decoding {DECODE_TOKENS} greedy tokens.\n\n" + table
        + "\nWhat the instruct default costs: the ratio column is its prefill time over Gemma's at the same "
        "prompt length. Session KV reuse means a follow-up turn prefills only its new tokens on either model.\n"
    ))
