"""Bounded schemathesis fuzzing of the live service against its own ``/openapi.json``.

Every generated request, valid (positive) or not (negative), must get an answer the document
describes: no 5xx, a documented status code and content type, a body that fits the documented
schema; every non-2xx body is the contract's one error shape with a code from its table; and a
schema-valid body is never refused as ``validation_error`` (that would mean the document is looser
than the service).

Positive cases are sometimes given the served model's name and real tiny images, so that requests
get past ``model_not_found`` and ``invalid_image`` into the encoder and its 200 answers are checked.

Nothing here may leave the machine: generated bodies whose image sources look like URLs are
filtered out, and the server's fetcher is replaced by one that refuses without touching the network.
"""

from __future__ import annotations

import copy
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import schemathesis
from fastapi import FastAPI
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from schemathesis import GenerationMode, engine
from schemathesis.checks import not_a_server_error
from schemathesis.engine import events as engine_events
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    response_schema_conformance,
    status_code_conformance,
)

from mmencode.app.engine.engine import Engine
from mmencode.app.engine.errors import MediaFetchFailed
from tests.helpers import LiveServer, data_uri, live_server, noise_image

MAX_EXAMPLES = 40

# (method, path) of every operation fuzzed; test_every_operation_is_fuzzed keeps the list complete.
# Listed here rather than through `schemathesis.pytest.from_fixture`, whose lazy loader breaks under
# pytest 9.2 (it writes `Function._nodeid`, which pytest no longer has).
OPERATIONS = [
    ("POST", "/v1/encode"),
    ("POST", "/v1/embeddings"),
    ("GET", "/v1/models"),
    ("POST", "/v1/chat/completions"),  # off on this server (no --upstream): 404 whatever the body
    ("GET", "/health"),
    ("GET", "/ready"),
    ("GET", "/metrics"),
]

# code -> status, as in the contract's table, plus the router's own 404/405 and `unsupported_parameter`
# (the contract's "`dimensions` is refused clearly").
ERROR_STATUS = {
    "validation_error": 422,
    "partial_precomputed": 400,
    "missing_metadata": 400,
    "precomputed_shape_mismatch": 400,
    "invalid_image": 400,
    "invalid_video": 400,
    "unsupported_modality": 400,
    "image_fetch_failed": 400,
    "url_not_allowed": 400,
    "unknown_hash": 400,
    "unsupported_parameter": 400,
    "model_not_found": 404,
    "not_found": 404,
    "method_not_allowed": 405,
    "payload_too_large": 413,
    "token_count_mismatch": 500,
    "internal_error": 500,
    "overloaded": 503,
    "not_ready": 503,
    "timeout": 504,
}
ERROR_FIELDS = {"message", "type", "code", "param", "details", "request_id"}
ERROR_TYPES = {"invalid_request_error", "server_error", "overloaded_error"}

IMAGES = [
    data_uri(noise_image(28, 28, seed=1)),
    data_uri(noise_image(9, 13, seed=2, mode="RGBA")),
    data_uri(noise_image(40, 17, seed=3, mode="L"), fmt="JPEG"),
]


def _looks_like_url(value: Any) -> bool:
    """An http(s) URL anywhere in a body: the only kind the fetcher would resolve and connect to."""
    if isinstance(value, str):
        return value[:8].lower().startswith(("http://", "https://"))
    if isinstance(value, dict):
        return any(_looks_like_url(v) for v in value.values())
    if isinstance(value, list | tuple):
        return any(_looks_like_url(v) for v in value)
    return False


def _engine(server: LiveServer) -> Engine:
    app = server.server.config.app
    assert isinstance(app, FastAPI)
    engine: Engine = app.state.engine
    return engine


