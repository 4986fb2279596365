"""``tf-extender plan``: the actions the capacity controllers would take now, from a snapshot file.

The snapshot is the multi-document YAML of ``simulate`` (Nodes, GPUs, GPUPools, SchedulingConfigTemplates,
GPUResourceQuotas, pods) plus GPUNodeClaims, NodeClaims, NodePools, PodDisruptionBudgets and the Karpenter
NodeClasses the pools refer to (any kind ending in ``NodeClass``). A pending pod its namespace's quota holds
is a ``quota-hold`` line and no demand. Nothing is written to any cluster.
"""

from __future__ import annotations

import argparse
import datetime as dt
import sys
from collections.abc import Sequence
from typing import Any

import yaml

from extender.autoscaling.usage import StaticUsageSource
from extender.cloud.nodeclass import parse_node_class
from extender.cloud.provider import LaunchRequest
from extender.cloud.vendor import VendorConfig, read_vendor_file
from extender.common.cli import EXIT_USAGE, describe, fail
from extender.common.logs import describe_exception
from extender.common.options import duration
from extender.common.output import add_output_argument, json_lines, table, yaml_document
from extender.common.progress import Progress
from extender.common.timefmt import parse_time
from extender.common.yamlio import YAMLFileError, read_text_file
from extender.controllers.capacity.compaction_plan import plan_compaction
from extender.controllers.capacity.config import DEFAULT_CLUSTER_NAME
from extender.controllers.capacity.launch_plan import LaunchPayload, plan_launches, plan_provisioned_launches
from extender.controllers.capacity.vendors import VendorChoice, pool_vendor
from extender.controllers.defrag.plan import plan_defrag
from extender.controllers.quota.plan import plan_quota_holds
from extender.planning.action import Planner, plan
from extender.planning.amounts import CapacityError
from extender.planning.catalog import DEFAULT_CATALOG, Catalog, parse_catalog
from extender.planning.inputs import Inputs
from extender.planning.removal import DEFAULT_PROTECTION_SECONDS
from extender.quota.book import QuotaBook
from extender.quota.model import KIND
from extender.scheduling.inventory import object_name
from extender.scheduling.state import ClusterState
from extender.simulate_cmd import load_cluster, read_file, report_skipped, screen

# The planners ``plan`` runs by default, in order; other planners register here with their own flag.
DEFAULT_PLANNERS: list[Planner] = [plan_quota_holds, plan_launches, plan_provisioned_launches,
                                   plan_compaction]


def _kind(obj: dict[str, Any]) -> str:
    return str(obj.get("kind") or "")


def _group(obj: dict[str, Any]) -> str:
    api_version = str(obj.get("apiVersion") or "")
    return api_version.split("/", 1)[0] if "/" in api_version else ""


def snapshot_inputs(objects: Sequence[dict[str, Any]], *, now: dt.datetime,
                    catalog: Catalog = DEFAULT_CATALOG,
                    protection_seconds: float = DEFAULT_PROTECTION_SECONDS,
                    problems: list[str] | None = None) -> Inputs:
    """The planners' inputs from snapshot objects, with the extender's own inventory code (an object the
    inventory cannot take is left out, named in ``problems``)."""
    state = ClusterState()
    load_cluster(state, objects, problems)
    quotas = [o for o in objects if _kind(o) == KIND]
    if quotas:  # the snapshot's GPUResourceQuotas, against the usage of its bound pods
        state.quota_gate = QuotaBook(state, lambda: quotas)

    def of(kind: str) -> list[dict[str, Any]]:
        return [o for o in objects if _kind(o) == kind]

    return Inputs(
        now=now, state=state, pools=of("GPUPool"),
        nodes={object_name(n): n for n in of("Node")}, gpunodeclaims=of("GPUNodeClaim"),
        nodeclaims=of("NodeClaim"), nodepools=of("NodePool"), pdbs=of("PodDisruptionBudget"),
        pods=of("Pod"),
        node_classes=frozenset((_group(o), _kind(o), object_name(o)) for o in objects
                               if _kind(o).endswith("NodeClass")),
        catalog=catalog, protection_seconds=protection_seconds,
    )


