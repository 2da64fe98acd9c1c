"""What can be checked of the container set-up without a Docker engine."""

from __future__ import annotations

import re
import shlex
from pathlib import Path
from typing import Any

import pytest
import yaml

from mmencode.app.cli import build_parser
from mmencode.app.config import Settings, unknown_environment

ROOT = Path(__file__).resolve().parents[3]


def _service() -> dict[str, Any]:
    compose = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
    service: dict[str, Any] = compose["services"]["mmencode"]
    return service


def test_compose_runs_the_cli_with_a_gpu_and_a_model_volume() -> None:
    service = _service()
    command = service["command"]
    assert command[:2] == ["mmencode", "serve"]
    args = build_parser().parse_args(command[1:])  # the command parses with the real CLI
    assert args.host == "0.0.0.0" and args.port == "8000"
    model_path = service["environment"]["MMENCODE_MODEL"]
    # "host:container[:mode]"; the host side may hold a ${VAR:-default} with its own colon.
    assert any(volume.rsplit(":", 2)[-2:] == [model_path, "ro"] for volume in service["volumes"])
    devices = service["deploy"]["resources"]["reservations"]["devices"]
    assert devices[0]["driver"] == "nvidia" and "gpu" in devices[0]["capabilities"]
    assert service["ports"] == ["8000:8000"]


def test_compose_health_check_probes_readiness() -> None:
    check = _service()["healthcheck"]
    test = " ".join(check["test"])
    assert check["test"][0] == "CMD"
    assert "http://127.0.0.1:8000/ready" in test
    assert "/health" not in test  # liveness alone would mark a still-loading model healthy
    assert re.fullmatch(r"\d+s", check["start_period"])


def test_dockerfile_installs_the_pinned_torch_and_runs_the_service() -> None:
    dockerfile = (ROOT / "Dockerfile").read_text()
    # The image gets the same torch/torchvision pair as `make` (one pair, or the rows would differ).
    makefile = (ROOT / "Makefile").read_text()
    torch_version = re.search(r"^TORCH_VERSION \?= (\S+)$", makefile, re.M)
    torchvision_version = re.search(r"^TORCHVISION_VERSION \?= (\S+)$", makefile, re.M)
    assert torch_version is not None and torchvision_version is not None
    pair = f'pip install "torch=={torch_version.group(1)}" "torchvision=={torchvision_version.group(1)}"'
    assert pair in dockerfile
    cmd = re.search(r"^CMD (\[.*\])$", dockerfile, re.M)
    assert cmd is not None
    assert yaml.safe_load(cmd.group(1)) == _service()["command"]
    for package in ("app", "models", "schemas", "mmencode"):
        assert f"COPY {package} ./{package}" in dockerfile


def test_the_image_and_ci_carry_mooncake_and_the_libraries_it_loads() -> None:
    dockerfile = (ROOT / "Dockerfile").read_text()
    extras = re.search(r"^ARG MMENCODE_EXTRAS=(\S+)$", dockerfile, re.M)
    assert extras is not None and "mooncake" in extras.group(1).split(",")
    system_deps = (ROOT / ".ci" / "system-deps").read_text()
    for library in ("libibverbs1", "libnl-3-200", "libnl-route-3-200"):
        assert library in dockerfile and library in system_deps


def test_readme_opens_with_the_serve_and_test_commands() -> None:
    readme = (ROOT / "README.md").read_text()
    blocks = re.findall(r"```(?:bash|sh)?\n(.*?)```", readme, re.S)
    first = [line.split("#")[0].strip() for line in blocks[0].splitlines() if line.split("#")[0].strip()]
    assert first == ["make serve", "make test"]
    ci = (ROOT / ".ci" / "run").read_text()
    assert shlex.split(ci.strip().splitlines()[-1]) == ["make", "test"]


def test_compose_environment_is_valid_settings(monkeypatch: pytest.MonkeyPatch) -> None:
    environment = {
        name: re.sub(r"\$\{\w+:-([^}]*)\}", r"\1", str(value))  # compose's ${VAR:-default}, unset
        for name, value in _service()["environment"].items()
    }
    assert unknown_environment(environment) == []
    for name, value in environment.items():
        monkeypatch.setenv(name, value)
    settings = Settings()
    assert str(settings.model) == "/models/encoder" and settings.device == "cuda"
    assert settings.api_keys() == []  # MMENCODE_API_KEY unset: no authentication, as documented
