"""Which nodes a defragmentation run empties, and where their GPU workers go. Pure.

A node of the pool is a *candidate* when at least one of its pool GPUs carries a worker and the share of
its pool GPUs that do is at or below the pool's threshold (empty nodes are compaction's). Candidates are
taken emptiest first. One is left alone, with a reason, when it is cordoned, labelled
``tensor-fusion.ai/do-not-disrupt: "true"``, runs a pod that uses GPUs outside this system (a native
``nvidia.com/gpu`` request), or runs a worker that would not come back or may not be disturbed: no
controller to recreate it, no PodDisruptionBudget covering it, or younger than ``maxDuration``.

For every other candidate the extender's own placement code (``ClusterState.rank`` and ``reserve``) places
its workers, largest first, as the scheduler would, but only on *targets*: pool nodes that are not
candidates, not empty, not cordoned, at least as full as the candidate, and that the worker's
nodeSelector, required node affinity and tolerations admit. Workers placed earlier in the
plan hold their room for the later ones. A candidate any of whose workers fits on no target is left
alone ("no-room"). The simulation runs on a what-if copy of the state (``ClusterState.what_if``): the live
state is never changed and nothing it would tell of a change (a scheduler nudge) happens.

``plan_defrag`` is the same planner for ``tf-extender plan --defrag``: over a snapshot's ``Inputs``, the
evictions a run would make now ("evict", with the node the simulation found) and the candidate nodes it
would leave as they are ("skip", with the reason), for every pool with defragmentation enabled.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterable, Mapping, Sequence
from contextlib import nullcontext
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from extender.common.contract import GPU_IDS, NATIVE_GPU_RESOURCES, POD_INDEX
from extender.common.gang import membership
from extender.common.labels import SCHEDULING_DO_NOT_DISRUPT
from extender.common.pods import TERMINAL_PHASES
from extender.common.timefmt import parse_time
from extender.controllers.defrag.config import DefragConfig, DefragConfigError, parse_config
from extender.kube.selectors import expression_selects, selects
from extender.planning.action import Action
from extender.planning.inputs import Inputs
from extender.scheduling.inventory import object_name
from extender.scheduling.ledger import Allocation
from extender.scheduling.state import ClusterState, PlacementError, Reservation, pod_key

SIMULATION_UID_PREFIX = "defrag-simulation/"


class SkipReason(StrEnum):
    CORDONED = "cordoned"
    DO_NOT_DISRUPT = "do-not-disrupt"
    NATIVE_GPU_POD = "native-gpu-pod"
    NO_CONTROLLER = "no-controller"
    MISSING_PDB = "missing-pdb"
    YOUNG_WORKER = "young-worker"
    NO_ROOM = "no-room"
    GANG_MEMBER = "gang-member"


@dataclass(frozen=True)
class NodeUse:
    """A node's GPUs of one pool: how many, how many carry a worker, their mean load (DESIGN §5)."""

    node: str
    gpus: int
    used_gpus: int
    load: float

    @property
    def occupancy(self) -> float:
        return 100.0 * self.used_gpus / self.gpus if self.gpus else 0.0

    @property
    def fullness(self) -> tuple[float, float]:
        return (self.occupancy, self.load)


@dataclass(frozen=True)
class Move:
    pod: str  # namespace/name
    uid: str
    source: str
    target: str
    reason: str
    tier: int | None = None  # a multi-GPU worker: the GPU topology tier it gets on the target


@dataclass(frozen=True)
class Skip:
    node: str
    reason: SkipReason
    message: str
    pod: str | None = None  # the pod the reason is about, when there is one


@dataclass(frozen=True)
class Snapshot:
    """What the planner reads besides the placement state: Node objects by name, the pods bound to each
    candidate node (workers and any other pod), and every PodDisruptionBudget."""

    nodes: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)
    pods_by_node: Mapping[str, Sequence[Mapping[str, Any]]] = field(default_factory=dict)
    pdbs: Sequence[Mapping[str, Any]] = ()


