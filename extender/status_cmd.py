"""``tf-extender status``: one screen on the GPU pools, read from the API server with the user's
kubeconfig.

Per pool: placement mode, provisioning mode, nodes, GPUs, allocated / free TFLOPS and VRAM, partially
used GPUs, pending GPU pods with the scheduler's last word on them, and NodeClaims in flight; per namespace
with a GPUResourceQuota: used / total requests, limits and workers. The
figures come from the same ledger code the extender runs (``ClusterState`` fed the listed objects: a
pod's ``tensor-fusion.ai/gpu-ids`` annotation is its allocation), so they are what the extender sees,
not what a node agent last wrote. A human table by default, ``-o json`` for scripts.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import sys
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from extender.common.cli import one_line
from extender.common.contract import COMPONENT_LABEL, COMPONENT_WORKER, GPU_POOL, POOL_LABEL, ContractError
from extender.common.labels import EXPANSION_LABEL, EXPANSION_POD_ANNOTATION, NODEPOOL_LABEL
from extender.common.output import add_output_argument, yaml_document
from extender.controllers import LEADER_LEASE
from extender.kube import resources
from extender.kube.resources import Resource

if TYPE_CHECKING:
    from extender.scheduling.state import ClusterState

# The ledger code (numpy) and the status writer are imported by the functions that use them: the flags,
# and so shell completion and --help, stay light.

NO_POOL = "-"
FIELD_SELECTOR = "field:"  # a lister's selector with this prefix is a field selector, else a label selector
DEFAULT_PROVISIONING = "AutoSelect"


@dataclass(frozen=True)
class StatusSnapshot:
    nodes: list[dict[str, Any]]
    gpus: list[dict[str, Any]]
    pools: list[dict[str, Any]]
    templates: list[dict[str, Any]]
    pods: list[dict[str, Any]]
    nodeclaims: list[dict[str, Any]]
    gpunodeclaims: list[dict[str, Any]] = field(default_factory=list)  # Karpenter-mode pools
    quotas: list[dict[str, Any]] = field(default_factory=list)  # GPUResourceQuotas
    leases: list[dict[str, Any]] = field(default_factory=list)  # LEADER_LEASES, in any namespace


# The Leases that say which replica leads: the extender's controllers, and kube-scheduler's (the chart's
# leaderElection.resourceName), whose replica's extender answers the verbs.
LEADER_LEASES = {LEADER_LEASE: "controllers", "tensor-fusion-scheduler": "scheduler"}


# The Leases that say which replica leads: the extender's controllers, and kube-scheduler's (the chart's
# leaderElection.resourceName), whose replica's extender answers the verbs.
LEADER_LEASES = {LEADER_LEASE: "controllers", "tensor-fusion-scheduler": "scheduler"}


# --- pure: the report -----------------------------------------------------------------------------


def _meta(obj: Mapping[str, Any]) -> Mapping[str, Any]:
    return obj.get("metadata") or {}


def _condition(obj: Mapping[str, Any], kind: str) -> Mapping[str, Any] | None:
    for condition in (obj.get("status") or {}).get("conditions") or []:
        if condition.get("type") == kind:
            return condition  # type: ignore[no-any-return]
    return None


def pending_reason(pod: Mapping[str, Any]) -> str:
    """Why a pod is not bound yet, in the scheduler's words when it has said something."""
    nominated = (pod.get("status") or {}).get("nominatedNodeName")
    if nominated:
        return f"preempting lower-priority pods on {nominated}"
    if _meta(pod).get("deletionTimestamp"):
        return "being deleted"
    scheduled = _condition(pod, "PodScheduled")
    if scheduled is not None and scheduled.get("status") == "False":
        message = str(scheduled.get("message") or scheduled.get("reason") or "").strip()
        if message:
            return message
    return "not tried by the scheduler yet"


def _claim_in_flight(claim: Mapping[str, Any]) -> bool:
    if _meta(claim).get("deletionTimestamp"):
        return False
    ready = _condition(claim, "Ready")
    return ready is None or ready.get("status") != "True"


def _claim_state(claim: Mapping[str, Any]) -> str:
    for kind in ("Initialized", "Registered", "Launched"):
        condition = _condition(claim, kind)
        if condition is not None and condition.get("status") == "True":
            return kind
    return "Created"


def report_state(snapshot: StatusSnapshot) -> ClusterState:
    from extender.scheduling.state import ClusterState, Kind

    state = ClusterState()
    for kind, objects in ((Kind.TEMPLATE, snapshot.templates), (Kind.POOL, snapshot.pools),
                          (Kind.NODE, snapshot.nodes), (Kind.GPU, snapshot.gpus), (Kind.POD, snapshot.pods)):
        for obj in objects:
            state.apply(kind, "ADDED", obj)
    return state


