"""The expander's reconciles: capacity-only failures the intake (``intake``) kept become Karpenter NodeClaims
or placeholder pods, off the request path. Decisions are in ``decide``; the cluster is behind
``ExpansionPort``.

Level-triggered, as Karpenter's provisioner is: a filter rejection (or the pod watch) is only the fast path.
Every pending GPU pod the filter turned away, or that no node passed the scheduler's own filters for, stays
in ``pending`` until it is bound or gone, and is reconsidered whenever something it depends on changes
(NodePools, NodeClaims, Nodes, GPUPools: the port's caches wake the reconciles) and at least every
``RECONSIDER_SECONDS``, without waiting for kube-scheduler to send it again: a pod that could not expand
when it was turned away (a NodePool not known yet, no template) expands once it can. Decisions stay
idempotent: a pod queued, waiting on a claim (one node's worth of demand per claim) or just given a node is
left alone, and one whose last decision parked it is decided again only when a dry decision from the caches
comes out different."""

from __future__ import annotations

import asyncio
import datetime as dt
import heapq
import logging
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from extender.common.labels import (
    EXPANSION_LABEL,
    EXPANSION_POD_ANNOTATION,
    EXPANSION_POD_UID_LABEL,
    EXPANSION_TEMPLATE_NODE,
    INSTANCE_TYPE,
    NODEPOOL_LABEL,
)
from extender.controllers.expansion.config import ExpansionConfig
from extender.controllers.expansion.decide import (
    Create,
    Decision,
    LeaveToKarpenter,
    NoTemplate,
    Skip,
    WaitForClaim,
    WaitForSlot,
    decide,
    skip_reason,
)
from extender.controllers.expansion.detect import (
    REASON_COMPLETED,
    REASON_FAILED,
    expands_pool,
    is_capacity_only,
    unschedulable,
)
from extender.controllers.expansion.gang import gang_of, gang_timed_out, plan_gang
from extender.controllers.expansion.inflight import Departure, LeaveReason, PodRef
from extender.controllers.expansion.intake import (
    ExpansionPort,
    Intake,
    Pending,
    Queued,
    Refilter,
    RequestOf,
    new_expansion_id,
    parse_annotations,
)
from extender.controllers.expansion.karpenter import (
    claim_devices,
    consolidation_policy,
    consolidation_warning,
    is_gpu_nodepool,
    is_ours,
    nominated_claims,
    still_coming,
)
from extender.controllers.expansion.metrics import ExpansionMetrics
from extender.controllers.expansion.placeholders import Placeholders
from extender.controllers.expansion.provisioner import Provisioner
from extender.controllers.runner import Reconciler, Synced

log = logging.getLogger(__name__)

__all__ = ["Expander", "ExpansionPort", "Pending", "Queued", "Refilter", "RequestOf"]

REASON_WAITING = "NodeExpansionWaiting"
REASON_SKIPPED = "NodeExpansionSkipped"
REASON_CONSOLIDATION = "GPUBlindConsolidation"
TICK_SECONDS = 1.0
NODEPOOL_CHECK_SECONDS = 30.0
RECONSIDER_SECONDS = 5.0  # every pending pod is reconsidered at least this often ...
RECONSIDER_MIN_SECONDS = 1.0  # ... and at most this often, however often its inputs change
FAILURE_RETRY_SECONDS = 30.0  # a pod whose expansion failed is reconsidered after this long


