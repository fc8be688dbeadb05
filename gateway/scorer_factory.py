"""Build the configured relevance scorer; a drafter that cannot load falls back to BM25."""

from __future__ import annotations

import logging
from pathlib import Path

from engine.scorers import Bm25Scorer, Scorer
from gateway.config import Settings

log = logging.getLogger("pflash.scorer")


def build_scorer(settings: Settings, target_model: Path | None) -> Scorer:
    if settings.scorer == "bm25":
        return Bm25Scorer()
    try:
        from engine.drafter import DrafterScorer, FusionScorer
        from engine.model_files import resolve_model

        drafter_path = Path(settings.drafter) if settings.drafter else target_model
        if drafter_path is None:  # an upstream engine has no local target: use the embedded model
            drafter_path = resolve_model(None, settings.store_dir / "models")
        drafter = DrafterScorer(drafter_path)
        return FusionScorer(drafter) if settings.scorer == "fusion" else drafter
    except Exception as exc:  # never fail start-up over the drafter
        log.warning("drafter scorer unavailable (%s): using bm25", exc)
        return Bm25Scorer()