def build_report(snapshot: StatusSnapshot) -> dict[str, Any]:
    from extender.controllers.gpustatus import PoolTotals, node_parts, tflops_text, vram_text
    from extender.gang.quorum import waiting_gangs
    from extender.scheduling.state import PlacementError, pod_key

    state = report_state(snapshot)
    pool_specs = {str(_meta(p).get("name")): p for p in snapshot.pools}
    totals: dict[str, PoolTotals] = {name: PoolTotals() for name in pool_specs}
    for node in state.nodes():
        for pool, part in node_parts(state.node_gpus(node), no_pool=NO_POOL).items():
            totals.setdefault(pool, PoolTotals()).merge(part)

    pending: dict[str, list[dict[str, str]]] = {}
    pool_of_pod: dict[str, str] = {}
    for pod in snapshot.pods:
        try:
            pool = state.request_of(pod).pool or NO_POOL
        except (PlacementError, ContractError):
            pool = str((_meta(pod).get("annotations") or {}).get(GPU_POOL) or NO_POOL)
        pool_of_pod[pod_key(pod)] = pool
        spec, status = pod.get("spec") or {}, pod.get("status") or {}
        if not spec.get("nodeName") and status.get("phase", "Pending") == "Pending":
            pending.setdefault(pool, []).append({"pod": pod_key(pod), "reason": pending_reason(pod)})

    claims: dict[str, list[dict[str, str]]] = {}
    for claim in snapshot.nodeclaims:
        meta = _meta(claim)
        if EXPANSION_LABEL not in (meta.get("labels") or {}) or not _claim_in_flight(claim):
            continue
        for_pod = str((meta.get("annotations") or {}).get(EXPANSION_POD_ANNOTATION) or "")
        pool = pool_of_pod.get(for_pod, NO_POOL)
        claims.setdefault(pool, []).append({
            "kind": "NodeClaim", "name": str(meta.get("name") or ""),
            "nodePool": str((meta.get("labels") or {}).get(NODEPOOL_LABEL) or ""),
            "forPod": for_pod, "state": _claim_state(claim)})
    for claim in snapshot.gpunodeclaims:
        meta = _meta(claim)
        phase = str((claim.get("status") or {}).get("phase") or "Pending")
        if phase == "Bound" or meta.get("deletionTimestamp"):
            continue
        pool = str((meta.get("labels") or {}).get(POOL_LABEL) or NO_POOL)
        instance_type = str((claim.get("spec") or {}).get("instanceType") or "")
        claims.setdefault(pool, []).append({"kind": "GPUNodeClaim", "name": str(meta.get("name") or ""),
                                            "instanceType": instance_type, "state": phase})

    names = sorted(set(totals) | set(pending) | set(claims), key=lambda n: (n == NO_POOL, n))
    out = []
    for name in names:
        t = totals.get(name, PoolTotals())
        spec = (pool_specs.get(name) or {}).get("spec") or {}
        provisioning = (spec.get("nodeManagerConfig") or {}).get("provisioningMode") or DEFAULT_PROVISIONING
        out.append({
            "name": name,
            "exists": name in pool_specs,
            "default": name == state.default_pool,
            "mode": state.mode_for(name).value if name != NO_POOL else "",
            "provisioning": provisioning if name in pool_specs else "",
            "nodes": t.nodes, "gpus": t.gpus, "partiallyUsedGPUs": t.partially_used,
            "tflops": {"total": tflops_text(t.total_tflops), "allocated": tflops_text(t.used_tflops),
                       "free": tflops_text(t.total_tflops - t.used_tflops)},
            "vram": {"total": vram_text(t.total_vram), "allocated": vram_text(t.used_vram),
                     "free": vram_text(t.total_vram - t.used_vram)},
            "pendingPods": sorted(pending.get(name, []), key=lambda p: p["pod"]),
            "nodeClaimsInFlight": sorted(claims.get(name, []), key=lambda c: c["name"]),
        })
    gangs = waiting_gangs(snapshot.pods)
    reasons = {pod_key(p): pending_reason(p) for p in snapshot.pods}
    for gang in gangs:
        gang["reason"] = reasons.get(gang.pop("example"), "")
    return {"pools": out, "quotas": quota_report(state, snapshot.quotas), "waitingGangs": gangs,
            "leaders": leaders(snapshot.leases)}


