"""Build the configured relevance scorer; a drafter that cannot load falls back to BM25."""

from __future__ import annotations

import logging
from pathlib import Path

from engine.scorers import Bm25Scorer, Scorer
from gateway.config import Settings

log = logging.getLogger("pflash.scorer")


def head_scorer_or_fallback(settings: Settings, drafter_path: Path, *, n_threads: int | None = None,
                            n_gpu_layers: int = 0) -> Scorer:
    """The learned head on `drafter_path`; a head that is missing, malformed or trained on another
    drafter is reported once and replaced by the next best scorer: fusion, then bm25."""
    try:
        from engine.head import open_head_scorer

        scorer = open_head_scorer(settings.head, drafter_path, n_threads=n_threads, n_gpu_layers=n_gpu_layers)
        log.info("scorer head: %s on drafter %s, layer %d", settings.head or "shipped head", drafter_path.name,
                 scorer.drafter.layer)
        return scorer
    except Exception as exc:  # noqa: BLE001 - never fail start-up over the head
        head_error = exc
    try:
        from engine.drafter import DrafterScorer, FusionScorer

        fallback: Scorer = FusionScorer(DrafterScorer(drafter_path, n_threads=n_threads, n_gpu_layers=n_gpu_layers))
    except Exception as exc:  # noqa: BLE001 - the next fallback, bm25, needs nothing
        log.warning("relevance head unavailable (%s) and the drafter did not load (%s): scoring with bm25",
                    head_error, exc)
        return Bm25Scorer()
    log.warning("relevance head unavailable (%s): scoring with fusion instead", head_error)
    return fallback


def build_scorer(settings: Settings) -> Scorer:
    """The configured scorer; a drafter that fails to load falls back to BM25 (start-up never fails)."""
    if settings.scorer == "bm25":
        return Bm25Scorer()
    try:
        from engine.drafter import DrafterScorer, FusionScorer
        from engine.model_files import resolve_model

        # The drafter needs nothing from the served model: units are scored as text, each model
        # tokenizing with its own vocabulary, so token ids are never shared and any family fits.
        path = resolve_model(settings.drafter, settings.store_dir / "models")
        if settings.scorer == "head":  # the learned head; it falls back to fusion, then bm25, itself
            return head_scorer_or_fallback(settings, path, n_threads=settings.n_threads,
                                           n_gpu_layers=settings.n_gpu_layers)
        drafter = DrafterScorer(path, n_threads=settings.n_threads, n_gpu_layers=settings.n_gpu_layers)
    except Exception as exc:  # noqa: BLE001 - any load failure: BM25, never a failed start-up
        log.warning("drafter could not be loaded (%s): scoring with bm25 instead of %s", exc, settings.scorer)
        return Bm25Scorer()
    log.info("scorer %s: drafter %s, layer %d", settings.scorer, path.name, drafter.layer)
    return FusionScorer(drafter) if settings.scorer == "fusion" else drafter
