"""Offline placement: replay pods against a cluster snapshot with the extender's own code (DESIGN §5).

``simulate`` is pure; ``main_simulate`` reads the two YAML files and prints the results. Each pod goes
to the node the extender ranks first (ties by name) and is then recorded as bound, so later pods see it.
GPUResourceQuotas in the cluster file hold the pods their namespaces' totals or caps refuse
(``heldByQuota``), against the usage of the pods bound so far. Members of a gang
(``tensor-fusion.ai/gang-group-key`` as the webhook stamps it) wait until the quorum has come, then are
placed all together, or none of them is.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import sys
from collections import Counter
from collections.abc import Iterable
from fractions import Fraction
from typing import Any

from extender.common.cli import EXIT_USAGE, describe, fail
from extender.common.contract import GPU_IDS, ContractError, RequestContext, parse_request, render_annotations
from extender.common.gang import membership
from extender.common.logs import describe_exception
from extender.common.numbers import shown
from extender.common.output import add_output_argument, json_lines, table, yaml_document
from extender.common.progress import Progress
from extender.common.shape import object_problem
from extender.common.yamlio import YAMLFileError, iter_documents, read_text_file
from extender.gang.placement import place_gang
from extender.quota import needs_gpus
from extender.quota.book import QuotaBook
from extender.quota.model import KIND as QUOTA_KIND
from extender.scheduling.placement import Mode
from extender.scheduling.state import ClusterState, Kind, PlacementError, pod_key

_KINDS = {kind.value: kind for kind in Kind}


def _uid(pod: dict[str, Any]) -> str:
    meta = pod.setdefault("metadata", {})
    if not meta.get("uid"):
        meta["uid"] = f"simulated/{pod_key(pod)}"
    return str(meta["uid"])


def _writable(pod: dict[str, Any], *parts: str) -> dict[str, Any]:
    """A copy of ``pod`` whose top-level ``parts`` (and metadata's annotations) are copies too: what the
    simulator writes to, so the caller's objects stay as they were without a deep copy of each (the deep
    copies were a third of a 2,000-pod run)."""
    out = dict(pod)
    for part in parts:
        out[part] = dict(out.get(part) or {})
    if "metadata" in parts:
        out["metadata"]["annotations"] = dict(out["metadata"].get("annotations") or {})
    return out


# The sections of the kinds the tools read that must be objects when present (a list or a number there is a
# wrong-typed field: the object is named and left out, and the rest of the snapshot planned without it).
_SECTIONS: dict[str, tuple[tuple[str, ...], ...]] = {
    "GPUPool": (("spec", "capacityConfig"), ("spec", "nodeManagerConfig"), ("spec", "qosConfig"),
                ("spec", "nodeManagerConfig", "nodeProvisioner"),
                ("spec", "nodeManagerConfig", "nodeCompaction")),
    "SchedulingConfigTemplate": (("spec", "placement"),),
    "GPUNodeClaim": (("spec", "resources"),),
    "TensorFusionCluster": (("spec", "computingVendor"), ("spec", "computingVendor", "params")),
    "GPUNode": (),
    "GPU": (("status", "capacity"), ("status", "nodeSelector")),
}


def describe_object(obj: Any) -> str:
    """``Kind name`` (``Kind namespace/name``) of a snapshot object, whatever its fields hold."""
    if not isinstance(obj, dict):
        return "object"
    meta = obj.get("metadata")
    meta = meta if isinstance(meta, dict) else {}
    kind, name, namespace = obj.get("kind"), meta.get("name"), meta.get("namespace")
    kind = kind if isinstance(kind, str) and kind else "object"
    name = name if isinstance(name, str) else "?"
    return f"{kind} {namespace}/{name}" if isinstance(namespace, str) and namespace else f"{kind} {name}"


def screen(objects: Iterable[Any]) -> tuple[list[dict[str, Any]], list[str]]:
    """The snapshot objects the tools can read, and one line per object left out, naming it, the field and
    the value (``GPUPool a: spec.nodeManagerConfig=[1]: expected an object``)."""
    good: list[dict[str, Any]] = []
    bad: list[str] = []
    for obj in objects:
        where = describe_object(obj)
        problem = object_problem(obj, "")
        if problem is None:
            problem = _section_problem(obj)
        if problem is None:
            good.append(obj)
        else:
            bad.append(f"{where}: {problem.lstrip('.')}")
    return good, bad


def _section_problem(obj: dict[str, Any]) -> str | None:
    for path in _SECTIONS.get(str(obj.get("kind")), ()):
        node: Any = obj
        for depth, key in enumerate(path):
            node = node.get(key) if isinstance(node, dict) else None
            if node is None:
                break
            if not isinstance(node, dict):
                return f"{'.'.join(path[:depth + 1])}={shown(node)}: expected an object"
    return None


def report_skipped(prog: str, skipped: Iterable[str]) -> None:
    """One stderr line per object a tool left out (the results are those of the snapshot without it)."""
    for line in skipped:
        print(f"{prog}: skipped {line}", file=sys.stderr)


def load_cluster(state: ClusterState, objects: Iterable[dict[str, Any]],
                 problems: list[str] | None = None) -> None:
    """Feed every object of a known kind to the state; pools and templates first, pods last. The state
    reads objects and keeps none of them, so only a pod without a uid is copied (to give it one).
    One object at a time: one the state cannot take is left out and named in ``problems``."""
    by_kind: dict[Kind, list[dict[str, Any]]] = {kind: [] for kind in Kind}
    for obj in objects:
        kind = _KINDS.get(str(obj.get("kind")))
        if kind is not None:
            by_kind[kind].append(obj)
    for kind in (Kind.TEMPLATE, Kind.POOL, Kind.NODE, Kind.GPU, Kind.POD):
        for item in by_kind[kind]:
            if kind is Kind.POD and not (item.get("metadata") or {}).get("uid"):
                item = _writable(item, "metadata")
                _uid(item)
            try:
                state.apply(kind, "ADDED", item)
            except Exception as exc:  # the object's own fault: named, and the rest loaded without it
                with contextlib.suppress(Exception):
                    state.apply(kind, "DELETED", item)
                if problems is not None:
                    problems.append(f"{describe_object(item)}: cannot be read: "
                                    f"{describe_exception(exc, 200)}")


def canonical_pod(state: ClusterState, pod: dict[str, Any]) -> dict[str, Any]:
    """A copy of the pod with canonical annotations, as the webhook would have written them (its metadata,
    spec and status copied: ``place`` writes to them)."""
    pod = _writable(pod, "metadata", "spec", "status")
    _uid(pod)
    annotations = pod["metadata"]["annotations"]
    key = tuple(sorted(annotations.items()))
    try:
        canonical = _canonical(key, state.default_pool)
    except TypeError:  # a value YAML made a list or a map: unhashable, and parse_request says what is wrong
        canonical = _canonical.__wrapped__(key, state.default_pool)
    annotations.update(canonical)
    return pod


@functools.lru_cache(maxsize=4096)
def _canonical(annotations: tuple[tuple[str, str], ...], default_pool: str | None) -> dict[str, str]:
    """The webhook's canonical annotations of a request; pods of one shape share them (a trace of 2,000 pods
    has a handful of shapes). Callers copy the result into the pod, never change it."""
    return render_annotations(parse_request(dict(annotations), RequestContext(default_pool=default_pool)))


def _reason(state: ClusterState, pod: dict[str, Any], nodes: list[str]) -> str:
    outcome = state.filter(pod, nodes)
    if outcome.error:
        return outcome.error
    messages = Counter({**outcome.unresolvable, **outcome.failed}.values())
    if not messages:
        return "no nodes with GPUs in the cluster"
    parts = [f"{count} node{'s' if count > 1 else ''}: {msg}" for msg, count in sorted(
        messages.items(), key=lambda item: (-item[1], item[0]))]
    return f"0/{len(nodes)} nodes fit: " + "; ".join(parts)


def _held(key: str, message: str) -> dict[str, Any]:
    return {"pod": key, "node": None, "gpus": [], "reason": message, "heldByQuota": True}


def place(state: ClusterState, pod: dict[str, Any], quotas: QuotaBook | None = None) -> dict[str, Any]:
    """Place one pod as kube-scheduler plus the extender would, and record it as bound; with ``quotas``,
    a pod its namespace's GPU quota refuses (at the filter, or on the GPUs chosen) stays unplaced."""
    key = pod_key(pod)
    try:
        pod = canonical_pod(state, pod)
    except ContractError as exc:
        return {"pod": key, "node": None, "gpus": [], "reason": str(exc)}
    if quotas is not None and (refusal := quotas.blocks(pod)) is not None:
        return _held(key, refusal.message)
    nodes = state.nodes()
    ranked = state.rank(pod, nodes)
    if not ranked:
        return {"pod": key, "node": None, "gpus": [], "reason": _reason(state, pod, nodes)}
    return _bind(state, pod, ranked[0], quotas)


