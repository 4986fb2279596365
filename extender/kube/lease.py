"""A coordination.k8s.io Lease, held the way client-go's leader election holds it
(``controllers.leadership`` renews every Lease of the process).

Two rules make two holders impossible whatever the replicas' wall clocks say:

- *Expiry is local.* A replica never compares its wall clock with the holder's ``renewTime``. It remembers
  the record it last read (holder, acquire and renew times, transitions, duration: client-go's
  ``observedRecord``) and when, on its own monotonic clock, it first read it like that (``observedTime``).
  The Lease is expired only once ``leaseDurationSeconds`` have passed on that clock with the record
  unchanged. The timestamps written are for people; no decision reads them.
- *A leader stops before it can be replaced.* ``is_leader`` holds for ``renew_deadline_seconds`` (less
  than the duration) from the moment the last successful write was *sent*. Another replica can only have
  seen that write after it was sent, so it waits a full duration from a later instant: the old leader has
  stopped acting by then (client-go's ``RenewDeadline`` < ``LeaseDuration``).

``lease_action`` decides (pure); ``LeaseKeeper`` reads and writes the Lease through a ``LeaseStore``.
"""

from __future__ import annotations

import datetime as dt
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from enum import Enum
from typing import Any, Protocol

from kubernetes import client

from extender.kube.client import api_call, error_status, get_or_none, request_json

_MICROTIME = "%Y-%m-%dT%H:%M:%S.%fZ"

Record = tuple[str, str, str, int, int]


class LeaseAction(Enum):
    CREATE = "create"
    TAKE = "take"  # free, or unchanged for a whole duration on our clock: take it over
    RENEW = "renew"
    WAIT = "wait"  # someone else holds it


@dataclass(frozen=True)
class Observation:
    """The Lease's record as this replica last read it, and when (its monotonic clock) it first read it so."""

    record: Record
    at: float

    @property
    def holder(self) -> str:
        return self.record[0]

    @property
    def duration_seconds(self) -> int:
        return self.record[4]


def format_time(value: dt.datetime) -> str:
    return value.astimezone(dt.UTC).strftime(_MICROTIME)


def record_of(lease: Mapping[str, Any]) -> Record:
    """The fields whose change shows the holder is alive (client-go's LeaderElectionRecord)."""
    spec = lease.get("spec") or {}
    return (str(spec.get("holderIdentity") or ""), str(spec.get("acquireTime") or ""),
            str(spec.get("renewTime") or ""), _int(spec.get("leaseTransitions")),
            _int(spec.get("leaseDurationSeconds")))


def _int(value: Any) -> int:
    try:
        return int(value or 0)
    except (TypeError, ValueError):
        return 0


def observe(previous: Observation | None, lease: Mapping[str, Any] | None, now: float) -> Observation | None:
    """The observation after reading ``lease`` at ``now``: the previous one while the record is unchanged,
    else a new one starting now."""
    if lease is None:
        return None
    record = record_of(lease)
    if previous is not None and previous.record == record:
        return previous
    return Observation(record, now)


def lease_action(lease: Mapping[str, Any] | None, identity: str, observation: Observation | None,
                 now: float, default_duration_seconds: float) -> LeaseAction:
    """What to do with ``lease`` as read now; ``observation`` is ``observe``'s answer for that read and
    ``now`` the same monotonic clock. A record without a valid duration lasts ``default_duration_seconds``."""
    if lease is None:
        return LeaseAction.CREATE
    holder = record_of(lease)[0]
    if holder == identity:
        return LeaseAction.RENEW
    if not holder:
        return LeaseAction.TAKE
    if observation is None or observation.record != record_of(lease):
        return LeaseAction.WAIT  # just seen like this: its duration starts now
    duration = observation.duration_seconds if observation.duration_seconds > 0 else default_duration_seconds
    return LeaseAction.TAKE if now - observation.at >= duration else LeaseAction.WAIT


def seconds_left(lease: Mapping[str, Any] | None, identity: str, observation: Observation | None,
                 now: float, default_duration_seconds: float) -> float | None:
    """How long, on this replica's clock, until ``lease`` (as last read) may be taken; None when there is
    nothing to wait for (no Lease, ours, free, or not yet observed)."""
    if lease is None or observation is None or observation.record != record_of(lease):
        return None
    holder = observation.holder
    if not holder or holder == identity:
        return None
    duration = observation.duration_seconds if observation.duration_seconds > 0 else default_duration_seconds
    return max(0.0, observation.at + duration - now)


def lease_body(name: str, namespace: str, identity: str, now: dt.datetime, duration_seconds: float,
               current: Mapping[str, Any] | None, action: LeaseAction) -> dict[str, Any]:
    """The Lease to write for ``action`` (CREATE, TAKE or RENEW); ``now`` is only written, never read."""
    spec: dict[str, Any] = dict((current or {}).get("spec") or {})
    stamp = format_time(now)
    if action is not LeaseAction.RENEW:
        spec["acquireTime"] = stamp
        if action is LeaseAction.TAKE:
            spec["leaseTransitions"] = _int(spec.get("leaseTransitions")) + 1
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


