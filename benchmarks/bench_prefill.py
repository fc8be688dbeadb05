"""Prefill and decode rates of the two embedded models at 2K / 8K / 16K / 30K prompt tokens: what
the instruct default (Qwen2.5-Coder-0.5B-Instruct) costs against the fast Gemma 3 270M.

The model alone, in process (llama-cpp-python, the gateway's engine settings: f16 KV, n_batch =
n_ubatch = 512, all cores), on a prompt of real code from this repository, so both tokenizers see
the same text. Decode is 32 greedy tokens after the prompt.
"""

from __future__ import annotations

import os
import statistics
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from benchmarks.common import ROOT, BenchContext, Section, md_table, pyplot, savefig, spread

TITLE = "Prefill rate: Qwen2.5-Coder-0.5B-Instruct (served default) vs Gemma 3 270M"
SIZES = (2048, 8192, 16384, 30720)  # multiples of the 512-token batch
# The instruct model stops at 16K: its rate falls with length, and five prefills of 30K tokens
# would take it over an hour here, most of the suite's time for one row.
QWEN_LONGEST = 16384
QUICK_SIZES = (512, 1024)
DECODE_TOKENS = 32


REPS = 5


@dataclass(frozen=True)
class Rate:
    model: str
    tokens: int
    prefill_s: list[float]  # one per repetition: the time to have prefilled the first `tokens`
    decode_s: list[float]  # 32 greedy tokens after the longest prompt, one per repetition


def code_text() -> str:
    """Real source text, long enough for 30K tokens in either vocabulary."""
    files = sorted(p for d in ("engine", "gateway", "sessions", "policies") for p in (ROOT / d).glob("*.py"))
    return "\n\n".join(p.read_text(encoding="utf-8") for p in files)


def open_model(model_path: Path, n_ctx: int) -> Any:
    import llama_cpp

    threads = os.cpu_count() or 1
    return llama_cpp.Llama(model_path=str(model_path), n_ctx=n_ctx, n_batch=512, n_ubatch=512, n_threads=threads,
                           n_threads_batch=threads, swa_full=False, verbose=False)


def one_pass(llm: Any, tokens: list[int], sizes: tuple[int, ...]) -> tuple[list[float], float]:
    """Prefill the longest prompt once, in the engine's 512-token batches, reading the clock as it
    passes each size (a prefill of the first N tokens is exactly this work); then decode."""
    llm.reset()
    llm._ctx.kv_cache_clear()
    marks: list[float] = []
    started = time.perf_counter()
    for at in range(0, max(sizes), 512):
        llm.eval(tokens[at:min(at + 512, max(sizes))])
        if llm.n_tokens in sizes:
            marks.append(time.perf_counter() - started)
    prefilled = time.perf_counter()
    sampler = llm._init_sampler(temp=0.0)
    for _ in range(DECODE_TOKENS):
        llm.eval([sampler.sample(llm._ctx, -1)])
    return marks, time.perf_counter() - prefilled


def run(ctx: BenchContext) -> Section:
    from engine.models.parts import GEMMA_3_270M, QWEN_CODER_05B, assemble

    sizes, reps = (QUICK_SIZES, 2) if ctx.quick else (SIZES, REPS)
    sizes_of = {QWEN_CODER_05B.label: tuple(s for s in sizes if ctx.quick or s <= QWEN_LONGEST),
                GEMMA_3_270M.label: sizes}
    text = code_text()
    models = {m.label: open_model(assemble(m, ctx.cache_dir / "models"), max(sizes_of[m.label]) + DECODE_TOKENS + 16)
              for m in (QWEN_CODER_05B, GEMMA_3_270M)}
    prompts = {label: llm.tokenize(text.encode("utf-8"), add_bos=True, special=False) for label, llm in models.items()}
    for label, tokens in prompts.items():
        if len(tokens) < max(sizes_of[label]):
            raise RuntimeError(f"the code text has only {len(tokens)} tokens for {label}, {max(sizes_of[label])} asked")
    prefill: dict[str, list[list[float]]] = {label: [] for label in models}
    decode: dict[str, list[float]] = {label: [] for label in models}
    for rep in ctx.progress(range(reps), "prefill repetitions"):
        order = list(models) if rep % 2 == 0 else list(reversed(models))  # the models interleaved
        for label in order:
            marks, decode_s = one_pass(models[label], prompts[label], sizes_of[label])
            prefill[label].append(marks)
            decode[label].append(decode_s)
    for llm in models.values():
        llm.close()
    rates = {label: [Rate(label, size, [marks[i] for marks in prefill[label]], decode[label])
                     for i, size in enumerate(sizes_of[label])] for label in models}
    qwen = {r.tokens: r for r in rates[QWEN_CODER_05B.label]}

    def tok_s(r: Rate) -> str:
        per = sorted(r.tokens / t for t in r.prefill_s)
        return f"{statistics.median(per):,.0f} ({per[0]:,.0f}–{per[-1]:,.0f})"

    def decode_rate(r: Rate) -> str:
        return f"{DECODE_TOKENS / statistics.median(r.decode_s):.1f}"

    rows = []
    for g in rates[GEMMA_3_270M.label]:
        q = qwen.get(g.tokens)
        left = ([spread(q.prefill_s, 1), tok_s(q), decode_rate(q)] if q else ["not run", "", ""])
        ratio = f"{statistics.median(q.prefill_s) / statistics.median(g.prefill_s):.1f}×" if q else ""
        rows.append([f"{g.tokens:,}", *left, spread(g.prefill_s, 1), tok_s(g), decode_rate(g), ratio])
    table = md_table(["prompt tokens", "Qwen prefill s", "Qwen tok/s", "Qwen decode tok/s", "Gemma prefill s",
                      "Gemma tok/s", "Gemma decode tok/s", "Qwen / Gemma time"], rows)
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(6, 3.5))
    for label, series in rates.items():
        med = [r.tokens / statistics.median(r.prefill_s) for r in series]
        ax.plot([r.tokens for r in series], med, "o-", label=label)
    ax.set_xlabel("prompt tokens")
    ax.set_ylabel("prefill tokens/s (median)")
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3)
    plot = savefig(fig, ctx.plot_path("prefill_rate.png"))
    return Section(TITLE, model=f"{QWEN_CODER_05B.label} and {GEMMA_3_270M.label}", plots=[plot], markdown=(
        "Models: Qwen2.5-Coder-0.5B-Instruct Q4_K_M (what `make serve` runs) and Gemma 3 270M Q4_K_M (the "
        "drafter and the test suite's model), each in process with the gateway's engine settings "
        "(f16 KV, n_batch = n_ubatch = 512, all cores), prefilling this repository's own source in its own "
        f"vocabulary and then decoding {DECODE_TOKENS} greedy tokens. Each repetition prefills the longest "
        "prompt once and reads the clock as it passes each size (prefilling the first N tokens is exactly "
        f"that work); {reps} repetitions, the two models alternating which goes first. Times are median "
        "(min–max) in seconds; decode is the median after each model's longest prompt. Qwen stops at "
        f"{QWEN_LONGEST:,} tokens to keep this suite near half an hour; its rate falls with length, so longer "
        "prompts cost it more per token still.\n\n" + table
        + "\nWhat the instruct default costs: the ratio column is its prefill time over Gemma's at the same "
        "prompt length. Session KV reuse means a follow-up turn prefills only its new tokens on either model.\n\n"
        "![prefill rate](benchmarks/plots/prefill_rate.png)\n"
    ))