def add_plan_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--cluster", required=True, metavar="SNAPSHOT.yaml",
                        help="Nodes, GPUs, GPUPools, pods, GPUNodeClaims, NodeClaims, NodePools, PDBs and "
                             "NodeClasses (kubectl get -o yaml output, several documents or Lists)")
    parser.add_argument("--catalog", metavar="CATALOG.yaml", default=None,
                        help="instance types over the built-in catalog (a file or a ConfigMap manifest)")
    parser.add_argument("--now", metavar="RFC3339", default=None,
                        help="the time to plan at, for node ages (default: now)")
    parser.add_argument("--defrag", action=argparse.BooleanOptionalAction, default=False,
                        help="also plan defragmentation: the evictions a run would make now in pools that "
                             "enable it, and the candidate nodes it would leave as they are")
    parser.add_argument("--computing-vendor", metavar="FILE.yaml", default=None,
                        help="Provisioned pools: the computingVendor (as for serve) of pools no "
                             "TensorFusionCluster of the snapshot owns, or whose cluster has none; each "
                             "launch then prints the exact cloud request")
    parser.add_argument("--cluster-name", default=DEFAULT_CLUSTER_NAME,
                        help="Provisioned pools: the cluster tag of the VMs "
                             f"(default {DEFAULT_CLUSTER_NAME})")
    parser.add_argument("--autoscale", action=argparse.BooleanOptionalAction, default=False,
                        help="also print each GPU workload's autoscaling recommendation and what a resize of "
                             "each of its workers would do (usage from --samples or --prometheus)")
    parser.add_argument("--samples", metavar="SAMPLES.json", default=None,
                        help="usage samples for --autoscale: a JSON list of {namespace, workload, worker, "
                             "tflops, vram, time}")
    parser.add_argument("--prometheus", metavar="URL", default=None,
                        help="usage for --autoscale read from this Prometheus with the dcgm-exporter PromQL "
                             "templates (or --usage-metrics hypervisor), over --history before now")
    parser.add_argument("--usage-metrics", choices=("dcgm", "hypervisor"), default="dcgm",
                        help="the PromQL templates --prometheus uses (default dcgm)")
    parser.add_argument("--history", default="2h", metavar="DURATION",
                        type=duration("--history", positive=True, legacy_seconds=False),
                        help="how far back --prometheus reads, a Go duration (default 2h, TensorFusion's "
                             "historyDataPeriod)")
    parser.add_argument("--cron-time-zone", default="UTC",
                        help="IANA time zone of cronScalingRules without CRON_TZ= (default UTC)")
    parser.add_argument("--protection-time", type=duration("--protection-time"),
                        default=DEFAULT_PROTECTION_SECONDS, metavar="DURATION",
                        help="empty nodes younger than this are never released (default 5m)")
    add_output_argument(parser, "json", "one JSON object per action and line, for jq")