def _bind(state: ClusterState, pod: dict[str, Any], node: str,
          quotas: QuotaBook | None = None) -> dict[str, Any]:
    """Reserve the pod's GPUs on ``node`` (a gang member's: its gang's hold) and record it as bound."""
    key = pod_key(pod)
    try:
        reservation = state.reserve(pod, node)
    except PlacementError as exc:
        return {"pod": key, "node": None, "gpus": [], "reason": str(exc)}
    if quotas is not None and needs_gpus(reservation.request):
        capacities = [state.gpu_capacity(g) or (Fraction(0), 0) for g in reservation.gpu_ids]
        if (refusal := quotas.refusal(pod, reservation.request, capacities)) is not None:
            state.release(reservation)
            return _held(key, refusal.message)
    pod["metadata"]["annotations"][GPU_IDS] = ",".join(reservation.gpu_ids)
    pod.setdefault("spec", {})["nodeName"] = node
    pod.setdefault("status", {})["phase"] = "Running"
    state.apply(Kind.POD, "ADDED", pod)
    result: dict[str, Any] = {"pod": key, "node": node, "gpus": list(reservation.gpu_ids)}
    if reservation.tier is not None:  # a multi-GPU pod: the GPU topology tier of its GPUs (docs/topology.md)
        result["tier"] = reservation.tier
    return result


