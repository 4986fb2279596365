"""Prometheus metrics of node expansion, registered on the extender's registry."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter


class ExpansionMetrics:
    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry()
        self.capacity_only_failures = Counter(
            "tf_extender_capacity_only_failures_total",
            "Pods flagged as failing only for lack of GPU capacity (once per pod)",
            ["pool"], registry=self.registry)
        self.nodeclaims_created = Counter(
            "tf_extender_nodeclaims_created_total", "Karpenter NodeClaims created by node expansion",
            ["nodepool"], registry=self.registry)
