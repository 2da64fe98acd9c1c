"""``mmencode``: ``serve`` the API, or ``make-tiny`` checkpoints. Every serve flag is a Settings field."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import gc
import ipaddress
import logging
import os
import socket
import sys
import typing
from collections.abc import Iterator, Sequence
from importlib.metadata import PackageNotFoundError, version
from types import FrameType
from typing import TYPE_CHECKING, Any

from pydantic import ByteSize, ValidationError
from pydantic_core import PydanticUndefined

from mmencode import __version__
from mmencode.app.config import Settings, misspelt_security_settings, unknown_environment
from mmencode.models.catalog import CATALOG, TINY_FAMILIES, catalog_text

if TYPE_CHECKING:
    from mmencode.app.engine.engine import Engine

__all__ = ["main", "tuned_for_serving"]


def _default_text(info: Any) -> str:
    """The default as a user would write it: the value a factory computes here, sizes with units."""
    default = info.get_default(call_default_factory=True)
    if default is PydanticUndefined or default is None or default == []:
        return "unset"
    if isinstance(default, ByteSize):
        for unit, size in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
            if default and default % size == 0:
                return f"{default // size}{unit}"
    return str(default)


def _flag_help(name: str, info: Any) -> str:
    default = _default_text(info)
    said = f"default: {default}; " if default != "unset" else ""  # the description says what unset means
    parts = [info.description or "", f"[{said}env MMENCODE_{name.upper()}]"]
    return " ".join(part for part in parts if part)


def _add_settings_flags(parser: argparse.ArgumentParser) -> None:
    """One flag per Settings field; unset flags leave the environment's (or the default) value."""
    for name, info in Settings.model_fields.items():
        flag = "--" + name.replace("_", "-")
        kwargs: dict[str, Any] = {"dest": name, "default": None, "help": _flag_help(name, info)}
        annotation = info.annotation
        if annotation is bool or annotation == bool | None:
            kwargs["action"] = argparse.BooleanOptionalAction
        elif typing.get_origin(annotation) is list:
            # Repeatable and comma-separated: --upstream A --upstream B,C gives [A, B, C].
            kwargs["type"] = lambda text: [part.strip() for part in text.split(",") if part.strip()]
            kwargs["action"] = "extend"
            kwargs["metavar"] = "A,B"
        elif typing.get_origin(annotation) is typing.Literal:
            kwargs["choices"] = list(typing.get_args(annotation))
        parser.add_argument(flag, **kwargs)