def simulate(cluster_objects: list[dict[str, Any]], pods: list[dict[str, Any]],
             mode: str | None) -> list[dict[str, Any]]:
    return simulate_with_state(cluster_objects, pods, mode)[0]


def simulate_with_state(cluster_objects: list[dict[str, Any]], pods: list[dict[str, Any]],
                        mode: str | None, progress: Progress | None = None,
                        problems: list[str] | None = None) -> tuple[list[dict[str, Any]], ClusterState]:
    """The placements in order, and the state after them. An object or pod that cannot be read is left out,
    named in ``problems``; the others are placed as if it were absent."""
    state = ClusterState(mode_override=mode)
    if progress is not None:
        progress.begin("loading the cluster")
    load_cluster(state, cluster_objects, problems)
    quota_objects = [o for o in cluster_objects if o.get("kind") == QUOTA_KIND]
    quotas = QuotaBook(state, lambda: quota_objects) if quota_objects else None
    if progress is not None:
        progress.begin("placing pods", len(pods))
    results: dict[int, dict[str, Any]] = {}
    waiting: dict[str, list[tuple[int, dict[str, Any]]]] = {}
    placed_gangs: set[str] = set()
    for position, pod in enumerate(pods):
        try:
            member = membership(pod)
            if member is None or member.native or member.group_key in placed_gangs:
                results[position] = place(state, pod, quotas)  # outside gangs, or past a placed quorum: alone
            else:
                members = waiting.setdefault(member.group_key, [])
                members.append((position, pod))
                if len(members) >= member.required:
                    del waiting[member.group_key]
                    results.update(place_gang_members(state, member.group_key, members, quotas))
                    if all(results[i]["node"] for i, _ in members):
                        placed_gangs.add(member.group_key)
        except Exception as exc:  # the pod's own fault: its line says so, the next pods go on
            results[position] = {"pod": describe_object(pod).split(" ", 1)[-1], "node": None, "gpus": [],
                                 "reason": f"cannot be read: {describe_exception(exc, 200)}"}
        if progress is not None:
            progress.done += 1
    for key, members in waiting.items():
        required = membership(members[0][1]).required  # type: ignore[union-attr]
        for position, pod in members:
            results[position] = {"pod": pod_key(pod), "node": None, "gpus": [], "reason": (
                f"gang {key}: waiting for {required - len(members)} of {required} members")}
    return [results[i] for i in range(len(pods))], state


def place_gang_members(state: ClusterState, key: str, members: list[tuple[int, dict[str, Any]]],
                       quotas: QuotaBook | None = None) -> dict[int, dict[str, Any]]:
    """A gang's quorum placed all together (``extender.gang.placement``), or none of it; with ``quotas``,
    none of it when its namespace's quota cannot take the whole quorum."""
    try:
        pods = [(i, canonical_pod(state, pod)) for i, pod in members]
    except ContractError as exc:
        return {i: {"pod": pod_key(pod), "node": None, "gpus": [], "reason": str(exc)} for i, pod in members}
    if quotas is not None and (refusal := quotas.refusal_together(
            [(pod, state.request_of(pod)) for _, pod in pods])) is not None:
        return {i: _held(pod_key(pod), f"gang {key}: {refusal.message}") for i, pod in pods}
    nodes = state.nodes()
    plan = place_gang(state, [pod for _, pod in pods], {_uid(pod): nodes for _, pod in pods})
    if not plan.fits:
        return {i: {"pod": pod_key(pod), "node": None, "gpus": [], "reason": f"gang {key}: {plan.reason}"}
                for i, pod in pods}
    state.hold_gang(key, [(p.pod, p.node, p.gpu_ids) for p in plan.placed])
    node_of = {_uid(dict(p.pod)): p.node for p in plan.placed}
    return {i: _bind(state, pod, node_of[_uid(pod)]) for i, pod in pods}


