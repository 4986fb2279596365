"""Claims created by the expander that are still waiting for their node, and the pods that wait for
them (pure).

Each claim carries the GPUs of its template node, empty, minus what the pods virtually assigned to it
take, so that a pod which fits a node already on its way creates nothing new.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from extender.common.contract import GPURequest
from extender.controllers.expansion.fit import choose, empty_copy, take
from extender.controllers.expansion.nodeclaim import pod_accepts_claim
from extender.scheduling.inventory import GPUDevice
from extender.scheduling.placement import Slot

Lookup = Callable[[str], Mapping[str, Any] | None]
NodeArrived = Callable[[str, str], bool]

# A claim we created but have not seen in the watch yet is not "gone" before this.
DEFAULT_UNSEEN_GRACE_SECONDS = 60.0


@dataclass(frozen=True)
class PodRef:
    namespace: str
    name: str
    uid: str

    @staticmethod
    def of(pod: Mapping[str, Any]) -> PodRef:
        meta = pod.get("metadata") or {}
        return PodRef(str(meta.get("namespace", "")), str(meta.get("name", "")), str(meta.get("uid", "")))

    def as_object(self) -> dict[str, Any]:
        """A stub pod, enough to be the involved object of an event."""
        return {"apiVersion": "v1", "kind": "Pod",
                "metadata": {"namespace": self.namespace, "name": self.name, "uid": self.uid}}

    def __str__(self) -> str:
        return f"{self.namespace}/{self.name}"


class LeaveReason(StrEnum):
    REGISTERED = "its node registered"
    READY = "it became Ready"
    GONE = "it was deleted"
    TIMEOUT = "it timed out"


@dataclass(frozen=True)
class Departure:
    claim: str
    reason: LeaveReason
    pods: tuple[PodRef, ...]


@dataclass
class InFlightClaim:
    name: str
    body: Mapping[str, Any]
    created_at: float
    gpus: list[Slot]
    pods: dict[str, PodRef] = field(default_factory=dict)
    seen: bool = False
    node_name: str = ""
    provider_id: str = ""
    external: bool = False  # Karpenter's own claim, not created by the expander

    @property
    def gpus_known(self) -> bool:
        return bool(self.gpus)

    def fits(self, pod: Mapping[str, Any], request: GPURequest) -> list[int] | None:
        if not pod_accepts_claim(pod, self.body):
            return None
        return choose(self.gpus, request)


def _condition_true(obj: Mapping[str, Any], kind: str) -> bool:
    conditions = (obj.get("status") or {}).get("conditions") or []
    return any(c.get("type") == kind and c.get("status") == "True" for c in conditions)


class InFlight:
    def __init__(self, max_in_flight: int, timeout_seconds: float,
                 unseen_grace_seconds: float = DEFAULT_UNSEEN_GRACE_SECONDS) -> None:
        self.max_in_flight = max_in_flight
        self.timeout_seconds = timeout_seconds
        self.unseen_grace_seconds = unseen_grace_seconds
        self._claims: dict[str, InFlightClaim] = {}

    def __len__(self) -> int:
        return len(self._claims)

    def __iter__(self) -> Iterator[InFlightClaim]:
        return iter(list(self._claims.values()))

    def __contains__(self, name: object) -> bool:
        return name in self._claims

    @property
    def own(self) -> int:
        """Claims the expander created (Karpenter's own do not count against ``max_in_flight``)."""
        return sum(1 for claim in self._claims.values() if not claim.external)

    @property
    def full(self) -> bool:
        return self.own >= self.max_in_flight

    def get(self, name: str) -> InFlightClaim | None:
        return self._claims.get(name)

    def add(self, name: str, body: Mapping[str, Any], devices: list[GPUDevice], now: float,
            external: bool = False) -> InFlightClaim:
        claim = InFlightClaim(name=name, body=body, created_at=now, gpus=empty_copy(devices),
                              external=external)
        self._claims[name] = claim
        return claim

    def fits_in_flight(self, pod: Mapping[str, Any], request: GPURequest) -> str | None:
        """The oldest in-flight claim whose node would still fit the pod, or None."""
        for claim in self._claims.values():
            if claim.fits(pod, request) is not None:
                return claim.name
        return None

    def waiting_on(self, uid: str) -> str | None:
        for claim in self._claims.values():
            if uid in claim.pods:
                return claim.name
        return None

    def assign(self, name: str, pod: Mapping[str, Any], request: GPURequest) -> bool:
        """Count the pod against the claim's GPUs. False when it does not fit there (nothing changes)."""
        claim = self._claims.get(name)
        if claim is None:
            return False
        ref = PodRef.of(pod)
        if ref.uid in claim.pods:
            return True
        if not claim.gpus_known:  # a Karpenter claim of unknown shape: it holds the pods nominated to it
            claim.pods[ref.uid] = ref
            return True
        positions = claim.fits(pod, request)
        if positions is None:
            return False
        take(claim.gpus, positions, request)
        claim.pods[ref.uid] = ref
        return True

    def remove(self, name: str, reason: LeaveReason) -> Departure | None:
        claim = self._claims.pop(name, None)
        if claim is None:
            return None
        return Departure(name, reason, tuple(claim.pods.values()))

    def settle(self, claim_lookup: Lookup, node_arrived: NodeArrived, now: float) -> list[Departure]:
        """Let go of the claims whose node is there, that are Ready, gone, or past the timeout.

        ``node_arrived(node_name, provider_id)`` tells whether the claim's Node is there and usable.
        """
        leaving: list[tuple[str, LeaveReason]] = []
        for claim in self._claims.values():
            reason = self._reason_to_leave(claim, claim_lookup(claim.name), node_arrived, now)
            if reason is not None:
                leaving.append((claim.name, reason))
        return [d for name, reason in leaving if (d := self.remove(name, reason)) is not None]

    def _reason_to_leave(self, claim: InFlightClaim, obj: Mapping[str, Any] | None,
                         node_arrived: NodeArrived, now: float) -> LeaveReason | None:
        if obj is None:
            if claim.seen or now - claim.created_at > self.unseen_grace_seconds:
                return LeaveReason.GONE
        else:
            claim.seen = True
            if (obj.get("metadata") or {}).get("deletionTimestamp"):
                return LeaveReason.GONE
            status = obj.get("status") or {}
            claim.node_name = str(status.get("nodeName") or "")
            claim.provider_id = str(status.get("providerID") or "")
            if _condition_true(obj, "Ready") or _condition_true(obj, "Initialized"):
                return LeaveReason.READY
            if (claim.node_name or claim.provider_id) and node_arrived(claim.node_name, claim.provider_id):
                return LeaveReason.REGISTERED
        if now - claim.created_at > self.timeout_seconds:
            return LeaveReason.TIMEOUT
        return None