def quota_report(state: ClusterState, quotas: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per namespace with a GPUResourceQuota: used (the ledger's) and total per dimension; the total is the
    smallest of the namespace's quotas, "-" when none caps it."""
    from extender.controllers.gpustatus import tflops_text, vram_text
    from extender.quota.book import QuotaBook

    book = QuotaBook(state, lambda: quotas)
    out = []
    for namespace, items in sorted(book.by_namespace().items()):
        used = book.usage(namespace)
        row: dict[str, Any] = {"namespace": namespace, "quotas": [q.name for q in items]}
        for kind, spent in (("requests", used.requests), ("limits", used.limits)):
            caps = [c for c in ((q.total_requests if kind == "requests" else q.total_limits) for q in items)
                    if c is not None]
            row[kind] = {
                "tflops": {"used": tflops_text(spent.tflops),
                           "total": tflops_text(min(c.tflops for c in caps)) if caps else "-"},
                "vram": {"used": vram_text(spent.vram),
                         "total": vram_text(min(c.vram for c in caps)) if caps else "-"}}
        row["workers"] = {"used": used.workers, "total": min(q.max_workers for q in items)}
        out.append(row)
    return out


def leaders(leases: list[dict[str, Any]]) -> list[dict[str, str]]:
    """Who holds each of ``LEADER_LEASES`` (a released Lease has no holder: the next replica takes it)."""
    out = []
    for lease in leases:
        meta, spec = _meta(lease), lease.get("spec") or {}
        name = str(meta.get("name") or "")
        if name not in LEADER_LEASES:
            continue
        out.append({"lease": f"{meta.get('namespace') or ''}/{name}", "role": LEADER_LEASES[name],
                    "holder": str(spec.get("holderIdentity") or ""),
                    "renewed": str(spec.get("renewTime") or "")})
    return sorted(out, key=lambda x: (x["role"], x["lease"]))


def render_table(report: Mapping[str, Any]) -> str:
    header = ("POOL", "MODE", "PROVISIONING", "NODES", "GPUS", "TFLOPS ALLOC/TOTAL", "TFLOPS FREE",
              "VRAM ALLOC/TOTAL", "VRAM FREE", "PARTIAL", "PENDING", "CLAIMS")
    rows = [header]
    for p in report["pools"]:
        name = p["name"] + ("*" if p["default"] else "") + ("" if p["exists"] or p["name"] == NO_POOL
                                                            else " (no GPUPool)")
        rows.append((name, p["mode"] or "-", p["provisioning"] or "-", str(p["nodes"]), str(p["gpus"]),
                     f"{p['tflops']['allocated']}/{p['tflops']['total']}", p["tflops"]["free"],
                     f"{p['vram']['allocated']}/{p['vram']['total']}", p["vram"]["free"],
                     str(p["partiallyUsedGPUs"]), str(len(p["pendingPods"])),
                     str(len(p["nodeClaimsInFlight"]))))
    if len(rows) == 1:
        return "No GPU pools, GPUs or GPU pods found.\n" + _render_leaders(report)
    widths = [max(len(r[i]) for r in rows) for i in range(len(header))]
    lines = ["  ".join(cell.ljust(w) for cell, w in zip(r, widths, strict=True)).rstrip() for r in rows]
    lines.append("(* default pool)")
    pending = [(p["name"], x) for p in report["pools"] for x in p["pendingPods"]]
    if pending:
        lines += ["", "Pending GPU pods:"]
        lines += [f"  {x['pod']} (pool {pool}): {x['reason']}" for pool, x in pending]
    quotas = report.get("quotas") or []
    if quotas:
        lines += ["", "GPU quotas (used/total):"]
        lines += [f"  {q['namespace']}: " + "; ".join(
            f"{kind} {q[kind]['tflops']['used']}/{q[kind]['tflops']['total']} TFLOPS, "
            f"{q[kind]['vram']['used']}/{q[kind]['vram']['total']} VRAM" for kind in ("requests", "limits"))
            + f"; workers {q['workers']['used']}/{q['workers']['total']}" for q in quotas]
    gangs = report.get("waitingGangs") or []
    if gangs:
        lines += ["", "Waiting gangs (placed all together or not at all):"]
        lines += [f"  {g['gang']}: {g['bound']} bound, {g['here']} here of "
                  + (f"{g['required']} required" if g["required"] else "its PodGroup's minCount")
                  + f": {g['reason']}" for g in gangs]
    claims = [(p["name"], c) for p in report["pools"] for c in p["nodeClaimsInFlight"]]
    if claims:
        lines += ["", "NodeClaims in flight:"]
        lines += [f"  {c['kind']} {c['name']} (pool {pool}, "
                  + (f"NodePool {c['nodePool'] or '-'}, for {c['forPod'] or '-'}" if c["kind"] == "NodeClaim"
                     else f"instance type {c['instanceType'] or '-'}")
                  + f"): {c['state']}" for pool, c in claims]
    return "\n".join(lines) + "\n" + _render_leaders(report)


def _render_leaders(report: Mapping[str, Any]) -> str:
    rows = report.get("leaders") or []
    if not rows:
        return ""
    lines = ["", "Leaders:"]
    lines += [f"  {x['role']} (Lease {x['lease']}): " + (f"{x['holder']}, renewed {x['renewed'] or '-'}"
                                                         if x["holder"] else "released, none yet")
              for x in rows]
    return "\n".join(lines) + "\n"


# --- I/O ------------------------------------------------------------------------------------------


def read_snapshot(list_all: Callable[[Resource, str | None], list[dict[str, Any]]]) -> StatusSnapshot:
    selector = f"{COMPONENT_LABEL}={COMPONENT_WORKER}"
    return StatusSnapshot(
        nodes=list_all(resources.NODES, None), gpus=list_all(resources.GPUS, None),
        pools=list_all(resources.GPU_POOLS, None),
        templates=list_all(resources.SCHEDULING_CONFIG_TEMPLATES, None),
        pods=list_all(resources.PODS, selector), nodeclaims=list_all(resources.NODECLAIMS, None),
        gpunodeclaims=list_all(resources.GPU_NODE_CLAIMS, None),
        quotas=list_all(resources.GPU_RESOURCE_QUOTAS, None), leases=_leader_leases(list_all))


def _leader_leases(list_all: Callable[[Resource, str | None], list[dict[str, Any]]]) -> list[dict[str, Any]]:
    """The Leases of ``LEADER_LEASES``; none when the user may not list Leases (the rest still shows)."""
    try:
        found: list[dict[str, Any]] = []
        for name in LEADER_LEASES:
            found += list_all(resources.LEASES, f"{FIELD_SELECTOR}metadata.name={name}")
        return found
    except Exception:
        return []


def resource_name(resource: Resource) -> str:
    """``gpupools.tensor-fusion.ai``, ``nodes``: the name kubectl and the API server know a resource by."""
    return f"{resource.plural}.{resource.group}" if resource.group else resource.plural


def kube_lister(api_client: Any, missing: list[str] | None = None,
                ) -> Callable[[Resource, str | None], list[dict[str, Any]]]:
    """A lister over the API server. A custom resource the server does not serve lists as empty, and its
    name is added to ``missing``; any other failure raises ``RuntimeError`` naming the resource."""
    from extender.kube.client import cli_error, not_found, request_json

    def list_all(resource: Resource, selector: str | None) -> list[dict[str, Any]]:
        items: list[dict[str, Any]] = []
        query: dict[str, str | int | bool] = {"limit": 500}
        if selector and selector.startswith(FIELD_SELECTOR):
            query["fieldSelector"] = selector.removeprefix(FIELD_SELECTOR)
        elif selector:
            query["labelSelector"] = selector
        while True:
            try:
                page = request_json(api_client, "GET", resources.collection_path(resource), query=query)
            except Exception as exc:
                if resource.group and not_found(exc):
                    if missing is not None:
                        missing.append(resource_name(resource))
                    return []  # the CRD is not installed: none of these
                raise RuntimeError(cli_error(exc, resource_name(resource))) from exc
            items.extend(page.get("items") or [])
            token = (page.get("metadata") or {}).get("continue")
            if not token:
                return items
            query["continue"] = token

    return list_all


def in_namespace(report: Mapping[str, Any], namespace: str) -> dict[str, Any]:
    """The report with only ``namespace``'s pending pods and the NodeClaims made for them. The pool figures
    stay cluster-wide: a GPU's shares are held by pods of every namespace."""
    prefix = f"{namespace}/"
    pools = []
    for pool in report["pools"]:
        pools.append({**pool,
                      "pendingPods": [p for p in pool["pendingPods"] if p["pod"].startswith(prefix)],
                      "nodeClaimsInFlight": [c for c in pool["nodeClaimsInFlight"]
                                             if str(c.get("forPod", prefix)).startswith(prefix)]})
    quotas = [q for q in report.get("quotas") or [] if q["namespace"] == namespace]
    gangs = [g for g in report.get("waitingGangs") or [] if str(g["gang"]).startswith(prefix)]
    return {**report, "pools": pools, "quotas": quotas, "waitingGangs": gangs}


def add_status_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--kubeconfig", default=None,
                        help="kubeconfig file (default: $KUBECONFIG, else ~/.kube/config)")
    parser.add_argument("--context", default=None,
                        help="the kubeconfig context to use (default: its current context)")
    parser.add_argument("-n", "--namespace", default=None,
                        help="list only this namespace's pending GPU pods (pool figures stay cluster-wide)")
    add_output_argument(parser, "table", "one JSON document for scripts")
    parser.add_argument("--prometheus", metavar="URL", default=None,
                        help="also show allocated vs used per pool, node, GPU and workload, use read from "
                             "dcgm-exporter's series in this Prometheus")
    parser.add_argument("-w", "--watch", action=argparse.BooleanOptionalAction, default=False,
                        help="read and print again every --watch-interval until interrupted")
    parser.add_argument("--watch-interval", type=_interval, default="2s", metavar="DURATION",
                        help="time between two screens of --watch, a Go duration (default 2s)")


def _interval(text: str) -> float:
    from extender.common.timefmt import parse_duration

    try:
        seconds = parse_duration(text).total_seconds()
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"{text!r} is not a duration such as 2s or 1m ({exc})") from exc
    if seconds <= 0:
        raise argparse.ArgumentTypeError(f"{text!r}: the interval must be more than 0s")
    return seconds