@dataclass(frozen=True)
class Plan:
    pool: str
    candidates: tuple[str, ...]  # emptiest first
    moves: tuple[Move, ...]  # in the order to evict them
    skips: tuple[Skip, ...]
    fenced: frozenset[str]  # pool nodes no worker may move onto: candidates and empty nodes
    eligible: tuple[str, ...] = ()  # candidates that pass the node checks, in order (before the simulation)

    @property
    def sources(self) -> list[str]:
        """The nodes the plan empties, in order."""
        return list(dict.fromkeys(m.source for m in self.moves))


# --- reading the cluster ---------------------------------------------------------------------------


def pool_nodes(state: ClusterState, pool: str) -> dict[str, NodeUse]:
    """Every node with GPUs of ``pool``, with the use of those GPUs."""
    return {node: NodeUse(node, gpus, used, load)
            for node, (gpus, used, load) in sorted(state.pool_occupancy(pool).items())}


def candidate_nodes(uses: Mapping[str, NodeUse], threshold_percent: int) -> list[str]:
    """Nodes in use at or below the threshold, emptiest first (then lowest load, then name)."""
    chosen = [u for u in uses.values() if u.used_gpus > 0 and u.occupancy <= threshold_percent]
    return [u.node for u in sorted(chosen, key=lambda u: (u.occupancy, u.load, u.node))]


def fenced_nodes(uses: Mapping[str, NodeUse], threshold_percent: int) -> frozenset[str]:
    return frozenset(n for n, u in uses.items() if u.used_gpus == 0 or u.occupancy <= threshold_percent)


def workers_by_node(state: ClusterState) -> dict[str, list[Allocation]]:
    out: dict[str, list[Allocation]] = {}
    for allocation in state.allocations():
        out.setdefault(allocation.node, []).append(allocation)
    return out


def cordoned(node: Mapping[str, Any] | None) -> bool:
    return bool(((node or {}).get("spec") or {}).get("unschedulable"))


def do_not_disrupt(node: Mapping[str, Any] | None) -> bool:
    labels = ((node or {}).get("metadata") or {}).get("labels") or {}
    return str(labels.get(SCHEDULING_DO_NOT_DISRUPT, "")).lower() == "true"


def native_gpu_resource(pod: Mapping[str, Any]) -> str | None:
    """The native GPU resource (``nvidia.com/gpu`` ...) a container of the pod asks for, if any."""
    spec = pod.get("spec") or {}
    for container in [*(spec.get("initContainers") or []), *(spec.get("containers") or [])]:
        resources = container.get("resources") or {}
        for section in ("limits", "requests"):
            for name in NATIVE_GPU_RESOURCES:
                value = (resources.get(section) or {}).get(name)
                if value not in (None, "", "0", 0):
                    return name
    return None


def has_controller(pod: Mapping[str, Any]) -> bool:
    refs = (pod.get("metadata") or {}).get("ownerReferences") or []
    return any(isinstance(r, Mapping) and r.get("controller") is True for r in refs)


def _tolerated(taint: Mapping[str, Any], tolerations: Sequence[Mapping[str, Any]]) -> bool:
    for toleration in tolerations:
        if toleration.get("effect") and toleration.get("effect") != taint.get("effect"):
            continue
        if toleration.get("operator") == "Exists":
            if not toleration.get("key") or toleration.get("key") == taint.get("key"):
                return True
        elif toleration.get("key") == taint.get("key") and \
                str(toleration.get("value") or "") == str(taint.get("value") or ""):
            return True
    return False


