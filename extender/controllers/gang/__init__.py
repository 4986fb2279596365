"""Gang scheduling (DESIGN §6e): the keeper of gangs (``controller``) answers its members' filters, places
each gang whole and holds its GPUs, and times gangs out; ``metrics`` counts waiting gangs and the time to
place one. The decisions are pure, in ``extender.gang``; the contract is ``extender.common.gang``."""

from __future__ import annotations

import argparse
import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from extender.common.options import duration

if TYPE_CHECKING:
    from extender.controllers.wiring import Built, Deps

NAME = "gang"
log = logging.getLogger(__name__)


@dataclass(frozen=True)
class GangOptions:
    enabled: bool = True
    reserve_seconds: float = 60.0
    preempt: bool = True


DEFAULT = GangOptions()
__all__ = ["DEFAULT", "NAME", "GangOptions", "add_arguments", "build", "from_args"]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("gang scheduling (tensor-fusion.ai/gang-enabled, PodGroup)")
    group.add_argument("--gang-scheduling", action=argparse.BooleanOptionalAction, default=True,
                       help="place the pods of a gang (tensor-fusion.ai/gang-enabled, or a PodGroup with a "
                            "gang policy) all together or not at all (default on)")
    group.add_argument("--gang-reserve-timeout", metavar="DURATION",
                       type=duration("--gang-reserve-timeout", positive=True),
                       default=DEFAULT.reserve_seconds,
                       help="how long a gang placed whole keeps its GPUs for members that have not bound "
                            "yet before it is released and placed again (default 1m)")


def from_args(args: argparse.Namespace) -> GangOptions:
    return GangOptions(enabled=bool(args.gang_scheduling), reserve_seconds=float(args.gang_reserve_timeout),
                       preempt=bool(args.preemptor))


def build(deps: Deps, settings: GangOptions) -> Built | None:
    """The keeper on every replica (each answers its own filters), fed by the GPU pods' watch; PodGroups
    are read when the API server serves them."""
    if not settings.enabled:
        return None
    import datetime as dt

    from extender.controllers.gang.controller import GangKeeper, Phase
    from extender.controllers.gang.metrics import GangMetrics
    from extender.controllers.runner import Reconciler
    from extender.controllers.wiring import Built
    from extender.gang.placement import admit_by_quota
    from extender.kube.resources import POD_GROUPS

    metrics = GangMetrics(deps.registry)
    pod_groups = deps.informers.cache(POD_GROUPS, optional=True, name="podgroups")

    def record(obj: dict[str, Any], reason: str, message: str, type_: str) -> None:
        deps.recorder.record(obj, reason, message, type_)

    from extender.controllers.runner import KeyedQueue, KeyedReconciler
    from extender.kube.client import error_message, not_found

    evictions: KeyedQueue[list[Any]] = KeyedQueue()
    keeper = GangKeeper(deps.state, reserve_seconds=settings.reserve_seconds, events=record,
                        admit_gang=admit_by_quota(deps.state),
                        pod_groups=lambda namespace, name: pod_groups.get(name, namespace),
                        on_placed=metrics.time_to_place.observe,
                        evict=evictions.add if settings.preempt else None)

    async def evict(gang: str, victims: list[Any]) -> float | None:
        """Evict a gang's victims through the Eviction API (PodDisruptionBudgets hold: a refusal is
        retried at the gang's next filter, after its victims' uids stop holding)."""
        for victim in victims:
            try:
                await deps.pod_api.evict(victim.namespace, victim.name, victim.uid)
            except Exception as exc:
                if not not_found(exc):
                    log.warning("gang preemption: eviction refused", extra={
                        "gang": gang, "pod": f"{victim.namespace}/{victim.name}",
                        "error": error_message(exc)})
        return None
    deps.core.pods.subscribe(keeper.observe)

    async def reconcile(now: dt.datetime) -> float | None:
        keeper.sweep()
        counts: dict[Phase, int] = {phase: 0 for phase in Phase if phase is not Phase.RUNNING}
        for gang in keeper.waiting():
            counts[gang.phase] = counts.get(gang.phase, 0) + 1
        for phase, count in counts.items():
            metrics.waiting.labels(phase.value).set(count)
        return 1.0

    from extender.controllers.gang.status import StatusWriter
    from extender.kube.resources import TENSOR_FUSION_WORKLOADS, object_path

    async def patch_status(namespace: str, name: str, status: dict[str, Any]) -> dict[str, Any] | None:
        path = object_path(TENSOR_FUSION_WORKLOADS, name, namespace, subresource="status")
        try:
            patched: dict[str, Any] = await deps.kube.request(
                "PATCH", path, body={"status": status}, content_type="application/merge-patch+json",
                timeout=10.0)
        except Exception as exc:
            if not_found(exc):
                return None
            raise
        return patched

    writer = StatusWriter(patch_status, record)

    async def lead(now: dt.datetime) -> float | None:
        """The leader's part: release gangs left half bound, write status.gang."""
        for gang, bound in keeper.half_bound():
            for pod in bound:
                meta = pod.get("metadata") or {}
                deps.recorder.record(pod, "GangReleased", gang.reason, "Warning")
                try:  # through the Eviction API: a PodDisruptionBudget may say not now (tried next round)
                    await deps.pod_api.evict(str(meta.get("namespace")), str(meta.get("name")),
                                             str(meta.get("uid")))
                except Exception as exc:
                    if not not_found(exc):
                        log.warning("gang member not released", extra={
                            "gang": gang.key, "pod": f"{meta.get('namespace')}/{meta.get('name')}",
                            "error": error_message(exc)})
        await writer.write(dict(keeper.gangs), now)
        return 2.0

    controller = Reconciler("gang", reconcile, interval=1.0, caches=(deps.core.pods,))
    preemptor = KeyedReconciler("gang-preemptor", evict, queue=evictions, caches=(deps.core.pods,),
                                retry_errors=False)
    status = Reconciler("gang-status", lead, interval=2.0, leader_only=True, caches=(deps.core.pods,))
    return Built(controllers=(controller, status, preemptor), hooks=(keeper,), part=keeper)
