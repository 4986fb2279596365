"""Prometheus metrics of the webhook, in a registry of its own (one per application)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest

from webhook.admission import Outcome

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"


class WebhookMetrics:
    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry()
        self.duration = Histogram(
            "tf_webhook_request_duration_seconds", "Time to answer one AdmissionReview.",
            buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0),
            registry=self.registry,
        )
        self.decisions = Counter("tf_webhook_decisions_total", "AdmissionReviews answered, by outcome.",
                                 ["outcome"], registry=self.registry)
        self.denials = Counter("tf_webhook_denials_total",
                               "Denied pods, by the annotation key or rule at fault.", ["reason"],
                               registry=self.registry)
        for outcome in Outcome:
            self.decisions.labels(outcome=outcome.value)

    def observe(self, seconds: float, outcome: Outcome, denial_reason: str | None) -> None:
        self.duration.observe(seconds)
        self.decisions.labels(outcome=outcome.value).inc()
        if denial_reason is not None:
            self.denials.labels(reason=denial_reason).inc()

    def exposition(self) -> bytes:
        return bytes(generate_latest(self.registry))