def main_status(args: argparse.Namespace, out: Any = None) -> int:
    from extender.kube.client import KubeConfigError, load_api_client

    out = out or sys.stdout
    prog = getattr(args, "prog", "tf-extender status")
    try:
        api_client = load_api_client(args.kubeconfig, context=args.context)
    except KubeConfigError as exc:
        print(f"{prog}: error: {exc}", file=sys.stderr)
        return 2
    try:
        while True:
            missing: list[str] = []
            try:
                snapshot = read_snapshot(kube_lister(api_client, missing))
            except Exception as exc:
                print(f"{prog}: error: {one_line(str(exc))}", file=sys.stderr)
                if not args.watch:
                    return 1
            else:
                _note_missing(prog, missing)
                report = build_report(snapshot)
                if args.namespace:
                    report = in_namespace(report, args.namespace)
                code, usage = _usage(args, snapshot, prog)
                if usage is not None:
                    report["usage"] = usage
                if args.watch and args.output == "table":
                    out.write(_SCREEN_START if out.isatty() else
                              f"--- {dt.datetime.now(dt.UTC).isoformat(timespec='seconds')}\n")
                if args.output == "json":
                    out.write(json.dumps(report, indent=2) + "\n")
                elif args.output == "yaml":
                    out.write(yaml_document(report))
                else:
                    out.write(render_table(report) + (_render_usage(usage) if usage is not None else ""))
                out.flush()
                if not args.watch:
                    return code
            time.sleep(args.watch_interval)
    except KeyboardInterrupt:  # the way out of --watch
        return 0
    finally:
        api_client.close()  # type: ignore[no-untyped-call]