def node_admits(pod: Mapping[str, Any], node: Mapping[str, Any] | None) -> bool:
    """Whether kube-scheduler could put the pod's replacement on the node as far as node labels and taints
    go: nodeSelector, required node affinity, NoSchedule/NoExecute taints. (GPU fit is the extender's.)"""
    if node is None:
        return True  # nothing known about the node: the GPU fit alone decides
    spec = pod.get("spec") or {}
    meta = node.get("metadata") or {}
    labels = {str(k): str(v) for k, v in (meta.get("labels") or {}).items()}
    for key, value in (spec.get("nodeSelector") or {}).items():
        if labels.get(str(key)) != str(value):
            return False
    required = (((spec.get("affinity") or {}).get("nodeAffinity") or {})
                .get("requiredDuringSchedulingIgnoredDuringExecution") or {})
    terms = required.get("nodeSelectorTerms") or []
    if terms and not any(
        all(expression_selects(e, labels.get(str(e.get("key")))) for e in term.get("matchExpressions") or [])
        and all(expression_selects(e, str(meta.get("name")) if e.get("key") == "metadata.name" else None)
                for e in term.get("matchFields") or [])
        and (term.get("matchExpressions") or term.get("matchFields"))
        for term in terms
    ):
        return False
    tolerations = spec.get("tolerations") or []
    return all(_tolerated(t, tolerations) for t in (node.get("spec") or {}).get("taints") or []
               if t.get("effect") in ("NoSchedule", "NoExecute"))


def _constraints(pod: Mapping[str, Any]) -> tuple[object, ...]:
    spec = pod.get("spec") or {}
    required = ((spec.get("affinity") or {}).get("nodeAffinity") or {}).get(
        "requiredDuringSchedulingIgnoredDuringExecution")
    return (spec.get("nodeSelector") or None, required or None, spec.get("tolerations") or None)


def _tainted(node: Mapping[str, Any] | None) -> bool:
    return any(t.get("effect") in ("NoSchedule", "NoExecute")
               for t in ((node or {}).get("spec") or {}).get("taints") or [])


def admitted(pod: Mapping[str, Any], targets: Sequence[str], nodes: Mapping[str, Mapping[str, Any]],
             tainted: frozenset[str]) -> list[str]:
    """The targets ``node_admits`` lets the pod onto. ``tainted``: the nodes with NoSchedule or NoExecute
    taints; a pod without node constraints needs checking on those only (the common case)."""
    if _constraints(pod) == (None, None, None):
        if not tainted:
            return list(targets)
        return [t for t in targets if t not in tainted or node_admits(pod, nodes.get(t))]
    return [t for t in targets if node_admits(pod, nodes.get(t))]


def covering_pdbs(pod: Mapping[str, Any], pdbs: Iterable[Mapping[str, Any]]) -> list[str]:
    meta = pod.get("metadata") or {}
    namespace, labels = meta.get("namespace") or "default", meta.get("labels") or {}
    return [
        str((pdb.get("metadata") or {}).get("name"))
        for pdb in pdbs
        if ((pdb.get("metadata") or {}).get("namespace") or "default") == namespace
        and selects((pdb.get("spec") or {}).get("selector"), labels)
    ]


def created_at(obj: Mapping[str, Any]) -> dt.datetime | None:
    return parse_time((obj.get("metadata") or {}).get("creationTimestamp"))


def _live(pod: Mapping[str, Any]) -> bool:
    return str((pod.get("status") or {}).get("phase") or "") not in TERMINAL_PHASES


def _format_duration(value: dt.timedelta) -> str:
    seconds = int(value.total_seconds())
    hours, rest = divmod(seconds, 3600)
    minutes, seconds = divmod(rest, 60)
    parts = [f"{value}{unit}" for value, unit in ((hours, "h"), (minutes, "m"), (seconds, "s")) if value]
    return "".join(parts) or "0s"