def utilisation_summary(state: ClusterState) -> str:
    usage = state.utilisation()
    lines = []
    for node, figures in usage.nodes.items():
        lines.append(f"{node}: {figures.used_gpus}/{figures.gpus} GPUs used, "
                     f"TFLOPS {figures.tflops_percent:.1f}%, VRAM {figures.vram_percent:.1f}%")
    for pool, figures in usage.pools.items():
        lines.append(f"pool {pool}: {figures.used_gpus}/{figures.gpus} GPUs used, "
                     f"TFLOPS {figures.tflops_percent:.1f}%, VRAM {figures.vram_percent:.1f}%")
    lines.append(f"partially used GPUs: {usage.partially_used_gpus}")
    return "\n".join(lines)


def read_objects(text: str, source: str = "<input>") -> list[dict[str, Any]]:
    """Objects of a YAML stream; ``kind: List`` (and ``...List``) documents are unpacked. Bad YAML raises
    ``YAMLFileError`` naming ``source`` and the line."""
    out: list[dict[str, Any]] = []
    for document in iter_documents(text, source):
        if not isinstance(document, dict):
            continue
        if str(document.get("kind", "")).endswith("List") and isinstance(document.get("items"), list):
            item_kind = str(document["kind"])[: -len("List")]
            for item in document["items"]:
                if isinstance(item, dict):
                    out.append({"kind": item_kind, **item} if item_kind and "kind" not in item else item)
        else:
            out.append(document)
    return out


def read_file(path: str, progress: Progress | None = None) -> list[dict[str, Any]]:
    """``read_objects`` of a file (``OSError`` when unreadable)."""
    if progress is not None:
        progress.begin(f"reading {path}")
    return read_objects(read_text_file(path), path)


def add_simulate_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--cluster", required=True, metavar="CLUSTER.yaml",
                        help="Nodes, GPU objects, GPUPools, SchedulingConfigTemplates, GPUResourceQuotas and "
                             "bound pods")
    parser.add_argument("--pods", required=True, metavar="PODS.yaml", help="pods to place, in order")
    parser.add_argument("--mode", choices=[m.value for m in Mode], default=None,
                        help="placement mode for every pool (default: each pool's own)")
    add_output_argument(parser, "json", "one JSON object per pod and line, in order")
    parser.add_argument("--fail-on-unplaced", action=argparse.BooleanOptionalAction, default=False,
                        help=f"exit {EXIT_UNPLACED} when any pod found no node (for CI gates; default: "
                             "exit 0 whatever the placements)")


EXIT_UNPLACED = 3  # not 1 (a failure) nor 2 (usage): the run worked and some pods did not fit


def main_simulate(args: argparse.Namespace) -> int:
    prog = getattr(args, "prog", "tf-extender simulate")
    with Progress(prog) as progress:
        try:
            cluster, skipped = screen(read_file(args.cluster, progress))
            pods, skipped_pods = screen(obj for obj in read_file(args.pods, progress)
                                        if obj.get("kind", "Pod") == "Pod")
        except (OSError, YAMLFileError) as exc:
            return fail(prog, describe(exc), EXIT_USAGE)
        skipped += skipped_pods
        results, state = simulate_with_state(cluster, pods, args.mode, progress, skipped)
        report_skipped(prog, skipped)
        progress.begin("writing the results")
        output = getattr(args, "output", "json")
        if output == "table":
            tier = ("tier",) if any("tier" in r for r in results) else ()
            columns = ("pod", "node", "gpus", *tier, "reason")
            sys.stdout.write(table(results, columns))
        elif output == "yaml":
            sys.stdout.write(yaml_document(results))
        else:
            sys.stdout.write(json_lines(results))
        sys.stdout.flush()
    print(utilisation_summary(state), file=sys.stderr)
    held = sum(1 for r in results if r.get("heldByQuota"))
    if held:
        print(f"held by GPU quotas: {held} pod{'s' if held > 1 else ''}", file=sys.stderr)
    unplaced = sum(1 for result in results if result["node"] is None)
    if unplaced and getattr(args, "fail_on_unplaced", False):
        print(f"{prog}: {unplaced} of {len(results)} pods unplaced", file=sys.stderr)
        return EXIT_UNPLACED
    return 0
