"""`make gpu-wheels`: what a GPU machine that downloads nothing needs to run bench.gpu, and no more.

The device image (Python 3.12, torch 2.11, torchvision 0.26, transformers 5.17) cannot install anything
from an index: every requirement of mmencode and of each carried wheel must be met there by a carried
wheel or by a package the image already holds. Downloads go through PyPI, as `make` does.
"""

from __future__ import annotations

import email
import subprocess
import tomllib
import zipfile
from pathlib import Path

import pytest
from packaging.markers import default_environment
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name, parse_wheel_filename
from packaging.version import Version

ROOT = Path(__file__).resolve().parents[2]
WHEELS = ROOT / ".whl"
BUDGET = 60 * 1024 * 1024

# The device image's packages as the device tool's KINDS.md lists them (2026-11), with the versions its
# pip list gives where it gives one. Only names matter for the others: any release meets ">=" floors
# as low as the ones asked here, and the carried wheels cover what is newer than images hold.
DEVICE_VERSIONS = {
    "torch": "2.11.0",
    "torchvision": "0.26.0",
    "numpy": "2.5.2",
    "safetensors": "0.8.0",
    "tokenizers": "0.23.2",
    "huggingface-hub": "1.33.0",
}
DEVICE_NAMES = {
    *DEVICE_VERSIONS,
    "anyio",
    "certifi",
    "click",
    "filelock",
    "fsspec",
    "h11",
    "hf-xet",
    "httpcore",
    "httpx",
    "idna",
    "jinja2",
    "packaging",
    "pillow",
    "prometheus-client",
    "psutil",
    "pyyaml",
    "regex",
    "requests",
    "rich",
    "shellingham",
    "six",
    "threadpoolctl",
    "tqdm",
    "typer",
    "typing-extensions",
    "urllib3",
    "uvloop",
    "zipp",
}
# Python 3.12 on Linux x86_64, for the requirements' markers.
MARKERS = {**default_environment(), "python_version": "3.12", "python_full_version": "3.12.3"}


@pytest.fixture(scope="module")
def wheels() -> dict[str, Path]:
    subprocess.run(["make", "gpu-wheels"], cwd=ROOT, check=True, capture_output=True)
    return {str(canonicalize_name(parse_wheel_filename(path.name)[0])): path for path in WHEELS.glob("*.whl")}


def _requirements(requirements: list[str]) -> list[Requirement]:
    parsed = [Requirement(text) for text in requirements]
    return [req for req in parsed if req.marker is None or req.marker.evaluate({**MARKERS, "extra": ""})]


def _met(requirement: Requirement, wheels: dict[str, Path]) -> bool:
    name = canonicalize_name(requirement.name)
    if name in wheels:
        return Version(str(parse_wheel_filename(wheels[name].name)[1])) in requirement.specifier
    if name in DEVICE_VERSIONS:
        return Version(DEVICE_VERSIONS[name]) in requirement.specifier
    return name in DEVICE_NAMES


def test_every_listed_wheel_downloads_for_the_device_and_fits_the_budget(wheels: dict[str, Path]) -> None:
    listed = [
        Requirement(line).name for line in (ROOT / "bench/gpu-wheels.txt").read_text().splitlines()
        if line.strip() and not line.startswith("#")
    ]  # fmt: skip
    assert sorted(wheels) == sorted(str(canonicalize_name(name)) for name in listed)
    for path in wheels.values():
        tags = parse_wheel_filename(path.name)[3]
        assert any(tag.interpreter in {"py3", "cp312"} for tag in tags), path.name
        assert any(tag.platform == "any" or tag.platform.endswith("_x86_64") for tag in tags), path.name
    assert sum(path.stat().st_size for path in wheels.values()) < BUDGET


def test_mmencode_and_every_wheel_find_what_they_need_there(wheels: dict[str, Path]) -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    needs = {"mmencode": _requirements(project["dependencies"])}
    for name, path in wheels.items():
        with zipfile.ZipFile(path) as archive:
            metadata_name = next(n for n in archive.namelist() if n.endswith(".dist-info/METADATA"))
            metadata = email.message_from_bytes(archive.read(metadata_name))
        needs[name] = _requirements(metadata.get_all("Requires-Dist") or [])
    unmet = {name: [str(req) for req in reqs if not _met(req, wheels)] for name, reqs in needs.items()}
    assert {name: reqs for name, reqs in unmet.items() if reqs} == {}


def test_the_carried_transformers_is_the_projects_floor(wheels: dict[str, Path]) -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    transformers = next(Requirement(text) for text in project["dependencies"] if text.startswith("transformers"))
    floor = next(spec.version for spec in transformers.specifier if spec.operator == ">=")
    assert parse_wheel_filename(wheels["transformers"].name)[1] == Version(floor)