def main_plan(args: argparse.Namespace, planners: Sequence[Planner] | None = None) -> int:
    prog = getattr(args, "prog", "tf-extender plan")
    now = dt.datetime.now(dt.UTC)
    if args.now:
        parsed = parse_time(args.now)
        if parsed is None:
            return fail(prog, f"--now {args.now!r} is not an RFC 3339 time", EXIT_USAGE)
        now = parsed
    with Progress(prog) as progress:
        try:
            objects, skipped = screen(read_file(args.cluster, progress))
            catalog = DEFAULT_CATALOG
            if args.catalog:
                catalog = parse_catalog(read_text_file(args.catalog))
        except (OSError, YAMLFileError, yaml.YAMLError, CapacityError) as exc:
            return fail(prog, describe(exc), EXIT_USAGE)
        progress.begin("loading the snapshot")
        inputs = snapshot_inputs(objects, now=now, catalog=catalog, protection_seconds=args.protection_time,
                                 problems=skipped)
        # a pool with problems is left alone by every planner (as serve does): named once here
        skipped += [f"GPUPool {c.name}: left alone: {'; '.join(c.problems)}" for c in inputs.configs()
                    if c.problems]
        if planners is None:
            planners = [*DEFAULT_PLANNERS, *([plan_defrag] if getattr(args, "defrag", False) else [])]
        # as serve: a pool's own TensorFusionCluster's computingVendor, else the file
        fallback: VendorChoice | None = None
        if getattr(args, "computing_vendor", None):
            try:
                fallback = VendorChoice(read_vendor_file(args.computing_vendor),
                                        f"--computing-vendor {args.computing_vendor}")
            except (OSError, YAMLFileError, yaml.YAMLError) as exc:
                return fail(prog, f"--computing-vendor: {describe(exc)}", EXIT_USAGE)
        clusters = {object_name(o): o for o in objects if _kind(o) == "TensorFusionCluster"}
        pools = {object_name(o): o for o in objects if _kind(o) == "GPUPool"}
        classes = {object_name(o): o for o in objects if _kind(o) == "GPUNodeClass"}
        progress.begin("planning")
        rows = []
        for action in plan(inputs, planners, skipped):
            line = action.as_json()
            if action.action == "launch" and action.payload.config.launches_vms:
                name = action.payload.config.name
                pool = pools.get(name) or {"metadata": {"name": name}}
                try:
                    line["cloudRequest"] = cloud_request(action.payload, classes,
                                                         pool_vendor(pool, clusters, fallback).config,
                                                         getattr(args, "cluster_name", DEFAULT_CLUSTER_NAME))
                except Exception as exc:  # a GPUNodeClass or cluster the request cannot be spelled from
                    line["cloudRequest"] = {"error": f"cannot be spelled: {describe_exception(exc, 200)}"}
            rows.append(line)
        report_skipped(prog, skipped)
        entries: list[dict[str, Any]] = []
        found: list[dict[str, Any]] | None = []
        if getattr(args, "autoscale", False):
            found = _plan_autoscale(args, inputs.state, objects, now)
            entries = found or []
        _write(args.output, rows, entries)
    return 2 if found is None else 0


# launch rows fill the cost columns, release rows the node: one table for both
PLAN_COLUMNS = ("action", "pool", "node", "instanceType", "capacityType", "count", "hourlyPrice", "reason")
PLAN_HEADERS = {"instanceType": "INSTANCE TYPE", "capacityType": "CAPACITY", "hourlyPrice": "$/HOUR"}


def _write(output: str, rows: list[dict[str, Any]], entries: list[dict[str, Any]]) -> None:
    if output == "table":
        sys.stdout.write(table(rows, PLAN_COLUMNS, PLAN_HEADERS))
        if entries:
            sys.stdout.write("\n" + table(entries, ("action", "namespace", "workload", "workers", "samples")))
    elif output == "yaml":
        sys.stdout.write(yaml_document(rows + entries))
    else:
        sys.stdout.write(json_lines(rows + entries))
    sys.stdout.flush()


def _plan_autoscale(args: argparse.Namespace, state: ClusterState, objects: Sequence[dict[str, Any]],
                    now: dt.datetime) -> list[dict[str, Any]] | None:
    """The autoscaling entries, or None after a usage error was printed."""
    from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

    from extender.controllers.autoscale.plan import plan_autoscale
    from extender.controllers.autoscale.prometheus import UsageUnavailable
    from extender.controllers.autoscale.samples import load_samples

    prog = getattr(args, "prog", "tf-extender plan")
    try:
        zone = ZoneInfo(args.cron_time_zone)
    except (ZoneInfoNotFoundError, ValueError):
        fail(prog, f"--cron-time-zone {args.cron_time_zone!r} is not an IANA time zone")
        return None
    if getattr(args, "prometheus", None):
        if args.samples:
            fail(prog, "--samples and --prometheus: give one usage source")
            return None
        try:
            samples = _read_prometheus(args, objects, now)
        except (ValueError, UsageUnavailable) as exc:
            fail(prog, f"--prometheus: {exc}")
            return None
    else:
        samples, problems = load_samples(args.samples) if args.samples else (StaticUsageSource(), [])
        for problem in problems[:10]:
            fail(prog, f"--samples: {problem}")
        if problems and not samples.samples:
            return None
    return plan_autoscale(state, objects, samples, now, zone)


