"""The GPUResourceQuota status writer (the leader only) and the quota gauges.

Each pass reads every quota from the watch cache and its namespace's usage from the ledger (``QuotaBook``),
and patches ``status`` where it differs from the stored one (``used``, ``availablePercent``, the ``Ready``
condition; ``lastUpdateTime`` moves only with them), so an idle namespace costs no write. When a quota's
condition turns to ``AlertThresholdReached`` a Warning event of that reason goes to the quota. The gauges
(every replica) give used and total per namespace and dimension, in TFLOPS, bytes and workers.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import logging
from collections.abc import Mapping
from typing import Any, Protocol

from kubernetes import client
from prometheus_client import CollectorRegistry, Counter, Gauge

from extender.kube.client import api_call, error_message, error_status, request_json
from extender.kube.resources import GPU_RESOURCE_QUOTAS, object_path
from extender.quota import Quota, Usage
from extender.quota.book import QuotaBook
from extender.quota.status import ALERT_THRESHOLD_REACHED, crossed_alert, quota_status

log = logging.getLogger(__name__)

MERGE_PATCH = "application/merge-patch+json"


class Store(Protocol):
    def list(self) -> list[dict[str, Any]]: ...


class EventSink(Protocol):
    def record(self, obj: dict[str, Any], reason: str, message: str, type_: str = "Normal") -> None: ...


class QuotaStatusApi(Protocol):
    async def patch_status(self, namespace: str, name: str, status: dict[str, Any]) -> dict[str, Any]: ...


class KubeQuotaStatusApi:
    def __init__(self, api_client: client.ApiClient) -> None:
        self.api_client = api_client

    async def patch_status(self, namespace: str, name: str, status: dict[str, Any]) -> dict[str, Any]:
        path = object_path(GPU_RESOURCE_QUOTAS, name, namespace, subresource="status")
        patched: dict[str, Any] = await api_call(request_json, self.api_client, "PATCH", path,
                                                 body={"status": status}, content_type=MERGE_PATCH)
        return patched


class QuotaMetrics:
    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        labels = ["namespace", "kind"]  # kind: requests or limits
        self.used_tflops = Gauge("tf_extender_quota_used_tflops",
                                 "TFLOPS a namespace's GPU pods take (requests or limits)",
                                 labels, registry=registry)
        self.used_vram = Gauge("tf_extender_quota_used_vram_bytes",
                               "VRAM bytes a namespace's GPU pods take (requests or limits)", labels,
                               registry=registry)
        self.used_workers = Gauge("tf_extender_quota_used_workers", "GPU pods (workers) a namespace holds",
                                  ["namespace"], registry=registry)
        self.total_tflops = Gauge("tf_extender_quota_total_tflops",
                                  "A namespace's TFLOPS total (its quotas' smallest), where set",
                                  labels, registry=registry)
        self.total_vram = Gauge("tf_extender_quota_total_vram_bytes",
                                "A namespace's VRAM total in bytes (its quotas' smallest), where set",
                                labels, registry=registry)
        self.max_workers = Gauge("tf_extender_quota_max_workers", "A namespace's workers total",
                                 ["namespace"], registry=registry)
        self.alert_threshold = Gauge("tf_extender_quota_alert_threshold_ratio",
                                     "A namespace's alert threshold (spec.total.alertThresholdPercent / 100)",
                                     ["namespace"], registry=registry)
        self.refusals = Counter("tf_extender_quota_refusals_total",
                                "GPU pods a namespace's GPUResourceQuota turned away, by namespace, "
                                "dimension and verb (filter, bind)", ["namespace", "dimension", "verb"],
                                registry=registry)
        self.writes = Counter("tf_extender_quota_status_writes_total",
                              "GPUResourceQuota status writes by outcome", ["outcome"], registry=registry)
        for outcome in ("ok", "error"):
            self.writes.labels(outcome)
        self._namespaces: set[str] = set()

    def show(self, quotas: Mapping[str, list[Quota]], usages: Mapping[str, Usage]) -> None:
        gauges = (self.used_tflops, self.used_vram, self.total_tflops, self.total_vram)
        for namespace in self._namespaces - set(quotas):
            for gauge in gauges:
                for kind in ("requests", "limits"):
                    _drop(gauge, namespace, kind)
            for gauge in (self.used_workers, self.max_workers, self.alert_threshold):
                _drop(gauge, namespace)
        self._namespaces = set(quotas)
        for namespace, items in quotas.items():
            used = usages.get(namespace) or Usage()
            for kind, spent in (("requests", used.requests), ("limits", used.limits)):
                self.used_tflops.labels(namespace, kind).set(float(spent.tflops))
                self.used_vram.labels(namespace, kind).set(spent.vram)
                caps = [c for c in (q.total_requests if kind == "requests" else q.total_limits for q in items)
                        if c is not None]
                if caps:
                    self.total_tflops.labels(namespace, kind).set(float(min(c.tflops for c in caps)))
                    self.total_vram.labels(namespace, kind).set(min(c.vram for c in caps))
                else:
                    _drop(self.total_tflops, namespace, kind)
                    _drop(self.total_vram, namespace, kind)
            self.used_workers.labels(namespace).set(used.workers)
            self.max_workers.labels(namespace).set(min(q.max_workers for q in items))
            self.alert_threshold.labels(namespace).set(min(q.alert_threshold for q in items) / 100)


def _drop(gauge: Gauge, *labels: str) -> None:
    with contextlib.suppress(KeyError):
        gauge.remove(*labels)


def _stored(obj: Mapping[str, Any]) -> dict[str, Any]:
    status = obj.get("status")
    return dict(status) if isinstance(status, Mapping) else {}


class QuotaStatusWriter:
    def __init__(self, book: QuotaBook, quotas: Store, api: QuotaStatusApi, events: EventSink | None = None,
                 metrics: QuotaMetrics | None = None) -> None:
        self.book = book
        self.quotas = quotas
        self.api = api
        self.events = events
        self.metrics = metrics or QuotaMetrics()
        self._written: dict[str, dict[str, Any]] = {}  # uid -> the status last written (the watch may lag)

    def gauges(self) -> None:
        self.metrics.show(self.book.by_namespace(), self.book.usages())

    async def reconcile(self, now: dt.datetime) -> None:
        """One pass over every quota; a failed write is tried again on the next pass."""
        self.gauges()
        stamp = now.strftime("%Y-%m-%dT%H:%M:%SZ")
        for obj in self.quotas.list():
            meta = obj.get("metadata") or {}
            namespace, name, uid = str(meta.get("namespace")), str(meta.get("name")), str(meta.get("uid"))
            quota = next((q for q in self.book.quotas(namespace) if q.name == name), None)
            if quota is None:
                continue
            stored = self._written.get(uid) or _stored(obj)
            wanted = quota_status(quota, self.book.usage(namespace), stored, stamp)
            if wanted == stored or (_without_time(wanted) == _without_time(_stored(obj))):
                continue
            try:
                await self.api.patch_status(namespace, name, wanted)
            except Exception as exc:
                if error_status(exc) == 404:
                    continue
                self.metrics.writes.labels("error").inc()
                log.warning("GPUResourceQuota status write failed",
                            extra={"quota": f"{namespace}/{name}", "error": error_message(exc)})
                continue
            self.metrics.writes.labels("ok").inc()
            self._written[uid] = wanted
            if crossed_alert(_stored(obj), wanted) and self.events is not None:
                condition = wanted["conditions"][0]
                self.events.record(obj, ALERT_THRESHOLD_REACHED, f"GPUResourceQuota {namespace}/{name}: "
                                   f"{condition['message']}", "Warning")
        live = {str((o.get("metadata") or {}).get("uid")) for o in self.quotas.list()}
        for uid in set(self._written) - live:
            del self._written[uid]


def _without_time(status: Mapping[str, Any]) -> dict[str, Any]:
    out = {k: v for k, v in status.items() if k != "lastUpdateTime"}
    out["conditions"] = [{k: v for k, v in c.items() if k != "lastTransitionTime"}
                         for c in status.get("conditions") or [] if isinstance(c, Mapping)]
    return out

