"""``mmencode``: ``serve`` the API, or ``make-tiny`` checkpoints. Every serve flag is a Settings field."""

from __future__ import annotations

import argparse
import logging
import sys
import typing
from collections.abc import Sequence
from types import FrameType
from typing import Any

from pydantic import ValidationError
from pydantic_core import PydanticUndefined

from app.config import Settings
from models.catalog import TINY_FAMILIES, catalog_text

__all__ = ["main"]


def _flag_help(name: str, info: Any) -> str:
    if info.default_factory is not None:
        default = "computed"
    elif info.default is PydanticUndefined or info.default is None:
        default = "unset"
    else:
        default = info.default
    parts = [info.description or "", f"[default: {default}; env MMENCODE_{name.upper()}]"]
    return " ".join(part for part in parts if part)


def _add_settings_flags(parser: argparse.ArgumentParser) -> None:
    """One flag per Settings field; unset flags leave the environment's (or the default) value."""
    for name, info in Settings.model_fields.items():
        flag = "--" + name.replace("_", "-")
        kwargs: dict[str, Any] = {"dest": name, "default": None, "help": _flag_help(name, info)}
        annotation = info.annotation
        if annotation is bool:
            kwargs["action"] = argparse.BooleanOptionalAction
        elif typing.get_origin(annotation) is list:
            kwargs["type"] = lambda text: [part.strip() for part in text.split(",") if part.strip()]
            kwargs["metavar"] = "A,B"
        elif typing.get_origin(annotation) is typing.Literal:
            kwargs["choices"] = list(typing.get_args(annotation))
        parser.add_argument(flag, **kwargs)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="mmencode", description="Vision-encoder embeddings over HTTP.")
    commands = parser.add_subparsers(dest="command", required=True)
    serve = commands.add_parser(
        "serve",
        help="serve the HTTP API (default: the embedded tiny model on 127.0.0.1:8000)",
        description="Serve the HTTP API. Every option is also an MMENCODE_* environment variable.",
        epilog=catalog_text(),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    _add_settings_flags(serve)
    tiny = commands.add_parser("make-tiny", help="write a deterministic tiny checkpoint of one family")
    tiny.add_argument("directory")
    tiny.add_argument("--family", default="qwen2_vl", choices=TINY_FAMILIES)
    tiny.add_argument("--layout", default="full", choices=["full", "vision"], help="full VLM, or the tower alone")
    tiny.add_argument(
        "--processor-merge-size",
        type=int,
        default=2,
        help="qwen2_vl only: the processor's merge_size (1 makes a deliberately mismatched checkpoint)",
    )
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.command == "make-tiny":
        from models.tiny import build_tiny

        path = build_tiny(
            args.directory, args.family, layout=args.layout, processor_merge_size=args.processor_merge_size
        )
        print(path)
        return 0

    overrides = {
        name: value for name, value in vars(args).items() if name in Settings.model_fields and value is not None
    }
    try:
        settings = Settings(**overrides)
    except ValidationError as exc:
        print(f"mmencode: invalid settings:\n{exc}", file=sys.stderr)
        return 2
    if settings.model is not None:
        from models.optional import checkpoint_requirement

        # A dependency this process lacks cannot appear later: say so now rather than serve 503s forever.
        problem = checkpoint_requirement(settings.model)
        if problem is not None:
            print(f"mmencode: cannot serve {settings.model}: {problem}", file=sys.stderr)
            return 2
    return serve(settings)


def serve(settings: Settings) -> int:
    import uvicorn

    from app.main import create_app

    logging.basicConfig(
        level=settings.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s", stream=sys.stderr
    )
    app = create_app(settings)
    runtime = app.state.runtime

    class DrainingServer(uvicorn.Server):
        def handle_exit(self, sig: int, frame: FrameType | None) -> None:
            # Readiness turns 503 at the signal, before uvicorn waits for in-flight requests.
            runtime.begin_drain()
            super().handle_exit(sig, frame)

    config = uvicorn.Config(
        app,
        host=settings.host,
        port=settings.port,
        log_level=settings.log_level,
        access_log=False,  # mmencode.access logs one line per request, with its id
        timeout_graceful_shutdown=30,
        timeout_keep_alive=settings.keep_alive_timeout,
    )
    DrainingServer(config).run()
    return 0


if __name__ == "__main__":
    sys.exit(main())
