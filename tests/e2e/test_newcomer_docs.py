"""What a newcomer reads agrees with what the code and the manifests do (issue 23's smaller items)."""

from __future__ import annotations

import argparse
import re
from pathlib import Path
from typing import Any

import yaml

from mmencode.app.cli import build_parser
from mmencode.models.catalog import TINY_FAMILIES
from tests.helpers import LiveServer, data_uri, docs_text, noise_image

ROOT = Path(__file__).resolve().parents[2]
README = docs_text()  # the README and docs/: what a newcomer reads
API = (ROOT / "docs" / "api.md").read_text()


def test_the_openai_example_says_which_python_has_openai() -> None:
    before = README[: README.index("from openai import OpenAI")]
    assert "`.venv/bin/python`" in before[-400:]


def test_make_tiny_help_shows_the_default_family_and_what_each_is() -> None:
    parser = build_parser()
    subparsers = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    text = subparsers.choices["make-tiny"].format_help()
    assert "default: qwen2_vl" in text
    for family in TINY_FAMILIES:
        assert re.search(rf"^  {family}\s+metadata: ", text, re.M), family
    assert "DIRECTORY" in text or "directory" in text


def test_readme_gives_the_exit_statuses_the_tests_check() -> None:
    # tests/e2e/test_bad_model.py: 2 for what is refused before the port is bound, 1 for a failed load.
    assert re.search(r"one line saying what to do, and exit status 2", README)
    assert "exit status 1" in README


def _probes() -> dict[str, dict[str, Any]]:
    manifest = yaml.safe_load((ROOT / "deploy" / "kubernetes" / "base" / "deployment.yaml").read_text())
    container = manifest["spec"]["template"]["spec"]["containers"][0]
    return {kind: container[kind] for kind in ("startupProbe", "readinessProbe", "livenessProbe")}


def test_readme_probe_numbers_are_the_manifests() -> None:
    for kind, probe in _probes().items():
        said = re.search(rf"`{kind}: httpGet (\S+), ([^`]*)`", README.replace("\n", " "))
        assert said, kind
        assert said.group(1) == probe["httpGet"]["path"]
        numbers = dict(re.findall(r"(\w+) (\d+)", said.group(2)))
        expected = {key: str(value) for key, value in probe.items() if isinstance(value, int)}
        assert numbers == expected, (kind, numbers, expected)
    startup = _probes()["startupProbe"]
    minutes = startup["periodSeconds"] * startup["failureThreshold"] // 60
    words = {5: "five", 10: "ten"}
    assert f"({words.get(minutes, minutes)} minutes to load)" in README


def test_the_model_claim_can_be_filled_before_it_is_mounted_read_only() -> None:
    text = (ROOT / "deploy" / "kubernetes" / "base" / "model-volume.yaml").read_text()
    claim = yaml.safe_load(text)
    # A ReadOnlyMany claim can be written by nothing: not the Job the comment says fills it.
    assert claim["spec"]["accessModes"] != ["ReadOnlyMany"]
    assert "Job" in text and "read-only" in text
    assert '--include "*.json" "*.safetensors"' in text


def test_the_encodings_table_is_one_table() -> None:
    section = API[API.index("## Embedding encodings") : API.index("`dtype` applies to all")]
    rows = [line for line in section.strip().splitlines()[1:] if line.strip()]
    assert all(line.startswith("|") for line in rows), rows
    assert [re.match(r"\| `(\w+)`", line).group(1) for line in rows[2:]] == [  # type: ignore[union-attr]
        "base64",
        "float",
        "pt",
        "npy",
        "safetensors",
    ]


def test_the_tiny_default_pixel_budget_is_what_the_readme_says(qwen_server: LiveServer) -> None:
    said = re.search(r"a 1600\u00d71200 photo becomes (\d+) rows \(`image_grid_thw`\s+`(\[[\d, ]+\])`\)", README)
    assert said, "README states the tiny default's rows for a 1600x1200 photo"
    with qwen_server.client() as client:
        body = {"items": [{"image": data_uri(noise_image(1600, 1200), "JPEG")}], "encoding_format": "float"}
        item = client.post("/v1/encode", json=body).json()["items"][0]
    assert item["num_tokens"] == int(said.group(1))
    assert str(item["metadata"]["image_grid_thw"]) == said.group(2)
