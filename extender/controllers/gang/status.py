"""``status.gang`` of the TensorFusionWorkload behind a gang (TensorFusion's field): written by the leader,
only when it changed, only on workloads that exist (the gang does not create them)."""

from __future__ import annotations

import datetime as dt
import logging
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

from extender.common.gang import NATIVE_GROUP_PREFIX
from extender.controllers.gang.controller import Gang, Phase
from extender.gang.quorum import is_bound, is_live

log = logging.getLogger(__name__)

# (namespace, name, status) -> the workload as patched, None when it does not exist
PatchStatus = Callable[[str, str, dict[str, Any]], Awaitable[Mapping[str, Any] | None]]
EventSink = Callable[[dict[str, Any], str, str, str], None]  # (object, reason, message, type)


def _ready(pod: Mapping[str, Any]) -> bool:
    conditions = (pod.get("status") or {}).get("conditions") or []
    return any(c.get("type") == "Ready" and c.get("status") == "True" for c in conditions)


def gang_status(gang: Gang, since: dt.datetime) -> dict[str, Any]:
    """TensorFusion's ``status.gang`` of one gang; ``since``: when its phase last changed."""
    live = [p for p in gang.members.values() if is_live(p)]
    scheduled = sum(1 for p in live if is_bound(p))
    status: dict[str, Any] = {
        "phase": gang.phase.value, "groupKey": gang.key, "desiredMembers": gang.desired or gang.required,
        "waitingMembers": len(live) - scheduled, "scheduledMembers": scheduled,
        "readyMembers": sum(1 for p in live if _ready(p)),
        "lastTransitionTime": since.astimezone(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "reason": gang.phase.value if gang.phase is not Phase.RUNNING else "QuorumBound",
        "message": gang.reason,
    }
    return status


class StatusWriter:
    """Remembers what it wrote last per gang, and when each gang's phase changed."""

    def __init__(self, patch: PatchStatus, events: EventSink | None = None) -> None:
        self._patch = patch
        self._events = events or (lambda obj, reason, message, type_: None)
        self._written: dict[str, dict[str, Any]] = {}
        self._since: dict[str, tuple[Phase, dt.datetime]] = {}
        self._absent: set[str] = set()  # gangs without a TensorFusionWorkload, not asked again

    async def write(self, gangs: Mapping[str, Gang], now: dt.datetime) -> None:
        for key in [k for k in self._written if k not in gangs]:
            self._written.pop(key, None)
            self._since.pop(key, None)
            self._absent.discard(key)
        for key, gang in gangs.items():
            namespace, _, name = key.partition("/")
            if not name or name.startswith(NATIVE_GROUP_PREFIX) or key in self._absent:
                continue
            phase, since = self._since.get(key, (None, now))
            if phase is not gang.phase:
                since = now
                self._since[key] = (gang.phase, now)
            status = gang_status(gang, since)
            before = self._written.get(key)
            if before == status:
                continue
            workload = await self._patch(namespace, name, {"gang": status})
            if workload is None:
                self._absent.add(key)
                continue
            self._written[key] = status
            if before is None or before.get("phase") != status["phase"]:
                warning = gang.phase in (Phase.TIMED_OUT, Phase.FAILED)
                self._events(dict(workload), f"Gang{gang.phase.value}",
                             gang.reason or f"gang {key}: {status['scheduledMembers']} members bound",
                             "Warning" if warning else "Normal")
            log.info("workload gang status", extra={"gang": key, "phase": gang.phase.value})
