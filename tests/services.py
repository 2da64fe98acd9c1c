"""Real outside services for tests: redis-server, HAProxy and mmencode replicas as processes on loopback.

The binaries come from the distribution's packages (``.ci/run`` installs them). Outside CI a missing
binary skips the test that needs it, with the install command; under CI it fails the test.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from tests.helpers import free_port, wait_ready

__all__ = ["IMAGE_UID", "RedisServer", "Replica", "haproxy_serving", "python_as", "require_binary", "wait_port"]

# The Docker image's uid: the tests run as another user (root in CI) and read what mmencode wrote as this one.
IMAGE_UID = 10001


def require_binary(name: str, package: str) -> str:
    path = shutil.which(name) or next(
        (str(p) for p in (Path("/usr/sbin") / name, Path("/usr/bin") / name) if p.is_file()), None
    )
    if path is None:
        message = f"{name} is not installed: apt-get install -y {package} (.ci/run does)"
        if os.environ.get("CI"):
            pytest.fail(message)
        pytest.skip(message)
    return path


def wait_port(port: int, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), timeout=0.2):
            return
        time.sleep(0.05)
    raise TimeoutError(f"nothing listens on 127.0.0.1:{port} after {timeout}s")


@dataclass
class RedisServer:
    """``redis-server`` on a loopback port, without persistence, as the README recommends for the cache."""

    binary: str
    port: int = field(default_factory=free_port)
    process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> None:
        args = [self.binary, "--port", str(self.port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"]
        args += ["--maxmemory", "256mb", "--maxmemory-policy", "allkeys-lru", "--daemonize", "no"]
        self.process = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        wait_port(self.port)

    def kill(self) -> None:
        if self.process is not None:
            self.process.kill()
            self.process.wait(timeout=10)
            self.process = None

    def pause(self) -> None:
        """Still accepting connections, never answering: a hung or overloaded server."""
        assert self.process is not None
        self.process.send_signal(signal.SIGSTOP)

    def resume(self) -> None:
        assert self.process is not None
        self.process.send_signal(signal.SIGCONT)

    @contextlib.contextmanager
    def running(self) -> Iterator[RedisServer]:
        self.start()
        try:
            yield self
        finally:
            if self.process is not None:
                self.process.send_signal(signal.SIGCONT)
            self.kill()


@dataclass
class Replica:
    """One ``mmencode serve`` process: what an operator runs per GPU."""

    args: list[str]
    env: dict[str, str]
    port: int = field(default_factory=free_port)
    process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> None:
        command = [sys.executable, "-m", "mmencode", "serve", "--port", str(self.port), *self.args]
        env = {**os.environ, "HF_HUB_OFFLINE": "1", **self.env}
        self.process = subprocess.Popen(command, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)

    def wait_ready(self, timeout: float = 120) -> None:
        wait_ready(self.url, timeout=timeout)

    def kill(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.kill()
            self.process.wait(timeout=30)

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.kill()


def python_as(uid: int, code: str, *args: str) -> subprocess.CompletedProcess[str]:
    """``python3 -c code args`` as another uid and group, no supplementary groups (needs root and setpriv)."""
    return subprocess.run(
        ["setpriv", f"--reuid={uid}", f"--regid={uid}", "--clear-groups", "/usr/bin/env", "python3", "-c", code, *args],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip


@contextlib.contextmanager
def haproxy_serving(
    config_files: list[Path], *, env: dict[str, str], port: int, cwd: Path | None = None
) -> Iterator[str]:
    """Real haproxy on the given config files, checked first (``-c``), until the block ends; yields its URL."""
    binary = require_binary("haproxy", "haproxy")
    command = [binary, *(part for path in config_files for part in ("-f", str(path)))]
    subprocess.run([*command, "-c", "-q"], env=env, cwd=cwd, check=True)
    process = subprocess.Popen(
        [*command, "-db"], env=env, cwd=cwd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    try:
        wait_port(port)
        yield f"http://127.0.0.1:{port}"
    finally:
        process.terminate()
        process.wait(timeout=10)