def node_skip(node: str, snapshot: Snapshot, workers: Sequence[Allocation], now: dt.datetime,
              max_duration: dt.timedelta) -> Skip | None:
    """Why the node must be left as it is, or None."""
    node_obj = snapshot.nodes.get(node)
    if cordoned(node_obj):
        return Skip(node, SkipReason.CORDONED, f"node {node} is cordoned")
    if do_not_disrupt(node_obj):
        return Skip(node, SkipReason.DO_NOT_DISRUPT,
                    f"node {node} is labelled {SCHEDULING_DO_NOT_DISRUPT}=true")
    pods = [p for p in snapshot.pods_by_node.get(node, ()) if _live(p)]
    worker_keys = {a.pod_key for a in workers}
    by_key = {pod_key(p): p for p in pods}
    for pod in sorted(pods, key=pod_key):
        if pod_key(pod) in worker_keys:
            continue
        resource = native_gpu_resource(pod)
        if resource is not None:
            key = pod_key(pod)
            return Skip(node, SkipReason.NATIVE_GPU_POD,
                        f"pod {key} on node {node} uses {resource} outside tensor-fusion", key)
    for worker in sorted(workers, key=lambda a: a.pod_key):
        found = by_key.get(worker.pod_key)
        if found is None:  # a bind in flight: the pod has only just been placed here
            return Skip(node, SkipReason.YOUNG_WORKER, f"pod {worker.pod_key} is being placed on node {node}",
                        worker.pod_key)
        if (gang := membership(found)) is not None:
            # moving one member alone restarts it apart from its peers, which a gang cannot run without
            return Skip(node, SkipReason.GANG_MEMBER,
                        f"pod {worker.pod_key} is a member of gang {gang.group_key}, which moves whole or "
                        "not at all", worker.pod_key)
        if not has_controller(found):
            return Skip(node, SkipReason.NO_CONTROLLER,
                        f"pod {worker.pod_key} has no controller to recreate it after eviction",
                        worker.pod_key)
        if not covering_pdbs(found, snapshot.pdbs):
            return Skip(node, SkipReason.MISSING_PDB,
                        f"no PodDisruptionBudget covers pod {worker.pod_key} on node {node}", worker.pod_key)
        created = created_at(found)
        if created is None or now - created < max_duration:
            return Skip(node, SkipReason.YOUNG_WORKER,
                        f"pod {worker.pod_key} is younger than maxDuration {_format_duration(max_duration)}",
                        worker.pod_key)
    return None


# --- simulation ------------------------------------------------------------------------------------


def simulation_pod(pod: Mapping[str, Any]) -> dict[str, Any]:
    """The worker as its replacement reaches the scheduler: same requests, not yet placed."""
    meta = pod.get("metadata") or {}
    annotations = {k: v for k, v in (meta.get("annotations") or {}).items() if k not in (GPU_IDS, POD_INDEX)}
    return {
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": meta.get("name"), "namespace": meta.get("namespace") or "default",
                     "uid": SIMULATION_UID_PREFIX + str(meta.get("uid") or pod_key(pod)),
                     "labels": dict(meta.get("labels") or {}), "annotations": annotations},
        "spec": {"priority": (pod.get("spec") or {}).get("priority") or 0},
    }


def _size(worker: Allocation) -> tuple[int, int, str]:
    request = worker.request
    return (-request.gpu_count * request.vram_request, -request.gpu_count, worker.pod_key)


def _place_node(state: ClusterState, source: NodeUse, workers: Sequence[Allocation],
                pods: Mapping[str, Mapping[str, Any]], nodes: Mapping[str, Mapping[str, Any]],
                targets: Sequence[str], tainted: frozenset[str],
                reason: str) -> tuple[list[Move], str | None]:
    """Place the node's workers on ``targets`` (in a what-if copy: the room they take stays taken for the
    next candidates); on the first that fits nowhere, undo and say why."""
    moves: list[Move] = []
    held: list[Reservation] = []
    for worker in sorted(workers, key=_size):
        pod = pods[worker.pod_key]
        sim = simulation_pod(pod)
        ranked = state.rank(sim, admitted(pod, targets, nodes, tainted))
        placed = False
        multi = len(worker.gpu_ids) > 1
        # a move never worsens a multi-GPU worker's GPU topology tier (docs/topology.md)
        now_tier = state.gpu_tier(source.node, worker.gpu_ids, worker.request) if multi else None
        worse = 0
        for target in ranked:
            try:
                reservation = state.reserve(sim, target)
            except PlacementError:
                continue
            tier = state.gpu_tier(target, reservation.gpu_ids, reservation.request) if multi else None
            if tier is not None and now_tier is not None and tier > now_tier:
                state.release(reservation)
                worse += 1
                continue
            held.append(reservation)
            moves.append(Move(worker.pod_key, worker.uid, source.node, target, reason,
                              None if tier is None else int(tier)))
            placed = True
            break
        if not placed:
            for reservation in held:
                state.release(reservation)
            if worse:
                return [], (f"pod {worker.pod_key} would get a worse GPU topology tier than its "
                            f"{now_tier.text if now_tier is not None else ''} on every node with room")
            return [], f"pod {worker.pod_key} fits on no node of the pool that is at least as full"
    return moves, None