class Expander(Intake):
    """The expander's two reconciles over what its intake (``Intake``) keeps: ``settling`` on every replica
    (the in-flight claims, which each replica's decisions count on) and ``deciding`` on the leader only (the
    NodeClaims and placeholders it creates; it settles first too, so it always decides on settled claims).
    Both run at least every ``TICK_SECONDS``, the deciding one sooner when a queued pod is due, and both are
    woken by the port's caches (``wake``); every pass of either adopts the claims this project made that it
    does not count yet: those made before a restart, and on a standby those its leader makes, so that a
    takeover never buys a second node for a pod whose node is already on its way."""

    def __init__(self, config: ExpansionConfig, port: ExpansionPort, *,
                 request_of: RequestOf = parse_annotations, metrics: ExpansionMetrics | None = None,
                 clock: Callable[[], float] = time.monotonic, new_id: Callable[[], str] = new_expansion_id,
                 refilter: Refilter | None = None, caches: Sequence[Synced] = ()) -> None:
        super().__init__(config, port, request_of=request_of, metrics=metrics, clock=clock, new_id=new_id,
                         refilter=refilter)
        self._let_go: set[str] = set()  # our claims that left the in-flight set: never adopted again
        self._gang_claims: dict[str, str] = {}  # NodeClaim bought for a gang -> the gang
        # the caches both wait for; the placeholders' cache joins the deciding one's (``use_placeholders``)
        self.settling = Reconciler("expander-claims", self.reconcile_claims, interval=TICK_SECONDS,
                                   caches=caches, wake=self.claims_wake, settle=0.0)
        self.deciding = Reconciler("expander", self.reconcile_decisions, interval=TICK_SECONDS,
                                   leader_only=True, caches=caches, wake=self.decisions_wake, settle=0.0)

    @property
    def controllers(self) -> tuple[Reconciler, Reconciler]:
        return self.settling, self.deciding

    def use_placeholders(self, placeholders: Placeholders, cache: Synced) -> None:
        """Give the expander its Cluster Autoscaler side; the deciding reconcile waits for ``cache``."""
        self.placeholders = placeholders
        self.deciding.caches = (*self.deciding.caches, cache)

    def _sleep_for(self) -> float:
        if not self._due:
            return TICK_SECONDS
        return min(TICK_SECONDS, max(0.0, self._due[0][0] - self._clock()))

    async def reconcile_claims(self, now: dt.datetime | None = None) -> float | None:
        """Every replica: settle the in-flight claims."""
        self._settle(self._clock())
        return None

    def _settle(self, at: float) -> None:
        """Settle the in-flight claims (their pods get the arrival grace, or are flaggable again), end the
        graces that ran out, and count Karpenter's own claims in flight. Idempotent at one time."""
        self.adopt_existing_claims()
        self._depart(self.inflight.settle(self.port.nodeclaim, self.port.node_arrived, at))
        for uid in [uid for uid, until in self._grace.items() if until <= at]:
            del self._grace[uid]
            entry = self._rejected_in_grace.pop(uid, None)
            if entry is None:
                self.flagged.forget(uid)  # the next rejection flags it again
            else:
                self._push(entry, at)  # rejected although its node had arrived: the node went elsewhere
        self.track_karpenter_claims()

    async def reconcile_decisions(self, now: dt.datetime | None = None) -> float | None:
        """The leader: settle the in-flight claims, warn of GPU-blind NodePools, reconsider the pending pods,
        decide the queued pods that are due (a NodeClaim, a placeholder, a wait) and settle the placeholders;
        run again when the next queued pod is due."""
        at = self._clock()
        self._settle(at)
        self._check_nodepools(at)
        self.reconsider(at)
        await self._release_gang_claims()
        while self._due and self._due[0][0] <= at:
            _, _, entry = heapq.heappop(self._due)
            try:
                gang = gang_of(self.port.cached_pod(entry.pod.namespace, entry.pod.name))
                if gang is None or self._to_autoscaler(entry.request.pool):
                    await self._process(entry)
                else:
                    await self._process_gang(gang, entry)
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception("expansion failed", extra={"pod": str(entry.pod)})
                self._failed(entry.pod.uid)
        if self.placeholders is not None:
            try:
                await self.placeholders.settle()
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception("settling placeholder pods failed")
        return self._sleep_for()

    def reconsider(self, now: float) -> None:
        """Level triggering: every pending pod that nothing is under way for is looked at again, from the
        caches (no API call), when its inputs changed (at most every ``RECONSIDER_MIN_SECONDS``) and at
        least every ``RECONSIDER_SECONDS``."""
        last = self._reconsidered_at
        if last is not None and now - last < (RECONSIDER_MIN_SECONDS if self._inputs_changed
                                              else RECONSIDER_SECONDS):
            return
        self._reconsidered_at, self._inputs_changed = now, False
        if not self.pending:
            return
        queued = {entry.pod.uid for _, _, entry in self._due} | set(self._slot_waiters)
        added_at = self.port.node_added_at()
        for uid, entry in list(self.pending.items()):
            pod = self.port.cached_pod(entry.pod.namespace, entry.pod.name)
            if pod is None or skip_reason(pod, uid) is not None:
                self._forget_pending(uid)
                continue
            if uid in queued or uid in self._grace or self._retry_at.get(uid, now) > now:
                continue
            if (added_at is not None and entry.seen_at < added_at
                    and now - added_at < self.arrival_grace):
                continue  # a node arrived since the pod was turned away: kube-scheduler tries it first
            try:
                self._reconsider_one(dict(pod), entry, now)
            except Exception:
                log.exception("reconsidering a pending pod failed", extra={"pod": str(entry.pod)})
                self._failed(uid)

    def _reconsider_one(self, pod: dict[str, Any], entry: Pending, now: float) -> None:
        uid = entry.pod.uid
        if uid in self.flagged and self._parked.get(uid) is None:
            return  # queued, waiting on a claim or a placeholder: under way
        try:
            request = self._request_of(pod)
        except Exception:  # a pod the contract rejects never needs a node; its next filter call says why
            self._forget_pending(uid)
            return
        if uid in self.flagged:
            parked = self._parked.get(uid)
            probe = decide(pod, uid, request, entry.candidates, self.port, self.inflight, "probe")
            if _decision_key(probe) != parked:
                self._push(Queued(entry.pod, request, entry.candidates), now)
            return
        if not expands_pool(self.port.gpupool(request.pool)):
            return
        if entry.candidates:
            if self._refilter is None:
                return
            outcome = self._refilter(pod, entry.candidates)
            if outcome.error or getattr(outcome, "fits", None):
                return  # room appeared: the scheduler's retry takes it (the nudger sees to it)
            self._consider(pod, entry.pod, is_capacity_only(outcome, entry.candidates), entry.candidates,
                           entry.since)
        elif unschedulable(pod, self.config.scheduler_name) and self._no_gpu_of_pool(pod, []):
            self._flag(pod, entry.pod, (), "no node passed the scheduler's own filters for this pod and pool "
                                           "{pool} has no GPU node for it ({what} wanted)", entry.since)

    def _failed(self, uid: str) -> None:
        """The pod's expansion failed: flaggable again, reconsidered after ``FAILURE_RETRY_SECONDS``."""
        self.flagged.forget(uid)
        self._parked.pop(uid, None)
        self._retry_at[uid] = self._clock() + FAILURE_RETRY_SECONDS

    def _park(self, uid: str, decision: Decision) -> bool:
        """Remember a decision that leaves the pod waiting for its inputs to change; True when it differs
        from the last one (so its event is new)."""
        key = _decision_key(decision)
        if self._parked.get(uid) == key:
            return False
        if uid in self.pending:
            self._parked[uid] = key
        return True

    def adopt_existing_claims(self) -> None:
        """Claims this project created that still wait for their node and that this replica does not count
        yet (made before a restart, or by the leader while this replica stood by) count as in flight, with
        the GPUs their node will have and the pod each was bought for."""
        now = self._clock()
        claims = self.port.nodeclaims()
        self._let_go &= {str((c.get("metadata") or {}).get("name") or "") for c in claims}
        nodes: Sequence[Mapping[str, Any]] | None = None
        for claim in claims:
            meta = claim.get("metadata") or {}
            labels = meta.get("labels") or {}
            name = str(meta.get("name") or "")
            if EXPANSION_LABEL not in labels or not name or name in self.inflight or name in self._let_go \
                    or meta.get("deletionTimestamp"):
                continue
            status = claim.get("status") or {}
            if self.port.node_arrived(str(status.get("nodeName") or ""), str(status.get("providerID") or "")):
                continue
            template = str((meta.get("annotations") or {}).get(EXPANSION_TEMPLATE_NODE) or "")
            if template:
                devices = list(self.port.node_gpus(template))
            else:  # bought from the NodePool's template: the GPUs its labels name
                nodes = self.port.all_nodes() if nodes is None else nodes
                devices = claim_devices(claim, nodes, self.port.node_gpus)
            self.inflight.add(name, claim, devices, now)
            self._hold_its_pod(name, claim)
            log.info("counting our NodeClaim as in flight", extra={"claim": name, "gpus": len(devices)})

    def _hold_its_pod(self, name: str, claim: Mapping[str, Any]) -> None:
        """The pod the claim was bought for (its annotation and uid label) waits on it, if still pending."""
        meta = claim.get("metadata") or {}
        namespace, _, pod_name = str((meta.get("annotations") or {}).get(EXPANSION_POD_ANNOTATION) or "") \
            .partition("/")
        uid = str((meta.get("labels") or {}).get(EXPANSION_POD_UID_LABEL) or "")
        pod = self.port.cached_pod(namespace, pod_name) if namespace and pod_name and uid else None
        if pod is None or skip_reason(pod, uid) is not None:
            return
        try:
            request = self._request_of(pod)
        except Exception:  # a pod the contract rejects waits on nothing
            return
        self.inflight.assign(name, pod, request)

    def track_karpenter_claims(self) -> None:
        """Karpenter's own claims whose node is not initialized yet count as in flight (one provisioner per
        pod), with the GPUs their node will have when known (``karpenter.claim_devices``)."""
        now = self._clock()
        nodes: Sequence[Mapping[str, Any]] | None = None
        for claim in self.port.nodeclaims():
            name = str((claim.get("metadata") or {}).get("name") or "")
            if not name or name in self.inflight or is_ours(claim) or not still_coming(claim):
                continue
            status = claim.get("status") or {}
            if self.port.node_arrived(str(status.get("nodeName") or ""), str(status.get("providerID") or "")):
                continue
            if nodes is None:
                nodes = self.port.all_nodes()
            devices = claim_devices(claim, nodes, self.port.node_gpus)
            self.inflight.add(name, claim, devices, now, external=True)
            log.info("counting Karpenter's NodeClaim as in flight",
                     extra={"claim": name, "gpus": len(devices)})

    def _check_nodepools(self, now: float) -> None:
        """A Warning event, once per NodePool and policy, on GPU NodePools consolidated GPU-blind."""
        last = self._nodepools_checked_at
        if last is not None and now - last < NODEPOOL_CHECK_SECONDS:
            return
        self._nodepools_checked_at = now
        with_gpu_nodes = {str(((n.get("metadata") or {}).get("labels") or {}).get(NODEPOOL_LABEL))
                          for n in self.port.all_nodes()
                          if self.port.node_gpus(str((n.get("metadata") or {}).get("name") or ""))}
        for nodepool in self.port.all_nodepools():
            meta = nodepool.get("metadata") or {}
            key = f"{meta.get('uid')}/{consolidation_policy(nodepool)}"
            name = str(meta.get("name") or "")
            if self._warned_nodepools.get(name) == key or not is_gpu_nodepool(nodepool, with_gpu_nodes):
                continue
            self._warned_nodepools[name] = key
            warning = consolidation_warning(nodepool)
            if warning is not None:
                self.port.record(nodepool, REASON_CONSOLIDATION, warning, "Warning")
                log.warning("GPU NodePool consolidates GPU-blind", extra={"nodepool": name})

    async def _nominated(self, ref: PodRef) -> list[str]:
        try:
            return nominated_claims(await self.port.pod_events(ref.namespace, ref.uid))
        except Exception as exc:  # without them only the claims' GPUs tell
            log.warning("cannot read the pod's events", extra={"pod": str(ref), "error": repr(exc)})
            return []

    async def _process(self, entry: Queued) -> None:
        ref, request = entry.pod, entry.request
        pod = await self.port.read_pod(ref.namespace, ref.name)
        provisioner = (self.placeholders.provisioner(self.port.gpupool(request.pool))
                       if self.placeholders is not None else Provisioner.KARPENTER)
        to_autoscaler = provisioner is Provisioner.CLUSTER_AUTOSCALER
        if pod is not None and self.placeholders is not None and to_autoscaler:
            await self.placeholders.provide(pod, request, entry.candidates)
            return
        self.track_karpenter_claims()
        nominated = await self._nominated(ref) if pod is not None else []
        decision = decide(pod, ref.uid, request, entry.candidates, self.port, self.inflight, self._new_id(),
                          nominated)
        if not isinstance(decision, (LeaveToKarpenter, NoTemplate)):
            self._parked.pop(ref.uid, None)
        if isinstance(decision, Skip) or pod is None:
            log.info("expansion skipped", extra={"pod": str(ref), "reason": getattr(decision, "reason", "")})
            self.flagged.forget(ref.uid)
            if pod is None or skip_reason(pod, ref.uid) is not None:
                self._forget_pending(ref.uid)
        elif isinstance(decision, WaitForClaim):
            self.inflight.assign(decision.claim, pod, request)
            whose = "Karpenter's NodeClaim" if decision.karpenter else "NodeClaim"
            self.port.record(pod, REASON_WAITING,
                             f"{whose} {decision.claim}, already on its way, has room for this pod: "
                             "no new node is created")
        elif isinstance(decision, WaitForSlot):
            self._slot_waiters[ref.uid] = entry
            if not entry.announced_wait:
                entry.announced_wait = True
                self.port.record(pod, REASON_WAITING,
                                 f"{decision.in_flight} NodeClaims are in flight (max "
                                 f"{self.config.max_in_flight}): the pod waits for one to finish")
        elif isinstance(decision, LeaveToKarpenter):
            if self._park(ref.uid, decision):
                self.port.record(pod, REASON_SKIPPED, decision.message)
        elif isinstance(decision, NoTemplate):
            if self.placeholders is not None and provisioner is Provisioner.AUTO:
                self._parked.pop(ref.uid, None)
                await self.placeholders.provide(pod, request, entry.candidates)
            elif self._park(ref.uid, decision):
                self.port.record(pod, REASON_FAILED, decision.message, "Warning")
        elif isinstance(decision, Create):
            await self._create(pod, entry, decision)

    async def _release_gang_claims(self) -> None:
        """The NodeClaims bought for a gang whose pods are all gone (the gang was deleted), or whose
        ``gang-timeout`` has passed, before their nodes came are deleted: nobody is left to use them."""
        by_gang: dict[str, list[str]] = {}
        for name, gang in list(self._gang_claims.items()):
            if name in self.inflight:
                by_gang.setdefault(gang, []).append(name)
            else:
                del self._gang_claims[name]
        for gang, names in by_gang.items():
            claims = [c for name in names if (c := self.inflight.get(name)) is not None]
            there = [pod for claim in claims for ref in claim.pods.values() if (pod := self._pod_there(ref))]
            if there and not gang_timed_out(there, dt.datetime.now(dt.UTC)):
                continue
            for name in names:
                try:
                    await self.port.delete_nodeclaim(name)
                except Exception as exc:
                    log.warning("cannot delete a gang's NodeClaim", extra={"claim": name, "error": repr(exc)})
                    continue
                del self._gang_claims[name]
                self._let_go.add(name)
                self.inflight.remove(name, LeaveReason.GONE)
                log.info("NodeClaim released: its gang is gone", extra={"claim": name, "gang": gang})

    def _pod_there(self, ref: PodRef) -> Mapping[str, Any] | None:
        pod = self.port.cached_pod(ref.namespace, ref.name)
        meta = (pod or {}).get("metadata") or {}
        if pod is None or str(meta.get("uid") or "") != ref.uid or meta.get("deletionTimestamp"):
            return None
        return pod

    def _to_autoscaler(self, pool: str) -> bool:
        """The Cluster Autoscaler grows the pool (placeholder pods, one per pod: it packs them itself)."""
        return self.placeholders is not None and \
            self.placeholders.provisioner(self.port.gpupool(pool)) is Provisioner.CLUSTER_AUTOSCALER

    async def _process_gang(self, gang: str, first: Queued) -> None:
        """A gang's queued members as one demand (``expansion.gang``): every claim they need in one batch,
        or none."""
        entries = [first, *(e for _, _, e in self._due
                            if gang_of(self.port.cached_pod(e.pod.namespace, e.pod.name)) == gang)]
        taken = {id(e) for e in entries}
        self._due = [item for item in self._due if id(item[2]) not in taken]
        heapq.heapify(self._due)
        members: list[tuple[Queued, dict[str, Any]]] = []
        for entry in entries:
            pod = await self.port.read_pod(entry.pod.namespace, entry.pod.name)
            if pod is None or skip_reason(pod, entry.pod.uid) is not None:
                self.flagged.forget(entry.pod.uid)
                self._forget_pending(entry.pod.uid)
                continue
            self._parked.pop(entry.pod.uid, None)
            members.append((entry, pod))
        if gang_timed_out([pod for _, pod in members], dt.datetime.now(dt.UTC)):
            log.info("gang scale-up skipped: its gang-timeout has passed", extra={"gang": gang})
            for entry, _ in members:
                self._failed(entry.pod.uid)
            return
        self.track_karpenter_claims()
        batch = plan_gang(gang, members, self.port, self.inflight, self._new_id, self._clock())
        if batch.blocked:
            for entry, pod in members:
                if batch.slot_wait:
                    self._slot_waiters[entry.pod.uid] = entry
                else:
                    self._failed(entry.pod.uid)
                if not entry.announced_wait:
                    entry.announced_wait = True
                    self.port.record(pod, REASON_WAITING if batch.slot_wait else REASON_FAILED, batch.blocked,
                                     "Normal" if batch.slot_wait else "Warning")
            return
        created: dict[str, str | None] = {}
        for entry, pod, decision, planned in batch.creates:
            created[planned] = name = await self._create(pod, entry, decision)
            if name:
                self._gang_claims[name] = gang
        for entry, pod, claim in batch.waits:
            name = created.get(claim, claim)
            if name is None:  # the claim planned for it could not be created: tried again later
                self._failed(entry.pod.uid)
                continue
            self.inflight.assign(name, pod, entry.request)
            self.port.record(pod, REASON_WAITING, f"NodeClaim {name}, bought for gang {gang}, has room for "
                                                  "this pod: no new node is created")
        if batch.creates:
            log.info("gang scale-up", extra={"gang": gang, "members": len(members),
                                             "claims": sorted(n for n in created.values() if n)})

    async def _create(self, pod: dict[str, Any], entry: Queued, decision: Create) -> str | None:
        try:
            created = await self.port.create_nodeclaim(decision.body)
        except Exception as exc:
            self._failed(entry.pod.uid)  # tried again after a while, or at the next rejection
            self.port.record(pod, REASON_FAILED,
                             f"creating a NodeClaim in NodePool {decision.nodepool} failed: {exc}", "Warning")
            return None
        name = str((created.get("metadata") or {}).get("name") or "")
        self.inflight.add(name, created, list(decision.devices), self._clock())
        self.inflight.assign(name, pod, entry.request)
        self.metrics.nodeclaims_created.labels(nodepool=decision.nodepool).inc()
        instance_type = _requirement_value(decision.body, INSTANCE_TYPE) or "instance type left to Karpenter"
        source = (f"a copy of node {decision.template_node}" if decision.template_node
                  else f"from the NodePool's template: pool {entry.request.pool} has no GPU node for it yet")
        self.port.record(pod, REASON_COMPLETED,
                         f"created NodeClaim {name} in NodePool {decision.nodepool} ({instance_type}, "
                         f"{source}) for this pod")
        return name

    def _depart(self, departures: Sequence[Departure]) -> None:
        for departure in departures:
            self._let_go.add(departure.claim)
            log.info("claim left the in-flight set",
                     extra={"claim": departure.claim, "reason": departure.reason.value})
            arrived = departure.reason in (LeaveReason.REGISTERED, LeaveReason.READY)
            for ref in departure.pods:
                if arrived:
                    # The scheduler needs a moment to try the new node; a rejection in between must not
                    # buy another one at once.
                    self._grace[ref.uid] = self._clock() + self.arrival_grace
                else:
                    self.flagged.forget(ref.uid)
                if departure.reason is LeaveReason.TIMEOUT:
                    self.port.record(ref.as_object(), REASON_FAILED,
                                     f"NodeClaim {departure.claim} got no node within "
                                     f"{self.config.claim_timeout_seconds:g}s; the pod is considered again",
                                     "Warning")
        if departures and self._slot_waiters:
            # After the delay, so the scheduler first tries the node that just arrived.
            due = self._clock() + self.config.delay_seconds
            for entry in self._slot_waiters.values():
                self._push(entry, due)
            self._slot_waiters.clear()


def _decision_key(decision: Decision) -> str:
    """What a parked decision is compared by: its kind and what it would say."""
    return f"{type(decision).__name__}:{getattr(decision, 'message', '')}"


def _requirement_value(body: Mapping[str, Any], key: str) -> str:
    for requirement in (body.get("spec") or {}).get("requirements") or []:
        if requirement.get("key") == key and requirement.get("values"):
            return str(requirement["values"][0])
    return ""
