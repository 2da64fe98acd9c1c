"""docs/api.md stays true: its examples fit the service's schemas, its tables match the code."""

from __future__ import annotations

import json
import re
import typing
from pathlib import Path

import pytest
from fastapi.testclient import TestClient
from pydantic import BaseModel

from mmencode.app.api.chat.errors import UpstreamRefused
from mmencode.app.config import Settings
from mmencode.app.engine import errors
from mmencode.app.server import create_app
from mmencode.schemas.embeddings import EmbeddingsRequest, EmbeddingsResponse, ModelList
from mmencode.schemas.encode import EncodeItem, EncodeRequest, EncodeResponse, EncodingFormat, PrecomputedEmbedding
from mmencode.schemas.errors import ErrorResponse

ROOT = Path(__file__).resolve().parents[2]
DOC = (ROOT / "docs" / "api.md").read_text()
SCHEMAS: dict[str, type[BaseModel]] = {
    model.__name__: model
    for model in (EncodeRequest, EncodeResponse, EmbeddingsRequest, EmbeddingsResponse, ModelList, ErrorResponse)
}


def _section(title: str) -> str:
    return DOC.split(f"## {title}", 1)[1].split("\n## ", 1)[0]


def _table_rows(text: str) -> list[list[str]]:
    rows = [[cell.strip() for cell in line.strip().strip("|").split("|")] for line in text.splitlines()]
    return [row for row in rows if len(row) > 1 and not set(row[0]) <= {"-", " "}][1:]


def test_every_json_example_parses() -> None:
    blocks = re.findall(r"```json\n(.*?)```", DOC, re.S)
    assert len(blocks) >= 7
    for block in blocks:
        json.loads(block)


@pytest.mark.parametrize("name", sorted(SCHEMAS))
def test_every_labelled_example_fits_its_schema(name: str) -> None:
    examples = re.findall(rf"<!-- example: {name} -->\s*```json\n(.*?)```", DOC, re.S)
    assert examples, f"no example of {name}"
    for example in examples:
        SCHEMAS[name].model_validate_json(example)


def _service_errors() -> list[type[errors.ServiceError]]:
    """Every error class the app defines (create_app's import brings in every module that defines one)."""
    found, queue = [], [errors.ServiceError]
    while queue:
        cls = queue.pop()
        found.append(cls)
        queue.extend(cls.__subclasses__())
    return found


def test_the_error_table_lists_exactly_the_codes_the_service_emits() -> None:
    table = {row[0].strip("`"): (row[1], row[2].split(" (")[0].strip("`")) for row in _table_rows(_section("Errors"))}
    emitted = {cls.code: (str(cls.status), cls.type) for cls in _service_errors() if cls is not UpstreamRefused}
    # The front door passes an upstream's error on with the upstream's own status (and type by it).
    emitted[UpstreamRefused.code] = ("the upstream's", "the upstream's")
    assert table == emitted


def test_every_error_class_is_raised_somewhere() -> None:
    """A code in the table is one a request can actually get: its class is raised by the service."""
    source = "\n".join(path.read_text() for path in (ROOT / "app").rglob("*.py"))
    for cls in _service_errors():
        if cls is errors.ServiceError:
            continue
        uses = re.findall(rf"(?<!class ){cls.__name__}\(", source)
        assert uses, f"{cls.__name__} ({cls.code}) is never raised"


def test_the_route_table_matches_the_app() -> None:
    documented = set()
    for row in _table_rows(_section("Routes")):
        for method, path in re.findall(r"`(GET|POST) (/[^`]*)`", row[0]):
            documented.add((method, path))
    app = create_app(Settings())
    operations = {(method.upper(), path) for path, ops in app.openapi()["paths"].items() for method in ops}
    pages = {("GET", "/docs"), ("GET", "/redoc"), ("GET", "/openapi.json")}
    assert documented == operations | pages
    client = TestClient(app)  # no lifespan: these pages need no model
    for _, path in pages:
        assert client.get(path).status_code == 200, path


def test_every_request_field_is_described() -> None:
    encode_fields = {row[0].strip("`") for row in _table_rows(_section("`POST /v1/encode`"))}
    for name in EncodeRequest.model_fields:
        assert name in encode_fields
    for name in EncodeItem.model_fields:
        assert f"items[].{name}" in encode_fields
    precomputed = _section("Precomputed embeddings and `fill`")
    for name in PrecomputedEmbedding.model_fields:
        assert f"`{name}`" in precomputed or f"precomputed_embedding.{name}" in precomputed
    embeddings_fields = " ".join(row[0] for row in _table_rows(_section("`POST /v1/embeddings`")))
    for name in EmbeddingsRequest.model_fields:
        assert f"`{name}`" in embeddings_fields


def test_the_encoding_table_lists_every_format() -> None:
    table = {row[0].strip("`") for row in _table_rows(_section("Embedding encodings"))}
    assert table == set(typing.get_args(EncodingFormat))