class LeaseStore(Protocol):
    """Where one Lease lives: the API server (``KubeLeaseStore``), or a test's dictionary. A write that
    loses a race raises an error whose ``error_status`` is 409 (or 422)."""

    async def read(self) -> dict[str, Any] | None: ...

    async def create(self, body: dict[str, Any]) -> None: ...

    async def replace(self, body: dict[str, Any]) -> None: ...


class KubeLeaseStore:
    def __init__(self, api_client: client.ApiClient, name: str, namespace: str) -> None:
        self.api_client = api_client
        self.path = f"/apis/coordination.k8s.io/v1/namespaces/{namespace}/leases/{name}"

    async def read(self) -> dict[str, Any] | None:
        return await get_or_none(self.api_client, self.path)

    async def create(self, body: dict[str, Any]) -> None:
        await api_call(request_json, self.api_client, "POST", self.path.rsplit("/", 1)[0], body=body)

    async def replace(self, body: dict[str, Any]) -> None:
        await api_call(request_json, self.api_client, "PUT", self.path, body=body)


class LeaseKeeper:
    """Takes, renews and releases one Lease. ``is_leader`` is true for ``renew_deadline_seconds`` after the
    last successful write was sent, so a holder that cannot renew stops acting before anyone may take the
    Lease. ``clock`` is this replica's monotonic clock (every decision), ``wall`` only fills in the
    timestamps written. The renewal loop is ``controllers.leadership.Leadership``'s."""

    def __init__(self, api_client: client.ApiClient | None, name: str, namespace: str, identity: str, *,
                 duration_seconds: float = 15.0, renew_deadline_seconds: float = 10.0,
                 clock: Callable[[], float] = time.monotonic,
                 wall: Callable[[], dt.datetime] = lambda: dt.datetime.now(dt.UTC),
                 store: LeaseStore | None = None) -> None:
        if not 0 < renew_deadline_seconds < duration_seconds:
            raise ValueError(f"the renew deadline ({renew_deadline_seconds:g}s) must be positive and shorter "
                             f"than the lease duration ({duration_seconds:g}s)")
        if store is None:
            if api_client is None:
                raise ValueError("a LeaseKeeper needs an API client or a store")
            store = KubeLeaseStore(api_client, name, namespace)
        self.store = store
        self.name = name
        self.namespace = namespace
        self.identity = identity
        self.duration_seconds = duration_seconds
        self.renew_deadline_seconds = renew_deadline_seconds
        self._clock = clock
        self._wall = wall
        self._renewed_at: float | None = None
        self.observed: Observation | None = None
        self._last: dict[str, Any] | None = None  # the Lease as last read, for ``expires_in``

    @property
    def is_leader(self) -> bool:
        return (self._renewed_at is not None
                and self._clock() - self._renewed_at < self.renew_deadline_seconds)

    def expires_in(self) -> float | None:
        """Seconds until the Lease as last read may be taken (0 once it may); None when not waiting on
        another holder."""
        return seconds_left(self._last, self.identity, self.observed, self._clock(), self.duration_seconds)

    async def observe(self) -> None:
        """Read the Lease and note its record without writing: its expiry clock starts now, so a replica
        that waits on an earlier Lease can take this one the moment it gets there."""
        current = await self.store.read()
        self._note(current, self._clock())

    def _note(self, current: dict[str, Any] | None, read_at: float) -> None:
        self._last = current
        self.observed = observe(self.observed, current, read_at)

    async def try_acquire(self) -> bool:
        started = self._clock()
        current = await self.store.read()
        read_at = self._clock()
        self._note(current, read_at)
        action = lease_action(current, self.identity, self.observed, read_at, self.duration_seconds)
        if action is LeaseAction.WAIT:
            self._renewed_at = None
            return False
        body = lease_body(self.name, self.namespace, self.identity, self._wall(), self.duration_seconds,
                          current, action)
        try:
            if action is LeaseAction.CREATE:
                await self.store.create(body)
            else:
                await self.store.replace(body)
        except Exception as exc:
            if error_status(exc) in (409, 422):  # someone else wrote it first
                self._renewed_at = None
                return False
            raise
        self._renewed_at = started
        self._last = body
        self.observed = Observation(record_of(body), self._clock())
        return True

    async def release(self) -> None:
        if self._renewed_at is None:
            return
        self._renewed_at = None
        current = await self.store.read()
        if current is None or (current.get("spec") or {}).get("holderIdentity") != self.identity:
            return
        await self.store.replace(released_body(current, self._wall()))