def _version_text() -> str:
    libraries = []
    for name in ("torch", "transformers"):
        try:
            libraries.append(f"{name} {version(name)}")
        except PackageNotFoundError:
            libraries.append(f"{name} not installed")
    return f"mmencode {__version__} ({', '.join(libraries)}, python {sys.version.split()[0]})"


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="mmencode", description="Vision-encoder embeddings over HTTP.")
    parser.add_argument("--version", action="version", version=_version_text())
    commands = parser.add_subparsers(dest="command", required=True)
    serve = commands.add_parser(
        "serve",
        help="serve the HTTP API (default: the embedded tiny model on 127.0.0.1:8000)",
        description="Serve the HTTP API. Every option is also an MMENCODE_* environment variable.",
        epilog=catalog_text(),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    _add_settings_flags(serve)
    tiny = commands.add_parser(
        "make-tiny",
        help="write a deterministic tiny checkpoint of one family",
        description="Write a tiny save_pretrained checkpoint of one family (seeded synthetic weights, its\n"
        "processor config) for tests and trials; `mmencode serve --model DIRECTORY` serves it. Its vectors\n"
        "mean nothing and its pixel budget is small.",
        epilog=_tiny_families_text(),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    tiny.add_argument("directory", help="where to write it; created if missing, refused if not empty (see --force)")
    tiny.add_argument(
        "--family",
        default="qwen2_vl",
        choices=TINY_FAMILIES,
        metavar="FAMILY",
        help=f"the model_type to build, one of: {', '.join(TINY_FAMILIES)} (default: qwen2_vl, the tower "
        "`mmencode serve` builds when given no --model)",
    )
    tiny.add_argument(
        "--layout",
        default="full",
        choices=["full", "vision", "servable"],
        help="full: a whole VLM checkpoint's layout (tower under its prefix, as hub repos ship it); "
        "vision: the tower alone; servable: the full VLM plus a small tokenizer with the family's special "
        "tokens, a chat template and the whole processor, which vLLM can serve (default: full)",
    )
    tiny.add_argument("--force", action="store_true", help="replace DIRECTORY even if it is not empty")
    tiny.add_argument(
        "--processor-merge-size",
        type=int,
        default=2,
        help="qwen2_vl only: the processor's merge_size (1 makes a deliberately mismatched checkpoint; default: 2)",
    )
    return parser


def _tiny_families_text() -> str:
    """One line per family make-tiny builds: what a precomputed item carries, and how rows are counted."""
    described = {info.model_type: info for info in CATALOG}
    width = max(len(family) for family in TINY_FAMILIES)
    lines = []
    for family in TINY_FAMILIES:
        info = described.get(family)
        said = f"metadata: {info.metadata}; rows: {info.rows}".replace("`", "") if info else ""
        lines.append(f"  {family:<{width}}  {said}{'  (default)' if family == 'qwen2_vl' else ''}")
    return "families (--family):\n" + "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.command == "make-tiny":
        from mmencode.models.tiny import build_tiny

        try:
            path = build_tiny(
                args.directory,
                args.family,
                layout=args.layout,
                processor_merge_size=args.processor_merge_size,
                overwrite=args.force,
            )
        except FileExistsError:
            print(
                f"mmencode make-tiny: {args.directory} is not empty; nothing was changed. "
                "Pass --force to replace it, or choose an empty or new directory.",
                file=sys.stderr,
            )
            return 1
        print(path)
        return 0

    security_typos = misspelt_security_settings(os.environ)
    for warning in unknown_environment(os.environ):
        if not any(typo.startswith(warning.split()[0] + " ") for typo in security_typos):
            print(f"mmencode: warning: {warning}", file=sys.stderr)
    overrides = {
        name: value for name, value in vars(args).items() if name in Settings.model_fields and value is not None
    }
    try:
        settings = Settings(**overrides)
    except ValidationError as exc:
        # Without the input values: they may hold an API key.
        for error in exc.errors(include_input=False, include_url=False):
            where = ".".join(str(part) for part in error["loc"])
            flag = f"--{where.replace('_', '-')}: " if where else ""
            print(f"mmencode: error: invalid setting {flag}{error['msg']}", file=sys.stderr)
        return 2
    if security_typos:
        if not settings.ignore_unknown_env:
            for typo in security_typos:
                print(f"mmencode: error: {typo}", file=sys.stderr)
            print(
                "mmencode: error: not starting; correct the variable's name, or pass --ignore-unknown-env "
                "(MMENCODE_IGNORE_UNKNOWN_ENV=1) to start without it",
                file=sys.stderr,
            )
            return 2
        for typo in security_typos:
            print(f"mmencode: warning: {typo} (starting anyway: --ignore-unknown-env)", file=sys.stderr)
    public = public_bind_warning(settings)
    if public is not None:
        print(f"mmencode: WARNING: {public}", file=sys.stderr)
    return serve(settings)


def public_bind_warning(settings: Settings) -> str | None:
    """The one warning for a service that other hosts can reach with no API key; ``None`` otherwise."""
    if _is_loopback(settings.host) or settings.api_keys():
        return None
    return (
        f"NO API KEY on a public address: --host {settings.host} accepts connections from other hosts, and "
        "without --api-key (MMENCODE_API_KEY, --api-key-file) anyone who reaches it can use the encoder and "
        "fetch cached embeddings by hash. Set a key, or keep --host 127.0.0.1 behind a proxy that checks one"
    )


def _is_loopback(host: str) -> bool:
    if host.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False  # a host name other than localhost may resolve to any interface


@contextlib.contextmanager
def tuned_for_serving(engine: Engine) -> Iterator[None]:
    """What ``mmencode serve`` changes in its process for speed under load (bench/README.md), and
    ``create_app`` never does: two apps in one process (tests) would change each other's. Enter it in the
    thread that runs the event loop. The loop's default executor is replaced once it runs (``serve``).

    - GC: what is alive once the model is loaded and warm (torch, transformers, the model: ~400k objects)
      is frozen, out of every later collection's walk, which paused the event loop 0.2-0.5 s each time;
      unfrozen on exit (the model may be garbage then, in a process that serves again);
    - torch ops in this thread (the event loop's) run serially, as in every thread but the encoder's
      (app/engine/threads.py); and MKL keeps the thread count each thread is given: ``torch.set_num_threads``
      turns MKL's dynamic adjustment off (process-wide), and no thread of the service calls it any more;
    - glibc's malloc keeps a forward's large blocks for the next instead of returning them to the OS
      (app/process/malloc.py), for the process's life.
    """
    import torch

    from mmencode.app.engine.threads import serial_torch_ops
    from mmencode.app.process.malloc import keep_large_blocks_in_heap

    keep_large_blocks_in_heap()
    torch.set_num_threads(torch.get_num_threads())  # the same count, for its process-wide MKL setting
    serial_torch_ops()
    engine.on_ready = freeze_loaded_objects
    try:
        yield
    finally:
        engine.on_ready = None
        gc.unfreeze()


def freeze_loaded_objects() -> None:
    """Move everything alive now out of GC's reach: a full collection then only walks what serving allocates."""
    gc.collect()
    gc.freeze()


def serve(settings: Settings) -> int:
    from mmencode.app.process.openmp import shorten_openmp_spin

    shorten_openmp_spin()  # read once, when torch loads its OpenMP runtime: before the imports below
    import uvicorn

    from mmencode.app.engine.engine import DRAIN_GRACE_S, Phase
    from mmencode.app.engine.threads import SerialTorchThreadPool
    from mmencode.app.peers.vllm.mooncake.transfer import MooncakeUnavailable
    from mmencode.app.server import create_app
    from mmencode.models import CheckpointError, check_checkpoint

    if settings.model is not None:
        # Fail before binding the port on what can be known now: a missing directory, a hub id, no weights.
        try:
            check_checkpoint(settings.model)
        except CheckpointError as exc:
            print(f"mmencode: error: {exc}", file=sys.stderr)
            return 2

    logging.basicConfig(
        level=settings.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s", stream=sys.stderr
    )
    # httpx logs every request mmencode makes at INFO: the front door's upstream health checks every few
    # seconds, forever. What matters of them is logged by mmencode once (an upstream leaving or joining
    # the rotation; the access line of each forwarded request), so httpx speaks only of its warnings.
    logging.getLogger("httpx").setLevel(max(logging.WARNING, logging.getLogger().level))
    try:
        app = create_app(settings)
    except MooncakeUnavailable as exc:
        print(f"mmencode: error: {exc}", file=sys.stderr)
        return 2
    engine = app.state.engine

    class DrainingServer(uvicorn.Server):
        def handle_exit(self, sig: int, frame: FrameType | None) -> None:
            # Readiness turns 503 at the signal, before uvicorn waits for in-flight requests.
            engine.begin_drain()
            super().handle_exit(sig, frame)

        async def serve(self, sockets: list[socket.socket] | None = None) -> None:
            # What reaches the loop's default executor (asyncio.to_thread) runs torch ops serially too.
            asyncio.get_running_loop().set_default_executor(SerialTorchThreadPool(thread_name_prefix="mmencode-aio"))
            await super().serve(sockets)

    config = uvicorn.Config(
        app,
        host=settings.host,
        port=settings.port,
        log_level=settings.log_level,
        access_log=False,  # mmencode.access logs one line per request, with its id
        timeout_graceful_shutdown=int(DRAIN_GRACE_S),
        timeout_keep_alive=settings.keep_alive_timeout,
        ssl_certfile=settings.ssl_certfile,
        ssl_keyfile=settings.ssl_keyfile,
    )
    server = DrainingServer(config)

    def stop_on_load_failure() -> None:
        # A server that can never become ready exits, so a restart policy or liveness probe can act.
        server.should_exit = True

    engine.on_failure = stop_on_load_failure
    with tuned_for_serving(engine):
        server.run()
    if engine.phase is Phase.FAILED:
        print(f"mmencode: error: the model failed to load: {engine.failure}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