def _note_missing(prog: str, missing: list[str]) -> None:
    """One line naming TensorFusion's resources the API server does not serve (their CRDs are missing)."""
    ours = [name for name in missing if name.endswith(f".{resources.GPUS.group}")]
    if ours:
        print(f"{prog}: note: the API server has no {', '.join(ours)}: install TensorFusion's CRDs or run "
              "tf-extender crds apply (docs/install.md#crds)", file=sys.stderr)


def _usage(args: argparse.Namespace, snapshot: Any, prog: str) -> tuple[int, dict[str, Any] | None]:
    """With --prometheus, allocated vs used from dcgm-exporter's series: (exit code, the usage report)."""
    if not getattr(args, "prometheus", None):
        return 0, None
    from extender.status_usage import FB_QUERY, UTIL_QUERY, PrometheusError, instant, usage_report

    try:
        util, fb = instant(args.prometheus, UTIL_QUERY), instant(args.prometheus, FB_QUERY)
    except PrometheusError as exc:
        print(f"{prog}: no usage: {exc}", file=sys.stderr)
        return 1, None
    return 0, usage_report(report_state(snapshot), snapshot.pods, util, fb)


def _render_usage(usage: dict[str, Any]) -> str:
    from extender.status_usage import render_usage

    return render_usage(usage)


_SCREEN_START = "\x1b[H\x1b[2J"  # cursor home, clear the screen: each --watch screen replaces the last
