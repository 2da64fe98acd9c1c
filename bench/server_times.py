"""Where a service's time went between two /metrics scrapes, from its histograms' sums and counts.

Buckets say how latencies spread; ``_sum`` and ``_count`` give exact means over the interval: time per
encoder forward, per queue wait, per request, and how many images each forward held.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

__all__ = ["ServerTimes", "gauge_value", "histogram_totals"]


def histogram_totals(metrics_text: str, name: str, **labels: str) -> tuple[float, float]:
    """``(sum, count)`` of histogram ``name``, added over the label sets that match ``labels``."""
    total, count = 0.0, 0.0
    for family in text_string_to_metric_families(metrics_text):
        if family.name != name:
            continue
        for sample in family.samples:
            if any(sample.labels.get(key) != value for key, value in labels.items()):
                continue
            if sample.name == name + "_sum":
                total += sample.value
            elif sample.name == name + "_count":
                count += sample.value
    return total, count


def gauge_value(metrics_text: str, name: str) -> float | None:
    """The value of the unlabelled gauge ``name``; None where the service does not export it."""
    for family in text_string_to_metric_families(metrics_text):
        if family.name == name and family.samples:
            return family.samples[0].value
    return None


@dataclass(frozen=True)
class ServerTimes:
    """Means over the interval between two scrapes (seconds, except where named otherwise)."""

    forwards: int
    encoder_s_total: float  # wall time the encoder ran, all forwards together
    encoder_s_per_forward: float
    images_per_forward: float
    queue_wait_s: float  # per request, before its forward began
    request_s: float  # per /v1/encode request, as the server measured it

    @classmethod
    def between(cls, before: str, after: str, route: str = "/v1/encode") -> ServerTimes:
        def delta(name: str, **labels: str) -> tuple[float, float]:
            (s0, c0), (s1, c1) = histogram_totals(before, name, **labels), histogram_totals(after, name, **labels)
            return s1 - s0, c1 - c0

        encoder, forwards = delta("mmencode_encoder_seconds")
        images, batches = delta("mmencode_batch_items")
        wait, waits = delta("mmencode_queue_wait_seconds")
        request, requests = delta("mmencode_request_duration_seconds", route=route)
        return cls(
            forwards=int(forwards),
            encoder_s_total=encoder,
            encoder_s_per_forward=encoder / forwards if forwards else float("nan"),
            images_per_forward=images / batches if batches else float("nan"),
            queue_wait_s=wait / waits if waits else float("nan"),
            request_s=request / requests if requests else float("nan"),
        )

    def as_dict(self) -> dict[str, Any]:
        return {key: round(value, 6) if isinstance(value, float) else value for key, value in asdict(self).items()}