@pytest.fixture(scope="module")
def fuzz_server(checkpoints: dict[str, Path], tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    with live_server(
        model=checkpoints["qwen2_vl"], cache_dir=tmp_path_factory.mktemp("fuzz-cache"), url_fetch_timeout=0.5
    ) as server:
        fetcher = _engine(server).fetcher

        async def refuse(url: str) -> bytes:
            raise MediaFetchFailed(f"fetching {url} is disabled on this test server", details={"url": url})

        # Belt and braces with the URL filter: nothing generated may reach DNS or the network.
        fetcher.fetch = refuse  # type: ignore[method-assign]
        yield server


def _load_schema(server: LiveServer) -> Any:
    schema = schemathesis.openapi.from_url(f"{server.url}/openapi.json")
    schema.config.update(base_url=server.url, workers=1)
    schema.config.generation.update(deterministic=True, database="none")

    @schema.hook
    def filter_body(context: Any, body: Any) -> bool:
        return not _looks_like_url(body)

    return schema


@pytest.fixture(scope="module")
def api_schema(fuzz_server: LiveServer) -> Any:
    return _load_schema(fuzz_server)


@schemathesis.check
def one_error_shape(ctx: Any, response: Any, case: Any) -> bool | None:
    """Every non-2xx body is ``{"error": {...}}`` with the six fields and a code from the table."""
    if 200 <= response.status_code < 300:
        return None
    body = response.json()
    assert isinstance(body, dict) and set(body) == {"error"}, f"not the error shape: {body!r}"
    error = body["error"]
    assert isinstance(error, dict) and set(error) == ERROR_FIELDS, f"error fields: {sorted(error)}"
    assert error["type"] in ERROR_TYPES, f"unknown error type {error['type']!r}"
    assert isinstance(error["message"], str) and error["message"], "empty message"
    assert "Traceback" not in error["message"], "a traceback leaked into the message"
    assert ERROR_STATUS.get(error["code"]) == response.status_code, (
        f"code {error['code']!r} answered with HTTP {response.status_code}: {error['message']}"
    )
    assert error["param"] is None or isinstance(error["param"], str)
    assert error["details"] is None or isinstance(error["details"], dict)
    assert error["request_id"] and [error["request_id"]] == response.headers.get("x-request-id"), (
        "request_id differs from the X-Request-ID header"
    )
    return True


@schemathesis.check
def schema_valid_body_is_not_a_validation_error(ctx: Any, response: Any, case: Any) -> bool | None:
    """A request that fits the document must not get 422: else the document is looser than the service."""
    if response.status_code != 422 or case.meta is None or case.meta.generation.mode != GenerationMode.POSITIVE:
        return None
    error = response.json()["error"]
    # Value checks a JSON schema cannot state: base64 and finiteness of a precomputed embedding's data.
    assert (error["param"] or "").endswith("precomputed_embedding.data"), (
        f"a request that fits /openapi.json was refused as validation_error: {error['message']}"
    )
    return True


CHECKS = [
    not_a_server_error,
    status_code_conformance,
    content_type_conformance,
    response_schema_conformance,
    one_error_shape,
    schema_valid_body_is_not_a_validation_error,
]


@st.composite
def _realistic(draw: st.DrawFn, case: Any, model_name: str) -> Any:
    """Half the time: the served model's name, and real tiny images as every item's only source."""
    if not isinstance(case.body, dict) or not draw(st.booleans()):
        return case
    body = copy.deepcopy(case.body)
    if isinstance(body.get("model"), str):
        body["model"] = model_name
    items = body.get("items")
    for item in items if isinstance(items, list) else []:
        if isinstance(item, dict):
            # An image item only: with a random hash or embedding beside it, it would stop at 400.
            item.update(image=draw(st.sampled_from(IMAGES)), precomputed_embedding=None, hash=None)
            for video_field in ("video", "fps", "num_frames", "modality"):
                item.pop(video_field, None)
    if isinstance(body.get("input"), str):
        body["input"] = draw(st.sampled_from(IMAGES))
    elif isinstance(body.get("input"), list):
        body["input"] = [draw(st.sampled_from(IMAGES)) if isinstance(v, str) else v for v in body["input"]]
    case.body = body
    return case


def test_every_operation_is_fuzzed(api_schema: Any) -> None:
    operations = {(op.ok().method.upper(), op.ok().path) for op in api_schema.get_all_operations()}
    assert operations == set(OPERATIONS)


@pytest.mark.parametrize("mode", [GenerationMode.POSITIVE, GenerationMode.NEGATIVE], ids=str)
@pytest.mark.parametrize(("method", "path"), OPERATIONS, ids=[f"{m} {p}" for m, p in OPERATIONS])
def test_openapi_fuzz(api_schema: Any, fuzz_server: LiveServer, method: str, path: str, mode: GenerationMode) -> None:
    operation = api_schema[path][method]
    if mode == GenerationMode.NEGATIVE and not (operation.body or any(True for _ in operation.iter_parameters())):
        pytest.skip("no parameters and no body: nothing to make invalid")
    strategy = operation.as_strategy(generation_mode=mode)
    if mode == GenerationMode.POSITIVE:
        model_name = _engine(fuzz_server).model_name
        strategy = strategy.flatmap(lambda case: _realistic(case, model_name))

    @given(case=strategy)
    @settings(
        max_examples=MAX_EXAMPLES,
        deadline=None,
        derandomize=True,
        database=None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much, HealthCheck.data_too_large],
    )
    def fuzz(case: Any) -> None:
        case.call_and_validate(checks=CHECKS, timeout=30)

    fuzz()


def test_openapi_examples_and_coverage_phases(fuzz_server: LiveServer) -> None:
    """schemathesis' own runner (what `schemathesis run` drives) over its deterministic phases.

    The coverage phase walks each schema's boundaries (missing required fields, each wrong type, each
    enum's neighbours, undocumented methods...); every check schemathesis has runs, ours included,
    except `positive_data_acceptance`: a schema-valid body may still be refused with a 4xx here
    (an undecodable image, an unknown hash), and `schema_valid_body_is_not_a_validation_error` is
    the precise form of that check for this service.
    """
    schema = _load_schema(fuzz_server)
    schema.config.phases.update(phases=["examples", "coverage"])
    schema.config.checks.update(excluded_check_names=["positive_data_acceptance"])
    requests = {f"{method} {path}": 0 for method, path in OPERATIONS}
    problems: list[str] = []
    for event in engine.from_schema(schema).execute():
        if isinstance(event, engine_events.ScenarioFinished) and event.label in requests:
            requests[event.label] += len(event.recorder.interactions)
            for checks in event.recorder.checks.values():
                problems.extend(
                    f"{event.label}: {check.name}: {check.failure_info.failure.title}\n"
                    f"{check.failure_info.failure.message}\n{check.failure_info.code_sample}"
                    for check in checks
                    if check.failure_info is not None
                )
        elif isinstance(event, engine_events.NonFatalError | engine_events.FatalError):
            problems.append(f"schemathesis error: {event!r}")
        elif isinstance(event, engine_events.EngineFinished):
            assert event.stop_reason == engine.StopReason.COMPLETED, event.stop_reason
    assert not problems, "\n\n".join(dict.fromkeys(problems))
    assert all(requests.values()), f"operations left untested: {requests}"
