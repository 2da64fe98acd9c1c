"""What an operator reads: access lines that name refusals and clients, and metrics labelled usefully."""

from __future__ import annotations

import logging
import socket

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.helpers import LiveServer, data_uri, noise_image


def _access_lines(caplog: pytest.LogCaptureFixture, request_id: str) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == "mmencode.access" and request_id in r.getMessage()]


def test_the_access_line_of_a_refused_request_names_its_code_and_client(
    qwen_server: LiveServer, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="mmencode.access")
    with qwen_server.client() as client:
        bad = client.post("/v1/encode", json={"items": [{"image": "data:image/png;base64,aGVsbG8="}]})
        good = client.post("/v1/encode", json={"items": [{"image": data_uri(noise_image(56, 56))}]})
    huge = _declared_huge_body(qwen_server)
    assert (bad.status_code, good.status_code, huge.status_code) == (400, 200, 413)

    [line] = _access_lines(caplog, bad.headers["x-request-id"])
    assert " POST /v1/encode 400 " in line and line.endswith("code=invalid_image")
    assert " 127.0.0.1:" in line  # the client's address and port
    [line] = _access_lines(caplog, good.headers["x-request-id"])
    assert " POST /v1/encode 200 items=1 tokens=4 " in line and "code=" not in line
    [line] = _access_lines(caplog, huge.headers["x-request-id"])
    assert line.endswith("code=payload_too_large")


def _declared_huge_body(server: LiveServer) -> httpx.Response:
    """A request refused from its Content-Length alone, by the body-limit middleware rather than a route."""
    host, port = server.url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=30) as sock:
        sock.sendall(b"POST /v1/encode HTTP/1.1\r\nHost: x\r\nContent-Length: 1099511627776\r\n\r\n")
        raw = b""
        while b"\r\n\r\n" not in raw:
            raw += sock.recv(65536)
    head = raw.split(b"\r\n\r\n", 1)[0].decode().split("\r\n")
    headers = dict(line.split(": ", 1) for line in head[1:])
    return httpx.Response(int(head[0].split()[1]), headers={k.lower(): v for k, v in headers.items()})


def _samples(server: LiveServer, name: str) -> list[dict[str, str]]:
    text = httpx.get(server.url + "/metrics").text
    return [
        sample.labels
        for family in text_string_to_metric_families(text)
        for sample in family.samples
        if sample.name == name
    ]


def test_docs_pages_are_counted_under_their_routes_and_durations_carry_the_method(qwen_server: LiveServer) -> None:
    for path in ("/docs", "/openapi.json", "/no-such-route"):
        httpx.get(qwen_server.url + path)
    requests = _samples(qwen_server, "mmencode_requests_total")
    routes = {(labels["route"], labels["status"]) for labels in requests}
    assert ("/docs", "200") in routes and ("/openapi.json", "200") in routes
    assert ("unmatched", "404") in routes  # only what no route matches
    assert not any(labels["route"] == "unmatched" and labels["status"] == "200" for labels in requests)

    durations = _samples(qwen_server, "mmencode_request_duration_seconds_count")
    assert {"route": "/docs", "method": "GET", "status": "200"} in durations
    assert all("method" in labels for labels in durations)
