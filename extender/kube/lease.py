"""A coordination.k8s.io Lease, the way the process's leader holds it (``controllers.leadership``).

``lease_action`` decides (pure); ``LeaseKeeper`` reads and writes the Lease.
"""

from __future__ import annotations

import datetime as dt
import time
from collections.abc import Callable, Mapping
from enum import Enum
from typing import Any

from kubernetes import client

from extender.common.timefmt import parse_time
from extender.kube.client import api_call, error_status, get_or_none, request_json

_MICROTIME = "%Y-%m-%dT%H:%M:%S.%fZ"


class LeaseAction(Enum):
    CREATE = "create"
    TAKE = "take"  # free or expired: take it over
    RENEW = "renew"
    WAIT = "wait"  # someone else holds it


def format_time(value: dt.datetime) -> str:
    return value.astimezone(dt.UTC).strftime(_MICROTIME)


def lease_action(lease: Mapping[str, Any] | None, identity: str, now: dt.datetime) -> LeaseAction:
    if lease is None:
        return LeaseAction.CREATE
    spec = lease.get("spec") or {}
    holder = spec.get("holderIdentity") or ""
    if holder == identity:
        return LeaseAction.RENEW
    if not holder:
        return LeaseAction.TAKE
    renewed = parse_time(spec.get("renewTime")) or parse_time(spec.get("acquireTime"))
    duration = spec.get("leaseDurationSeconds") or 0
    if renewed is None or now > renewed + dt.timedelta(seconds=float(duration)):
        return LeaseAction.TAKE
    return LeaseAction.WAIT


def lease_body(name: str, namespace: str, identity: str, now: dt.datetime, duration_seconds: float,
               current: Mapping[str, Any] | None, action: LeaseAction) -> dict[str, Any]:
    """The Lease to write for ``action`` (CREATE, TAKE or RENEW)."""
    spec: dict[str, Any] = dict((current or {}).get("spec") or {})
    stamp = format_time(now)
    if action is not LeaseAction.RENEW:
        spec["acquireTime"] = stamp
        if action is LeaseAction.TAKE:
            spec["leaseTransitions"] = int(spec.get("leaseTransitions") or 0) + 1
    spec.update({"holderIdentity": identity, "leaseDurationSeconds": max(1, round(duration_seconds)),
                 "renewTime": stamp})
    metadata: dict[str, Any] = {"name": name, "namespace": namespace}
    version = ((current or {}).get("metadata") or {}).get("resourceVersion")
    if version:
        metadata["resourceVersion"] = version
    return {"apiVersion": "coordination.k8s.io/v1", "kind": "Lease", "metadata": metadata, "spec": spec}


def released_body(current: Mapping[str, Any], now: dt.datetime) -> dict[str, Any]:
    body = dict(current)
    spec = dict(current.get("spec") or {})
    spec.update({"holderIdentity": None, "leaseDurationSeconds": 1, "renewTime": format_time(now)})
    body["spec"] = spec
    return body


class LeaseKeeper:
    """Takes, renews and releases one Lease; ``is_leader`` is true only while the last renewal is fresh.
    The renewal loop is ``controllers.leadership.Leadership``'s, one for every Lease of the process."""

    def __init__(self, api_client: client.ApiClient, name: str, namespace: str, identity: str, *,
                 duration_seconds: float = 15.0, renew_seconds: float = 5.0,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.api_client = api_client
        self.name = name
        self.namespace = namespace
        self.identity = identity
        self.duration_seconds = duration_seconds
        self.renew_seconds = renew_seconds
        self._clock = clock
        self._renewed_at: float | None = None

    @property
    def path(self) -> str:
        return f"/apis/coordination.k8s.io/v1/namespaces/{self.namespace}/leases/{self.name}"

    @property
    def is_leader(self) -> bool:
        # A margin below the duration so two replicas never both think they hold it.
        return (self._renewed_at is not None
                and self._clock() - self._renewed_at < self.duration_seconds * 0.8)

    async def try_acquire(self) -> bool:
        started = self._clock()
        current = await self._read()
        now = dt.datetime.now(dt.UTC)
        action = lease_action(current, self.identity, now)
        if action is LeaseAction.WAIT:
            self._renewed_at = None
            return False
        body = lease_body(self.name, self.namespace, self.identity, now, self.duration_seconds, current,
                          action)
        try:
            if action is LeaseAction.CREATE:
                collection = self.path.rsplit("/", 1)[0]
                await api_call(request_json, self.api_client, "POST", collection, body=body)
            else:
                await api_call(request_json, self.api_client, "PUT", self.path, body=body)
        except Exception as exc:
            if error_status(exc) in (409, 422):  # someone else wrote it first
                self._renewed_at = None
                return False
            raise
        self._renewed_at = started
        return True

    async def release(self) -> None:
        if self._renewed_at is None:
            return
        self._renewed_at = None
        current = await self._read()
        if current is None or (current.get("spec") or {}).get("holderIdentity") != self.identity:
            return
        await api_call(request_json, self.api_client, "PUT", self.path,
                       body=released_body(current, dt.datetime.now(dt.UTC)))

    async def _read(self) -> dict[str, Any] | None:
        return await get_or_none(self.api_client, self.path)
