"""Every measured figure README quotes (a share `N %`, a ratio `N×`) has a source: a figure of the
same unit in BENCHMARKS.md, or a selection metric the shipped ranker records (`info` in
engine/models/rankers/ranker.json, a share of 1 quoted as a percentage), that rounds to it.

A README number left behind when a benchmark moved, or one from a run that was never published,
fails here. (A figure can still match an unrelated source figure by coincidence: this catches
stale and unsourced numbers, not misattributed ones.)
Model: none (no model is loaded).
"""

from __future__ import annotations

import json
import re
from decimal import ROUND_HALF_EVEN, ROUND_HALF_UP, Decimal
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
FIGURE = re.compile(r"(\d[\d,]*(?:\.\d+)?)\s?(×|%)")


def figures(text: str) -> list[tuple[str, str, int]]:
    """(number as written, unit, line) of every share and ratio in `text`."""
    return [(m.group(1), m.group(2), text.count("\n", 0, m.start()) + 1) for m in FIGURE.finditer(text)]


def ranker_metrics(node: object) -> list[Decimal]:
    """Every share the shipped ranker's training info records, as a percentage."""
    if isinstance(node, dict):
        return [v for child in node.values() for v in ranker_metrics(child)]
    if isinstance(node, float) and 0 < node <= 1:
        return [Decimal(str(node)) * 100]
    return []


def sources() -> dict[str, list[Decimal]]:
    found: dict[str, list[Decimal]] = {"×": [], "%": []}
    for number, unit, _ in figures((ROOT / "BENCHMARKS.md").read_text(encoding="utf-8")):
        found[unit].append(Decimal(number.replace(",", "")))
    info = json.loads((ROOT / "engine/models/rankers/ranker.json").read_text(encoding="utf-8"))["info"]
    found["%"] += ranker_metrics(info)
    return found


def rounds_to(source: Decimal, written: str) -> bool:
    """`source` written at `written`'s precision is `written` (a half rounded up or to even)."""
    target = Decimal(written.replace(",", ""))
    quantum = Decimal(1).scaleb(target.as_tuple().exponent)  # type: ignore[arg-type]
    return target in (source.quantize(quantum, ROUND_HALF_UP), source.quantize(quantum, ROUND_HALF_EVEN))


def test_rounding_is_judged_at_the_written_precision() -> None:
    assert rounds_to(Decimal("4.21"), "4.2") and rounds_to(Decimal("95.31"), "95.3")
    assert rounds_to(Decimal("194"), "194") and rounds_to(Decimal("0.965"), "0.97")
    assert rounds_to(Decimal("95.3"), "95") and rounds_to(Decimal("0.5"), "0")  # to even
    assert not rounds_to(Decimal("4.26"), "4.2") and not rounds_to(Decimal("95.6"), "95")


def unsourced(text: str, known: dict[str, list[Decimal]]) -> list[str]:
    """`line: figure` of each figure in `text` that no known source rounds to."""
    return [f"{line}: {number}{unit}" for number, unit, line in figures(text)
            if not any(rounds_to(s, number) for s in known[unit])]


def test_every_readme_figure_has_a_source() -> None:
    missing = unsourced((ROOT / "README.md").read_text(encoding="utf-8"), sources())
    assert not missing, "README.md figures with no source in BENCHMARKS.md or the shipped ranker:\n" + "\n".join(missing)


def test_a_stale_figure_fails() -> None:
    # README's resume ratio as it stood before the resume section was rerun, beside a sourced one.
    text = "Resumes 133× sooner.\nA new session answers 4.2× sooner."
    assert unsourced(text, sources()) == ["1: 133×"]
