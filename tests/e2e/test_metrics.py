"""``/metrics`` parses as Prometheus text and moves with traffic."""

from __future__ import annotations

import threading

import httpx
from prometheus_client.parser import text_string_to_metric_families

from tests.helpers import LiveServer, data_uri, noise_image


def _samples(client: httpx.Client) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    response = client.get("/metrics")
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/plain")
    return {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(response.text)
        for sample in family.samples
    }


def test_counters_move_with_traffic(qwen_server: LiveServer) -> None:
    image = {"image": data_uri(noise_image(90, 60, seed=41))}
    encode_ok = ("mmencode_requests_total", (("method", "POST"), ("route", "/v1/encode"), ("status", "200")))
    invalid = ("mmencode_errors_total", (("code", "invalid_image"),))
    from_encoder = ("mmencode_items_total", (("source", "encoder"),))
    from_cache = ("mmencode_items_total", (("source", "cache"),))
    hits = ("mmencode_cache_lookups_total", (("result", "hit"), ("tier", "local")))
    with qwen_server.client() as client:
        before = _samples(client)
        assert client.post("/v1/encode", json={"items": [image]}).status_code == 200
        assert client.post("/v1/encode", json={"items": [image]}).status_code == 200
        assert client.post("/v1/encode", json={"items": [{"image": "aGVsbG8="}]}).status_code == 400
        after = _samples(client)
    assert after[encode_ok] - before.get(encode_ok, 0) == 2
    assert after[invalid] - before.get(invalid, 0) == 1
    assert after[from_encoder] - before.get(from_encoder, 0) == 1
    assert after[from_cache] - before.get(from_cache, 0) == 1
    assert after[hits] - before.get(hits, 0) == 1
    assert after[("mmencode_batch_items_count", ())] > before.get(("mmencode_batch_items_count", ()), 0)
    assert after[("mmencode_ready", ())] == 1.0
    assert after[("mmencode_cache_bytes", ())] > 0
    assert ("mmencode_queue_depth", ()) in after
    assert after[("mmencode_encoder_seconds_count", ())] >= 1
    # Scaling signals: queue wait observed per forwarded request; nothing in flight between requests
    # (the scrape itself is not load).
    waited = ("mmencode_queue_wait_seconds_count", ())
    assert after[waited] - before.get(waited, 0) == 1
    assert after[("mmencode_requests_in_flight", ())] == 0
    # Unknown paths share one label value instead of growing the series without bound.
    with qwen_server.client() as client:
        client.get("/no/such/path/123")
        assert any(
            labels == (("method", "GET"), ("route", "unmatched"), ("status", "404"))
            for name, labels in _samples(client)
            if name == "mmencode_requests_total"
        )


def test_requests_in_flight_counts_api_requests_being_answered(qwen_server: LiveServer) -> None:
    items = [{"image": data_uri(noise_image(640, 480, seed=500 + k))} for k in range(12)]
    key = ("mmencode_requests_in_flight", ())
    with qwen_server.client() as client:

        def send() -> None:
            with qwen_server.client() as sender_client:
                sender_client.post("/v1/encode", json={"items": items})

        sender = threading.Thread(target=send)
        sender.start()
        seen = 0.0
        while sender.is_alive() and seen < 1:
            seen = max(seen, _samples(client)[key])
        sender.join()
        assert seen == 1
        assert _samples(client)[key] == 0