def _read_prometheus(args: argparse.Namespace, objects: Sequence[dict[str, Any]],
                     now: dt.datetime) -> StaticUsageSource:
    """Every snapshot workload's usage over ``--history``, read from Prometheus into memory."""
    import asyncio

    from extender.common.contract import WORKLOAD_LABEL
    from extender.controllers.autoscale.prometheus import PRESETS, PrometheusOptions, PrometheusUsage

    history = float(args.history)  # a positive duration, checked by the parser
    tflops, vram = PRESETS[str(args.usage_metrics)]
    reader = PrometheusUsage(PrometheusOptions(str(args.prometheus), tflops, vram))
    workloads = sorted({(str((o.get("metadata") or {}).get("namespace") or "default"),
                         str(((o.get("metadata") or {}).get("labels") or {})[WORKLOAD_LABEL]))
                        for o in objects if o.get("kind") == "Pod"
                        and WORKLOAD_LABEL in (((o.get("metadata") or {}).get("labels")) or {})})
    end_ns = int(now.timestamp() * 10**9)
    start_ns = end_ns - int(history * 10**9)
    source = StaticUsageSource()

    async def read() -> None:
        for namespace, name in workloads:
            source.add(namespace, name, await reader.workload_usage(namespace, name, start_ns, end_ns))

    asyncio.run(read())
    return source


PLANNED_CLAIM = "__GPU_NODE_RESOURCE_NAME__"


def cloud_request(payload: LaunchPayload, classes: dict[str, dict[str, Any]], vendor: VendorConfig,
                  cluster: str) -> dict[str, Any]:
    """The request the cloud would be sent for one VM of a Provisioned launch. The claim's name is chosen
    at launch, so it stays the placeholder; the user data is given as its SHA-256 digest; images, subnets
    and groups named by tags are resolved only at launch (their terms are shown)."""
    config = payload.config
    obj = classes.get(config.gpu_node_class)
    if obj is None:
        return {"error": f"GPUNodeClass {config.gpu_node_class!r} is not in the snapshot"}
    node_class = parse_node_class(obj)
    if node_class.problems or vendor.problems:
        return {"error": "; ".join((*node_class.problems, *vendor.problems))}
    offer = payload.launch.offering
    request = LaunchRequest(claim=PLANNED_CLAIM, pool=config.name, cluster=cluster,
                            instance_type=offer.instance.name, capacity_type=offer.capacity_type,
                            zone=offer.zone, region=offer.instance.region or vendor.region,
                            node_class=node_class)
    from extender.cloud.factory import make_provider
    from extender.cloud.provider import CloudError

    try:  # building a provider connects nowhere; request_of only spells the request
        params = make_provider(vendor).request_of(request)
    except CloudError as exc:
        return {"error": f"computingVendor.type {vendor.type}: {exc}"}
    if "UserData" in params:
        params["UserData"] = node_class.user_data_digest(PLANNED_CLAIM)
    unresolved = {k: [t.name or t.tags for t in terms if not t.id] for k, terms in (
        ("osImageSelectorTerms", node_class.images), ("subnetSelectorTerms", node_class.subnets),
        ("securityGroupSelectorTerms", node_class.security_groups))}
    out: dict[str, Any] = {"vendor": vendor.type, "operation": "RunInstances", "parameters": params}
    if any(unresolved.values()):
        out["resolvedAtLaunch"] = {k: v for k, v in unresolved.items() if v}
    return out
