"""The status writer: TensorFusion's status from the ledger, one write per change, an event when the alert
threshold is crossed; the gauges per namespace and dimension."""

from __future__ import annotations

import datetime as dt
from typing import Any

from prometheus_client import CollectorRegistry

from extender.controllers.quota.controller import QuotaMetrics, QuotaStatusWriter
from extender.quota.book import QuotaBook
from extender.scheduling.state import Kind
from tests.unit.fixtures.scheduling import bound, gpu, make

NOW = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)


class Api:
    def __init__(self) -> None:
        self.writes: list[tuple[str, str, dict[str, Any]]] = []

    async def patch_status(self, namespace: str, name: str, status: dict[str, Any]) -> dict[str, Any]:
        self.writes.append((namespace, name, status))
        return {}


class Events:
    def __init__(self) -> None:
        self.recorded: list[tuple[str, str]] = []

    def record(self, obj: dict[str, Any], reason: str, message: str, type_: str = "Normal") -> None:
        self.recorded.append((reason, type_))


QUOTA = {"metadata": {"name": "q", "namespace": "ml", "uid": "u1"},
         "spec": {"total": {"requests": {"tflops": "100", "vram": "100Gi"}, "alertThresholdPercent": 90}}}


async def test_status_is_written_on_change_with_an_event_when_the_threshold_is_crossed():
    state = make(gpu("g1", "n1"), gpu("g2", "n1", index=1), bound("a", "n1", "g1", tflops="50"))
    stored = [dict(QUOTA)]

    class Store:
        def list(self) -> list[dict[str, Any]]:
            return stored

    api, events, registry = Api(), Events(), CollectorRegistry()
    writer = QuotaStatusWriter(QuotaBook(state, Store().list), Store(), api, events, QuotaMetrics(registry))
    await writer.reconcile(NOW)
    (write,) = api.writes
    assert write[2]["used"]["requests"] == {"tflops": "50", "vram": "4Gi"}
    assert write[2]["availablePercent"]["requests.tflops"] == "50.00"
    assert write[2]["conditions"][0]["reason"] == "CapacitySufficient"
    labels = {"namespace": "ml", "kind": "requests"}
    assert registry.get_sample_value("tf_extender_quota_used_tflops", labels) == 50
    assert registry.get_sample_value("tf_extender_quota_total_vram_bytes",
                                     {"namespace": "ml", "kind": "requests"}) == 100 * 2**30
    stored[0] = {**QUOTA, "status": write[2]}
    await writer.reconcile(NOW)
    assert len(api.writes) == 1  # nothing changed
    state.apply(Kind.POD, "ADDED", bound("b", "n1", "g2", tflops="45"))
    await writer.reconcile(NOW + dt.timedelta(seconds=5))
    assert len(api.writes) == 2
    assert api.writes[1][2]["conditions"][0]["reason"] == "AlertThresholdReached"
    assert events.recorded == [("AlertThresholdReached", "Warning")]
