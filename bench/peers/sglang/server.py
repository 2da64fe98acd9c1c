"""A real SGLang 0.5.23 (from .venv-sglang, ``make sglang-env``) on loopback ports, and its answers.

SGLang serves on this CPU with the shims of shims.py, ``SGLANG_USE_CPU_ENGINE=1`` (else its scheduler
imports vLLM) and ``SGLANG_HOST_IP=127.0.0.1`` (else a language server tells its encoder to push to the
machine's network address), and the flags of :data:`CPU_FLAGS`. Each server runs in its own process
group (SGLang spawns a scheduler and a detokenizer), stopped with it.

Roles, as SGLang's encode/prefill split runs them:

- ``encoder``: ``--encoder-only``, SGLang's own encoder server (the reference mmencode is compared with);
- ``language``: ``--language-only``, a language server whose encoders are given with ``encoder_urls``
  or register themselves at its bootstrap port (``POST /register_encoder_url``).
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import httpx
import pytest

from bench.client import free_port

ROOT = Path(__file__).resolve().parents[3]
SGLANG_VENV = ROOT / ".venv-sglang"
STARTUP_TIMEOUT_S = 420
# What SGLang needs on a CPU (measured: docs/sglang.md):
# the torch-native attention and layers, no CUDA graphs, a fixed KV budget (on CPU the memory fraction
# comes from the machine's free memory, so small fractions fail at random under load), no warm-up
# request, and float32 (`auto` serves a float32 checkpoint as float16).
CPU_FLAGS = (
    "--device", "cpu",
    "--attention-backend", "torch_native",
    "--disable-cuda-graph",
    "--mem-fraction-static", "0.5",
    "--max-total-tokens", "2048",
    "--skip-server-warmup",
)  # fmt: skip
Transport = Literal["zmq_to_scheduler", "zmq_to_tokenizer"]


def sglang_python() -> Path:
    """.venv-sglang's python; a missing environment fails under CI (CI=true) and skips elsewhere."""
    python = SGLANG_VENV / "bin" / "python"
    if not (SGLANG_VENV / ".installed").is_file() or not python.is_file():
        message = f"{SGLANG_VENV} is missing: build it with `make sglang-env` (make test does)"
        if os.environ.get("CI", "").lower() == "true":
            pytest.fail(message)
        pytest.skip(message)
    return python


@dataclass
class SGLangServer:
    url: str
    process: subprocess.Popen[bytes]
    log: Path
    bootstrap_port: int | None = None  # a language server's encoder registration port

    @property
    def bootstrap_url(self) -> str:
        assert self.bootstrap_port is not None, "not a language server"
        return f"http://127.0.0.1:{self.bootstrap_port}"

    def alive(self) -> bool:
        return self.process.poll() is None

    def log_tail(self, chars: int = 6000) -> str:
        return self.log.read_text(errors="replace")[-chars:]

    def log_text(self) -> str:
        return self.log.read_text(errors="replace")

    def encoder_urls(self) -> list[str]:
        """The encoders a language server dispatches to now (static and registered)."""
        answer = httpx.get(self.bootstrap_url + "/list_encoder_urls", timeout=10)
        answer.raise_for_status()
        return list(answer.json()["encoder_urls"])


@contextlib.contextmanager
def sglang_server(
    model: Path,
    log: Path,
    *,
    role: Literal["encoder", "language"],
    transport: Transport = "zmq_to_scheduler",
    encoder_urls: Sequence[str] = (),
    extra: Sequence[str] = (),
) -> Iterator[SGLangServer]:
    """``sglang.launch_server`` on 127.0.0.1 in ``role``; yields once ``/health`` answers 200."""
    python = sglang_python()
    port = free_port()
    command = [
        str(python), "-m", "sglang.launch_server",
        "--model-path", str(model),
        "--host", "127.0.0.1", "--port", str(port),
        "--dtype", "float32",
        *CPU_FLAGS,
    ]  # fmt: skip
    bootstrap_port = None
    if role == "encoder":
        # The encoder must speak the language server's transport (SGLang's own asserts a list of ports for
        # zmq_to_scheduler, runtime.py:1131; mmencode tells them apart per request).
        command += ["--encoder-only", "--encoder-transfer-backend", transport]
    else:
        bootstrap_port = free_port()
        # The checkpoint's own chat template (make-tiny's servable layout: OpenAI-style content parts; a template
        # that renders `content` as a string makes SGLang drop the images).
        command += ["--language-only", "--encoder-transfer-backend", transport]
        command += ["--encoder-bootstrap-port", str(bootstrap_port)]
        if encoder_urls:
            command += ["--encoder-urls", *encoder_urls]
    command += list(extra)
    env = {**os.environ, "SGLANG_USE_CPU_ENGINE": "1", "SGLANG_HOST_IP": "127.0.0.1", "PYTHONUNBUFFERED": "1"}
    env.pop("CUDA_VISIBLE_DEVICES", None)
    with log.open("wb") as sink:
        process = subprocess.Popen(
            command, stdout=sink, stderr=subprocess.STDOUT, env=env, cwd=log.parent, start_new_session=True
        )
    server = SGLangServer(f"http://127.0.0.1:{port}", process, log, bootstrap_port)
    try:
        _wait_healthy(server)
        yield server
    finally:
        _stop(process)


