"""Prometheus metrics of the webhook, in a registry of its own (one per application)."""

from __future__ import annotations

from pathlib import Path

from cryptography import x509
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

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
        # the labelled children, looked up once (``labels()`` takes a lock and builds a key per call)
        self._by_outcome = {outcome: self.decisions.labels(outcome=outcome.value) for outcome in Outcome}

    def track_certificate(self, cert_file: Path) -> None:
        """Export the serving certificate's expiry (read from the file on each scrape; the server reloads
        the same file within seconds of a change). 0 when the file cannot be read, which alerts too."""
        gauge = Gauge("tf_webhook_certificate_expiry_timestamp_seconds",
                      "Unix time at which the webhook's serving certificate expires", registry=self.registry)
        gauge.set_function(lambda: certificate_not_after(cert_file))

    def observe(self, seconds: float, outcome: Outcome, denial_reason: str | None) -> None:
        self.duration.observe(seconds)
        self._by_outcome[outcome].inc()
        if denial_reason is not None:
            self.denials.labels(reason=denial_reason).inc()

    def exposition(self) -> bytes:
        return bytes(generate_latest(self.registry))


def certificate_not_after(cert_file: Path) -> float:
    try:
        certificate = x509.load_pem_x509_certificate(cert_file.read_bytes())
    except (OSError, ValueError):
        return 0.0
    return certificate.not_valid_after_utc.timestamp()
