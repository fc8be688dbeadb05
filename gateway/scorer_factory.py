"""Build the configured relevance scorer. A model that cannot load never fails start-up: the scorer
steps down (head → fusion → bm25; ranker, hybrid or embed → bm25) with one warning, and the step is
counted (`ScorerChoice.fallback`, exported as pflash_scorer_fallbacks). When the ranker's sentence
encoder cannot load, the ranker keeps its lexical weights and its recall gate steps down to BM25
(`gate_fallback`, pflash_gate_embedder_fallbacks)."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from engine.scoring.bundle import ScorerBundle, bundle_of
from engine.scoring.scorers import Bm25Scorer
from gateway.config import Settings

if TYPE_CHECKING:
    from engine.scoring.embedder import EmbeddingScorer
    from engine.scoring.fusion import FusionScorer

log = logging.getLogger("pflash.scorer")


@dataclass(frozen=True)
class ScorerChoice:
    scorers: ScorerBundle  # what the configured scorer (or its fallback) offers: engine/scoring/bundle.py
    fallback: str | None = None  # why the configured scorer was replaced, if it was
    gate_fallback: str | None = None  # why the recall gate's encoder did not load (the gate uses BM25)


def head_scorer_or_fallback(settings: Settings, drafter_path: Path, *, n_threads: int | None = None,
                            n_gpu_layers: int = 0) -> ScorerChoice:
    """The learned head on `drafter_path` and the sentence encoder; a head that is missing, malformed
    or trained on another drafter, or an encoder that does not load, is reported once and replaced by
    the next best scorer: fusion, then bm25."""
    try:
        from engine.models.embedder_convert import embedder_path
        from engine.scoring.head import open_head_scorer

        encoder = embedder_path(settings.embedder, settings.store_dir / "models")
        scorer = open_head_scorer(settings.head, drafter_path, encoder, n_threads=n_threads,
                                  n_gpu_layers=n_gpu_layers)
        log.info("scorer head: %s on drafter %s, layer %d", settings.head or "shipped head", drafter_path.name,
                 scorer.drafter.layer)
        return ScorerChoice(bundle_of(scorer))
    except Exception as exc:  # noqa: BLE001 - never fail start-up over the head
        head_error = exc
    try:
        from engine.scoring.drafter import DrafterScorer
        from engine.scoring.fusion import FusionScorer

        fallback = FusionScorer(DrafterScorer(drafter_path, n_threads=n_threads, n_gpu_layers=n_gpu_layers))
    except Exception as exc:  # noqa: BLE001 - the next fallback, bm25, needs nothing
        log.warning("relevance head unavailable (%s) and the drafter did not load (%s): scoring with bm25",
                    head_error, exc)
        return ScorerChoice(bundle_of(Bm25Scorer()), f"head: {head_error}")
    log.warning("relevance head unavailable (%s): scoring with fusion instead", head_error)
    return ScorerChoice(bundle_of(fallback), f"head: {head_error}")


def _encoder(settings: Settings, unit_tokens: int | None = None) -> EmbeddingScorer:
    """The sentence encoder, reading `unit_tokens` word pieces of a unit (its own default when None)."""
    from engine.scoring.embedder import DEFAULT_UNIT_TOKENS, EmbeddingScorer
    from engine.models.embedder_convert import embedder_path

    path = embedder_path(settings.embedder, settings.store_dir / "models")
    log.info("scorer %s: sentence encoder %s", settings.scorer, path.name)
    return EmbeddingScorer(path, max_unit_tokens=unit_tokens or DEFAULT_UNIT_TOKENS,
                           n_gpu_layers=settings.n_gpu_layers)  # one thread: see LlamaEncoder


def _embedding_scorer(settings: Settings) -> EmbeddingScorer | FusionScorer:
    from engine.scoring.fusion import FusionScorer

    dense = _encoder(settings)
    return FusionScorer(dense, name="hybrid") if settings.scorer == "hybrid" else dense


def build_scorer(settings: Settings) -> ScorerChoice:
    """The configured scorer, or the fallback it steps down to (start-up never fails)."""
    if settings.scorer == "bm25":
        return ScorerChoice(bundle_of(Bm25Scorer()))
    if settings.scorer == "ranker":
        from engine.scoring.ranker import MEANING_UNIT_TOKENS, SHIPPED_RANKER, RankerError, RankerScorer, load_weights

        path = Path(settings.ranker) if settings.ranker else SHIPPED_RANKER
        try:
            model = load_weights(path)
        except RankerError as exc:
            log.warning("ranker unavailable (%s): scoring with bm25 instead", exc)
            return ScorerChoice(bundle_of(Bm25Scorer()), f"ranker: {exc}")
        dense, gate_fallback = None, None
        if settings.recall_embedder or settings.ranker_embedder:
            try:
                dense = _encoder(settings, MEANING_UNIT_TOKENS)  # as its weights were fitted
            except Exception as exc:  # noqa: BLE001 - lexical weights and a BM25 gate need no model
                log.warning("sentence encoder unavailable (%s): the ranker ranks by words alone and the recall gate "
                            "scores with bm25", exc)
                gate_fallback = f"embed: {exc}"
        ranker = RankerScorer(path, model=model, dense=dense, read_meaning=settings.ranker_embedder,
                              gate_meaning=settings.recall_embedder)
        return ScorerChoice(bundle_of(ranker), gate_fallback=gate_fallback)
    if settings.scorer in ("embed", "hybrid"):
        try:
            return ScorerChoice(bundle_of(_embedding_scorer(settings)))
        except Exception as exc:  # noqa: BLE001 - any load failure: BM25, never a failed start-up
            log.warning("sentence encoder unavailable (%s): scoring with bm25 instead of %s", exc, settings.scorer)
            return ScorerChoice(bundle_of(Bm25Scorer()), f"{settings.scorer}: {exc}")
    try:
        from engine.scoring.drafter import DrafterScorer
        from engine.scoring.fusion import FusionScorer
        from engine.models.files import resolve_model

        # The drafter needs nothing from the served model: units are scored as text, each model
        # tokenizing with its own vocabulary, so token ids are never shared and any family fits.
        path = resolve_model(settings.drafter, settings.store_dir / "models")
        if settings.scorer == "head":  # the learned head; it falls back to fusion, then bm25, itself
            return head_scorer_or_fallback(settings, path, n_threads=settings.n_threads,
                                           n_gpu_layers=settings.n_gpu_layers)
        drafter = DrafterScorer(path, n_threads=settings.n_threads, n_gpu_layers=settings.n_gpu_layers)
    except Exception as exc:  # noqa: BLE001 - any load failure: BM25, never a failed start-up
        log.warning("drafter could not be loaded (%s): scoring with bm25 instead of %s", exc, settings.scorer)
        return ScorerChoice(bundle_of(Bm25Scorer()), f"{settings.scorer}: {exc}")
    log.info("scorer %s: drafter %s, layer %d", settings.scorer, path.name, drafter.layer)
    return ScorerChoice(bundle_of((FusionScorer(drafter) if settings.scorer == "fusion" else drafter)))
