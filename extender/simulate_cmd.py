"""Offline placement: replay pods against a cluster snapshot with the extender's own code (DESIGN §5).

``simulate`` is pure; ``main_simulate`` reads the two YAML files and prints the results. Each pod goes
to the node the extender ranks first (ties by name) and is then recorded as bound, so later pods see it.
"""

from __future__ import annotations

import argparse
import copy
import sys
from collections import Counter
from collections.abc import Iterable
from typing import Any

import yaml

from extender.common.contract import GPU_IDS, ContractError, RequestContext, parse_request, render_annotations
from extender.common.output import add_output_argument, json_lines, table, yaml_document
from extender.scheduling.placement import Mode
from extender.scheduling.state import ClusterState, Kind, PlacementError, pod_key

_KINDS = {kind.value: kind for kind in Kind}


def _uid(pod: dict[str, Any]) -> str:
    meta = pod.setdefault("metadata", {})
    if not meta.get("uid"):
        meta["uid"] = f"simulated/{pod_key(pod)}"
    return str(meta["uid"])


def load_cluster(state: ClusterState, objects: Iterable[dict[str, Any]]) -> None:
    """Feed every object of a known kind to the state; pools and templates first, pods last."""
    objects = list(objects)
    order = (Kind.TEMPLATE, Kind.POOL, Kind.NODE, Kind.GPU, Kind.POD)
    for kind in order:
        for obj in objects:
            if _KINDS.get(str(obj.get("kind"))) is kind:
                item = copy.deepcopy(obj)
                if kind is Kind.POD:
                    _uid(item)
                state.apply(kind, "ADDED", item)


def canonical_pod(state: ClusterState, pod: dict[str, Any]) -> dict[str, Any]:
    """A copy of the pod with canonical annotations, as the webhook would have written them."""
    pod = copy.deepcopy(pod)
    _uid(pod)
    annotations = pod.setdefault("metadata", {}).setdefault("annotations", {}) or {}
    pod["metadata"]["annotations"] = annotations
    annotations.update(render_annotations(parse_request(annotations, RequestContext(
        default_pool=state.default_pool))))
    return pod


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


def place(state: ClusterState, pod: dict[str, Any]) -> dict[str, Any]:
    """Place one pod as kube-scheduler plus the extender would, and record it as bound."""
    key = pod_key(pod)
    try:
        pod = canonical_pod(state, pod)
    except ContractError as exc:
        return {"pod": key, "node": None, "gpus": [], "reason": str(exc)}
    nodes = state.nodes()
    ranked = state.rank(pod, nodes)
    if not ranked:
        return {"pod": key, "node": None, "gpus": [], "reason": _reason(state, pod, nodes)}
    node = ranked[0]
    try:
        reservation = state.reserve(pod, node)
    except PlacementError as exc:
        return {"pod": key, "node": None, "gpus": [], "reason": str(exc)}
    pod["metadata"]["annotations"][GPU_IDS] = ",".join(reservation.gpu_ids)
    pod.setdefault("spec", {})["nodeName"] = node
    pod.setdefault("status", {})["phase"] = "Running"
    state.apply(Kind.POD, "ADDED", pod)
    return {"pod": key, "node": node, "gpus": list(reservation.gpu_ids)}


def simulate(cluster_objects: list[dict[str, Any]], pods: list[dict[str, Any]],
             mode: str | None) -> list[dict[str, Any]]:
    return simulate_with_state(cluster_objects, pods, mode)[0]


def simulate_with_state(cluster_objects: list[dict[str, Any]], pods: list[dict[str, Any]],
                        mode: str | None) -> tuple[list[dict[str, Any]], ClusterState]:
    state = ClusterState(mode_override=mode)
    load_cluster(state, cluster_objects)
    return [place(state, pod) for pod in pods], state


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


def read_objects(text: str) -> list[dict[str, Any]]:
    """Objects of a YAML stream; ``kind: List`` (and ``...List``) documents are unpacked."""
    out: list[dict[str, Any]] = []
    for document in yaml.safe_load_all(text):
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


def add_simulate_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--cluster", required=True, metavar="CLUSTER.yaml",
                        help="Nodes, GPU objects, GPUPools, SchedulingConfigTemplates and bound pods")
    parser.add_argument("--pods", required=True, metavar="PODS.yaml", help="pods to place, in order")
    parser.add_argument("--mode", choices=[m.value for m in Mode], default=None,
                        help="placement mode for every pool (default: each pool's own)")
    add_output_argument(parser, "json", "one JSON object per pod and line, in order")


def main_simulate(args: argparse.Namespace) -> int:
    try:
        with open(args.cluster, encoding="utf-8") as handle:
            cluster = read_objects(handle.read())
        with open(args.pods, encoding="utf-8") as handle:
            pods = [obj for obj in read_objects(handle.read()) if obj.get("kind", "Pod") == "Pod"]
    except (OSError, yaml.YAMLError) as exc:
        print(f"tf-extender simulate: {exc}", file=sys.stderr)
        return 2
    results, state = simulate_with_state(cluster, pods, args.mode)
    output = getattr(args, "output", "json")
    if output == "table":
        sys.stdout.write(table(results, ("pod", "node", "gpus", "reason")))
    elif output == "yaml":
        sys.stdout.write(yaml_document(results))
    else:
        sys.stdout.write(json_lines(results))
    print(utilisation_summary(state), file=sys.stderr)
    return 0
