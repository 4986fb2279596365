"""Prometheus metrics of gangs."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Gauge, Histogram

PLACE_BUCKETS = (0.1, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 600.0, 1800.0, 3600.0)


class GangMetrics:
    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        r = registry or CollectorRegistry()
        self.waiting = Gauge("tf_extender_gangs_waiting",
                             "Gangs whose quorum is not bound yet, by phase (Pending, Waiting, Scheduling, "
                             "TimedOut)", ["phase"], registry=r)
        self.time_to_place = Histogram("tf_extender_gang_time_to_place_seconds",
                                       "From a gang's first member seen to the whole gang placed",
                                       buckets=PLACE_BUCKETS, registry=r)
