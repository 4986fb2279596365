"""Prometheus metrics of the webhook, in a registry of its own (one per application)."""

from __future__ import annotations

import bisect
import math
import time
from collections.abc import Sequence
from pathlib import Path

from cryptography import x509
from prometheus_client import CollectorRegistry, Counter, Gauge, generate_latest
from prometheus_client.metrics_core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.utils import floatToGoString

from extender.common.version import version
from webhook.admission import Outcome
from webhook.replay import ReviewReplay

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"


class WebhookMetrics:
    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry()
        build_info = Gauge("tf_webhook_build_info",
                           "Always 1; the version label says which release of tf-webhook runs", ["version"],
                           registry=self.registry)
        build_info.labels(version()).set(1)
        self.duration = LoopHistogram(
            "tf_webhook_request_duration_seconds", "Time to answer one AdmissionReview.",
            buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0),
            registry=self.registry,
        )
        self.decisions = LoopCounter("tf_webhook_decisions", "AdmissionReviews answered, by outcome.",
                                     "outcome", [o.value for o in Outcome], registry=self.registry)
        self.denials = Counter("tf_webhook_denials_total",
                               "Denied pods, by the annotation key or rule at fault.", ["reason"],
                               registry=self.registry)

    def track_certificate(self, cert_file: Path) -> None:
        """Export the serving certificate's expiry (read from the file on each scrape; the server reloads
        the same file within seconds of a change). 0 when the file cannot be read, which alerts too."""
        gauge = Gauge("tf_webhook_certificate_expiry_timestamp_seconds",
                      "Unix time at which the webhook's serving certificate expires", registry=self.registry)
        gauge.set_function(lambda: certificate_not_after(cert_file))

    def track_replay(self, replay: ReviewReplay) -> None:
        """Export how many reviews ``replay`` answered and how many it keeps (read on each scrape)."""
        self.registry.register(ReplayCollector(replay))

    def observe(self, seconds: float, outcome: Outcome, denial_reason: str | None) -> None:
        self.duration.observe(seconds)
        self.decisions.inc(str(outcome))  # a StrEnum's str() is its value, in C (.value is a Python property)
        if denial_reason is not None:
            self.denials.labels(reason=denial_reason).inc()

    def exposition(self) -> bytes:
        return bytes(generate_latest(self.registry))


class LoopHistogram:
    """An unlabelled histogram observed and collected from one thread (the server's event loop): ``observe``
    is a bisection and two additions, where prometheus_client's ``Histogram`` takes a lock per bucket and
    sum. It exposes the same samples as that ``Histogram`` (buckets, count, sum and created)."""

    def __init__(self, name: str, documentation: str, buckets: Sequence[float],
                 registry: CollectorRegistry) -> None:
        bounds = sorted(float(b) for b in buckets)
        if not bounds or bounds[-1] != math.inf:
            bounds.append(math.inf)
        self.name, self.documentation = name, documentation
        self._bounds = tuple(bounds)
        self._labels = tuple(str(floatToGoString(b)) for b in bounds)  # type: ignore[no-untyped-call]
        self._counts = [0] * len(bounds)
        self._sum = 0.0
        self._created = time.time()
        registry.register(self)

    def observe(self, amount: float) -> None:
        if amount <= self._bounds[-1]:  # as Histogram does, a NaN lands in no bucket (and the sum)
            self._counts[bisect.bisect_left(self._bounds, amount)] += 1
        self._sum += amount

    def describe(self) -> list[Metric]:
        return [HistogramMetricFamily(self.name, self.documentation)]

    def collect(self) -> list[Metric]:
        cumulative, buckets = 0, []
        for label, count in zip(self._labels, self._counts, strict=True):
            cumulative += count
            buckets.append((label, float(cumulative)))
        family = HistogramMetricFamily(self.name, self.documentation, buckets=buckets, sum_value=self._sum)
        family.add_sample(f"{self.name}_created", {}, self._created)
        return [family]


class LoopCounter:
    """A counter with one label whose values are all known up front, incremented and collected from one
    thread (the server's event loop): ``inc`` is a dict update, where prometheus_client's ``Counter`` child
    takes a lock. It exposes the samples that ``Counter`` does (``<name>_total`` and ``<name>_created``, every
    value from zero)."""

    def __init__(self, name: str, documentation: str, label: str, values: Sequence[str],
                 registry: CollectorRegistry) -> None:
        self.name, self.documentation, self.label = name, documentation, label
        self._counts = dict.fromkeys(values, 0)
        self._created = time.time()
        registry.register(self)

    def inc(self, value: str) -> None:
        self._counts[value] += 1

    def describe(self) -> list[Metric]:
        return [CounterMetricFamily(self.name, self.documentation, labels=[self.label])]

    def collect(self) -> list[Metric]:
        family = CounterMetricFamily(self.name, self.documentation, labels=[self.label])
        for value, count in self._counts.items():
            family.add_metric([value], float(count), created=self._created)
        return [family]


class ReplayCollector:
    def __init__(self, replay: ReviewReplay) -> None:
        self.replay = replay

    def describe(self) -> list[Metric]:
        return self.collect()

    def collect(self) -> list[Metric]:
        return [CounterMetricFamily("tf_webhook_replayed_answers",
                                    "AdmissionReviews answered with the answer to an earlier review of "
                                    "the same bytes but for request.uid.", value=self.replay.hits),
                GaugeMetricFamily("tf_webhook_replay_entries", "Reviews whose answers are kept for replay.",
                                  value=len(self.replay))]


def certificate_not_after(cert_file: Path) -> float:
    try:
        certificate = x509.load_pem_x509_certificate(cert_file.read_bytes())
    except (OSError, ValueError):
        return 0.0
    return certificate.not_valid_after_utc.timestamp()
