"""Fit the shipped scorer weights from ../shared/data: `python -m benchmarks.train ranker|head`.

Training reads the data splits (benchmarks/training/splits.json), so it lives beside the benchmarks and
never ships in the runtime package; its output is a file the gateway loads (`ranker = FILE`,
`head = FILE`).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from gateway.cli import add_settings_flags, settings_from
from gateway.config import Settings, SettingsError
from gateway.logs import setup_logging

DEFAULT_DATA = Path(__file__).resolve().parents[2] / "shared" / "data"  # beside a source checkout


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.train", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)

    ranker = sub.add_parser("ranker", help="fit the learned ranker (scorer = ranker)")
    ranker.add_argument("--out", type=Path, required=True, metavar="RANKER.json", help="where to write the weights")
    ranker.add_argument("--data", type=Path, default=DEFAULT_DATA, help="data directory (default: ../shared/data)")
    ranker.add_argument("--config", type=Path, default=None)
    add_settings_flags(ranker, ["store_dir", "drafter", "embedder"])

    head = sub.add_parser("head", help="train the learned relevance head (scorer = head)")
    head.add_argument("--out", type=Path, required=True, metavar="HEAD.gguf", help="where to write the head")
    head.add_argument("--data", type=Path, default=DEFAULT_DATA, help="data directory (default: ../shared/data)")
    head.add_argument("--sessions", type=int, default=40, help="coding sessions (train+validation) to build examples from")
    head.add_argument("--conversations", type=int, default=60, help="MTRAG conversations to build examples from")
    head.add_argument("--epochs", type=int, default=40, help="most training epochs (early stopping on validation)")
    head.add_argument("--seed", type=int, default=0, help="seed for the split, the initialization and the order")
    head.add_argument("--layer", type=int, default=8, help="drafter tap layer")
    head.add_argument("--config", type=Path, default=None)
    add_settings_flags(head, ["store_dir", "model", "drafter", "embedder", "n_threads"])
    return parser


def _drafter_and_encoder(settings: Settings) -> tuple[Path, Path] | None:
    """The drafter and sentence-encoder files training reads, or None (error printed)."""
    from engine.models.embedder_convert import EmbedderConversionError, embedder_path
    from engine.models.files import ModelFileError, resolve_model

    try:  # token counts (segmentation, budgets) by the drafter's vocabulary, as the benchmarks count
        return (resolve_model(settings.drafter, settings.store_dir / "models"),
                embedder_path(settings.embedder, settings.store_dir / "models"))
    except (ModelFileError, EmbedderConversionError) as exc:
        print(f"train: {exc}", file=sys.stderr)
        return None


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        settings = settings_from(args)
    except SettingsError as exc:
        print(f"train: {exc}", file=sys.stderr)
        return 2
    setup_logging(settings.log_format, settings.log_level)
    files = _drafter_and_encoder(settings)
    if files is None:
        return 2
    if args.command == "ranker":
        from benchmarks.training.ranker_train import run_train_ranker

        return run_train_ranker(args.out, args.data, *files)
    from benchmarks.training.head_train import run_train_head

    return run_train_head(args.out, args.data, *files, sessions=args.sessions, conversations=args.conversations,
                          epochs=args.epochs, seed=args.seed, layer=args.layer, n_threads=settings.n_threads,
                          cache_dir=settings.store_dir / "cache")


if __name__ == "__main__":
    sys.exit(main())