def _wait_healthy(server: SGLangServer) -> None:
    deadline = time.monotonic() + STARTUP_TIMEOUT_S
    while time.monotonic() < deadline:
        if not server.alive():
            raise RuntimeError(f"SGLang exited with {server.process.returncode} while starting:\n{server.log_tail()}")
        with contextlib.suppress(httpx.HTTPError):
            if httpx.get(server.url + "/health", timeout=2).status_code == 200:
                return
        time.sleep(0.5)
    raise TimeoutError(f"SGLang not healthy after {STARTUP_TIMEOUT_S}s:\n{server.log_tail()}")


def _stop(process: subprocess.Popen[bytes]) -> None:
    """SIGTERM to the server's process group (scheduler, detokenizer), SIGKILL if it lingers."""
    if process.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGTERM)
        try:
            process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGKILL)
            process.wait(timeout=30)
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(process.pid, signal.SIGKILL)


@dataclass(frozen=True)
class Answer:
    """Greedy tokens, the prompt's length, and per position the top-5 (token, logprob) pairs."""

    prompt_tokens: int
    tokens: list[str]
    top: list[dict[str, float]]

    def max_logprob_difference(self, other: Answer) -> float:
        """The largest difference between the two answers' logprobs for the same token at the same position."""
        return max(abs(mine[t] - theirs[t]) for mine, theirs in zip(self.top, other.top, strict=True) for t in mine)

    def same_top_tokens(self, other: Answer) -> bool:
        return [set(t) for t in self.top] == [set(t) for t in other.top]

    def moved_from(self, other: Answer, by: float = 1e-3) -> bool:
        """Another answer, not the same one within noise: other tokens, other top-5, or logprobs apart."""
        if self.tokens != other.tokens or not self.same_top_tokens(other):
            return True
        return self.max_logprob_difference(other) > by


PROMPT = "What is in these images?"


def chat_body(parts: Sequence[dict[str, Any]], *, max_tokens: int = 8) -> dict[str, Any]:
    return {
        "model": "default",
        "messages": [{"role": "user", "content": [*parts, {"type": "text", "text": PROMPT}]}],
        "max_tokens": max_tokens,
        "temperature": 0,
        "logprobs": True,
        "top_logprobs": 5,
        # Random weights: an early end-of-turn would leave fewer tokens to compare.
        "ignore_eos": True,
    }


def chat(server: SGLangServer, parts: Sequence[dict[str, Any]], *, max_tokens: int = 8) -> Answer:
    """One greedy chat completion over ``parts`` (image/video/audio parts) and a fixed question."""
    if not server.alive():
        raise RuntimeError(f"SGLang is not running:\n{server.log_tail()}")
    # Each comparison must run its own encode and prefill: nothing cached from the last request.
    httpx.post(server.url + "/flush_cache", timeout=30)
    response = httpx.post(
        server.url + "/v1/chat/completions", json=chat_body(parts, max_tokens=max_tokens), timeout=300
    )
    if response.status_code != 200:
        raise AssertionError(f"SGLang answered {response.status_code}: {response.text[:2000]}")
    body = response.json()
    content = body["choices"][0]["logprobs"]["content"]
    tokens = [entry["token"] for entry in content]
    top = [{t["token"]: t["logprob"] for t in entry["top_logprobs"]} for entry in content]
    return Answer(int(body["usage"]["prompt_tokens"]), tokens, top)


def register(language: SGLangServer, encoder_url: str) -> None:
    """Point a language server at one encoder: every other registered encoder is unregistered first."""
    for url in language.encoder_urls():
        if url != encoder_url:
            httpx.request("DELETE", language.bootstrap_url + "/unregister_encoder_url", json={"url": url}, timeout=10)
    if encoder_url not in language.encoder_urls():
        httpx.post(language.bootstrap_url + "/register_encoder_url", json={"url": encoder_url}, timeout=10)
    assert language.encoder_urls() == [encoder_url]


def dispatched_items(language: SGLangServer) -> int:
    """Encoder work the language server sent so far: its log's "Dispatching N mm items" (zmq_to_scheduler)
    and "Sending encode request to" lines (zmq_to_tokenizer). A language-only server with no encoder quietly
    encodes itself, so a test checks that this moved."""
    log = language.log_text()
    return sum(int(n) for n in re.findall(r"Dispatching (\d+) mm items", log)) + log.count("Sending encode request to")


def json_lines(text: str) -> list[dict[str, Any]]:
    return [json.loads(line) for line in text.splitlines() if line.startswith("{")]