def plan_pool(state: ClusterState, pool: str, config: DefragConfig, snapshot: Snapshot,
              now: dt.datetime, only: Iterable[str] | None = None, simulate: bool = True) -> Plan:
    """The run's plan for ``pool`` now. ``only`` limits it to these source nodes (the live loop plans one
    node at a time, each from the cluster as the previous moves left it); ``simulate=False`` stops after
    the node checks (the run's overview: candidates, skips, the nodes to try)."""
    uses = pool_nodes(state, pool)
    threshold = config.threshold_percent
    candidates = candidate_nodes(uses, threshold)
    fenced = fenced_nodes(uses, threshold)
    wanted = set(only) if only is not None else None
    on_node = workers_by_node(state)
    tainted = frozenset(n for n in uses if _tainted(snapshot.nodes.get(n)))
    open_nodes = sorted((n, u.fullness) for n, u in uses.items()
                        if n not in fenced and not cordoned(snapshot.nodes.get(n)))
    moves: list[Move] = []
    skips: list[Skip] = []
    eligible: list[str] = []
    # only a simulation needs the copy; without one, nothing below changes the state
    with state.what_if() if simulate and candidates else nullcontext(state) as sim:
        for node in candidates:
            if wanted is not None and node not in wanted:
                continue
            use = uses[node]
            # workers are matched to pod objects by namespace/name: a snapshot's pods may have no uid
            pods = {pod_key(p): p for p in snapshot.pods_by_node.get(node, ())}
            # a worker already on its way out (evicted earlier, terminating) needs no move
            workers = [w for w in on_node.get(node, ())
                       if not ((pods.get(w.pod_key) or {}).get("metadata") or {}).get("deletionTimestamp")]
            if not workers:
                continue
            skip = node_skip(node, snapshot, workers, now, config.max_duration)
            if skip is not None:
                skips.append(skip)
                continue
            eligible.append(node)
            if not simulate:
                continue
            targets = [n for n, fullness in open_nodes if fullness >= use.fullness]
            reason = (f"node {node} has {use.used_gpus}/{use.gpus} GPUs in use "
                      f"({use.occupancy:.0f}% <= {threshold}%)")
            node_moves, problem = _place_node(sim, use, workers, pods, snapshot.nodes, targets, tainted,
                                              reason)
            if problem is not None:
                skips.append(Skip(node, SkipReason.NO_ROOM, problem))
                continue
            moves.extend(node_moves)
    return Plan(pool, tuple(candidates), tuple(moves), tuple(skips), fenced, tuple(eligible))


# -- the offline plan (tf-extender plan --defrag) -------------------------------------------------


def snapshot_of(inputs: Inputs) -> Snapshot:
    pods_by_node: dict[str, list[Mapping[str, Any]]] = {}
    for pod in inputs.pods:
        node = (pod.get("spec") or {}).get("nodeName")
        if node:
            pods_by_node.setdefault(str(node), []).append(pod)
    return Snapshot(inputs.nodes, pods_by_node, inputs.pdbs)


def defrag_actions(plan: Plan) -> list[Action]:
    out = [Action("evict", plan.pool, m.reason,
                  details={"pod": m.pod, "from": m.source, "to": m.target,
                           **({"tier": m.tier} if m.tier is not None else {})},
                  payload=m) for m in plan.moves]
    out += [Action("skip", plan.pool, s.message, node=s.node, payload=s) for s in plan.skips]
    return out


def plan_defrag(inputs: Inputs) -> Iterable[Action]:
    snapshot = snapshot_of(inputs)
    for pool in sorted(inputs.pools, key=object_name):
        name = object_name(pool)
        try:
            config = parse_config(pool)
        except DefragConfigError as exc:
            yield Action("skip", name, str(exc))
            continue
        if config.enabled:
            yield from defrag_actions(plan_pool(inputs.state, name, config, snapshot, inputs.now))
