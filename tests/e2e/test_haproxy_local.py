"""The HAProxy recipe outside Docker: the shipped policy and local replica list, real haproxy, two real
``mmencode serve`` replicas on loopback; the balancer's own 503 is mmencode's error shape."""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import yaml

from mmencode.schemas.errors import ErrorResponse
from tests.helpers import Replica, data_uri, docs_text, free_port, haproxy_serving, noise_image

ROOT = Path(__file__).resolve().parents[2]
HAPROXY = ROOT / "deploy" / "haproxy"


def _directives(path: Path) -> list[str]:
    return [line.split("#")[0].strip() for line in path.read_text().splitlines() if line.split("#")[0].strip()]


def test_the_policy_listens_on_loopback_unless_told_otherwise() -> None:
    policy = _directives(HAPROXY / "haproxy.cfg")
    assert 'bind "${MMENCODE_LB_BIND-127.0.0.1:8000}"' in policy
    # Compose widens it on purpose (published through Docker's port mapping).
    compose = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
    assert compose["services"]["lb"]["environment"]["MMENCODE_LB_BIND"] == ":8000"
    mounts = compose["services"]["lb"]["volumes"]
    assert any(m.startswith("./deploy/haproxy/errors:/usr/local/etc/haproxy/errors") for m in mounts)


def test_the_docs_give_the_haproxy_line_for_bare_replicas() -> None:
    text = docs_text()
    assert "haproxy -f deploy/haproxy/haproxy.cfg -f deploy/haproxy/replicas-local.cfg" in text
    servers = [d.split()[-1] for d in _directives(HAPROXY / "replicas-local.cfg") if d.startswith("server ")]
    assert servers == ["127.0.0.1:8001", "127.0.0.1:8002"]
    for address in servers:  # the docs' replicas are the ones the list names
        assert f"--port {address.rsplit(':', 1)[1]}" in text


@pytest.mark.parametrize("status", [503, 504])
def test_the_errorfiles_hold_mmencode_error_bodies(status: int) -> None:
    raw = (HAPROXY / "errors" / f"{status}.http").read_bytes()
    head, _, body = raw.partition(b"\r\n\r\n")
    assert head.startswith(f"HTTP/1.1 {status} ".encode())
    assert b"content-type: application/json" in head.lower()
    error = ErrorResponse.model_validate_json(body).error
    assert error.code == {503: "not_ready", 504: "timeout"}[status]


@contextlib.contextmanager
def _haproxy(ports: list[int], tmp_path: Path) -> Iterator[str]:
    """The shipped files, run from another directory; only the replicas' ports are this test's."""
    shipped = (HAPROXY / "replicas-local.cfg").read_text()
    assert shipped.count("127.0.0.1:8001") == 1 and shipped.count("127.0.0.1:8002") == 1
    replicas = tmp_path / "replicas-local.cfg"
    replicas.write_text(shipped.replace(":8001", f":{ports[0]}").replace(":8002", f":{ports[1]}"))
    port = free_port()
    env = {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "MMENCODE_LB_BIND": f"127.0.0.1:{port}",
        "MMENCODE_LB_STATS_BIND": f"127.0.0.1:{free_port()}",
    }
    with haproxy_serving([HAPROXY / "haproxy.cfg", replicas], env=env, port=port, cwd=tmp_path) as url:
        yield url


def test_haproxy_in_front_of_two_bare_replicas(checkpoints: dict[str, Path], tmp_path: Path) -> None:
    replicas = [
        Replica(
            ["--model", str(checkpoints["qwen2_vl"])],
            env={"MMENCODE_CACHE_DIR": str(tmp_path / f"cache{i}"), "OMP_NUM_THREADS": "1"},
        )
        for i in range(2)
    ]
    with _haproxy([replica.port for replica in replicas], tmp_path) as url:
        try:
            # No replica yet: the balancer answers itself, in mmencode's error shape.
            refused = httpx.get(url + "/v1/models", timeout=30)
            assert refused.status_code == 503
            assert refused.headers["content-type"] == "application/json"
            error = ErrorResponse.model_validate_json(refused.content).error
            assert error.code == "not_ready" and error.type == "server_error"
            assert "retry" in error.message

            for replica in replicas:
                replica.start()
            for replica in replicas:
                replica.wait_ready()
            seen: set[str] = set()
            body = {"items": [{"image": data_uri(noise_image(56, 56))}]}
            deadline = time.monotonic() + 30
            with httpx.Client(base_url=url, timeout=30) as client:
                while len(seen) < 2 and time.monotonic() < deadline:
                    response = client.post("/v1/encode", json=body)
                    if response.status_code == 200:
                        seen.add(response.headers["x-mmencode-replica"])
                    time.sleep(0.1)
            assert seen == {"local8001", "local8002"}
        finally:
            for replica in replicas:
                replica.kill()
