"""`pflash-gateway compress`: the serving compression pipeline on one message, for previews and
for comparing scorers at equal budgets (--keep-ratio)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from engine.models.files import resolve_model
from engine.tokenizer import GgufTokenizer
from gateway.compressor import CompressionSettings, MessageCompressor
from gateway.config import Settings
from gateway.scorer_factory import build_scorer
from policies.admission import admit
from policies.conversation_types import Message
from policies.rendering import split_lines


def run_compress(settings: Settings, input_path: Path, request_path: Path | None, keep_ratio: float | None,
                 as_json: bool) -> int:
    try:
        text = input_path.read_text(encoding="utf-8")
        request = request_path.read_text(encoding="utf-8") if request_path else ""
    except (OSError, UnicodeDecodeError) as exc:
        print(f"pflash-gateway: cannot read input: {exc}", file=sys.stderr)
        return 2
    if keep_ratio is not None and not 0 < keep_ratio <= 1:
        print("pflash-gateway: --keep-ratio must be in (0, 1]", file=sys.stderr)
        return 2
    model = resolve_model(settings.model, settings.store_dir / "models")
    tokenizer = GgufTokenizer(model)
    scorers = build_scorer(settings).scorers
    compressor = MessageCompressor(tokenizer.count_tokens, scorers, CompressionSettings(
        settings.threshold, settings.budget_curve, settings.min_segment, settings.max_segment,
        settings.request_tokens, settings.fallback_spread))
    messages = [Message("user", request), Message("tool", text, tool_call_id="call_preview")]
    tokens = tokenizer.count_tokens(text)
    admission = admit(tokens, settings.threshold, True, "tool")
    if admission.compress or keep_ratio is not None:
        plan, report = compressor.compress(messages, 1, tokens, keep_ratio)
        compressed, reason, out_text = plan.compressed, plan.reason, plan.text if plan.compressed else text
        ranges = [[a + 1, b + 1] for a, b in plan.kept_ranges] if plan.compressed else [[1, len(split_lines(text))]]
        kept_tokens, timings = plan.kept_tokens, {"scorer_s": report.scorer_seconds, "total_s": report.total_seconds}
    else:
        compressed, reason, out_text = False, admission.reason, text
        ranges, kept_tokens, timings = [[1, len(split_lines(text))]], tokens, {}
    if as_json:
        print(json.dumps({
            "compressed": compressed, "reason": reason, "scorer": scorers.name,
            "total_lines": len(split_lines(text)), "total_tokens": tokens, "kept_tokens": kept_tokens,
            "kept_ranges": ranges, "text": out_text, "timings": timings,
        }, ensure_ascii=False))
    else:
        sys.stdout.write(out_text)
        print(f"\n-- {'compressed' if compressed else 'not compressed'} ({reason}); {kept_tokens} of {tokens} "
              f"tokens; scorer {scorers.name}", file=sys.stderr)
    return 0
