"""``kubectl tf snapshot``: everything ``simulate``, ``plan`` and ``mutate`` read, from a live cluster, in
one file.

One YAML stream, one object per document, each with its ``apiVersion`` and ``kind`` (the API leaves them out
of list items) and without ``managedFields``. Resources whose CRD the cluster lacks (no Karpenter, no
GPUResourceQuota) are left out and named on stderr; the Karpenter NodeClasses are the ones the NodePools
name, read at the version the API server prefers. Reads only.
"""

from __future__ import annotations

import argparse
import datetime as dt
import sys
from collections.abc import Callable, Iterable
from typing import Any, TextIO

from extender.common.cli import EXIT_FAILED, EXIT_USAGE, fail
from extender.kube import resources
from extender.kube.resources import Resource

# What the offline tools read, in the order a reader wants them: the scheduling inputs, then the capacity
# controllers', then the pods.
SNAPSHOT_RESOURCES: tuple[Resource, ...] = (
    resources.SCHEDULING_CONFIG_TEMPLATES, resources.GPU_POOLS, resources.TENSOR_FUSION_CLUSTERS,
    resources.WORKLOAD_PROFILES, resources.GPU_RESOURCE_QUOTAS, resources.NODES, resources.GPUS,
    resources.GPU_NODE_CLASSES, resources.GPU_NODE_CLAIMS, resources.NODEPOOLS, resources.NODECLAIMS,
    resources.PDBS, resources.PODS,
)
# Finished pods hold no GPU and block no node: left out, as the scheduler leaves them out.
FINISHED = ("Succeeded", "Failed")

Lister = Callable[[Resource, str | None], list[dict[str, Any]]]


def node_class_resources(nodepools: Iterable[dict[str, Any]]) -> list[tuple[str, str]]:
    """``(group, kind)`` of every Karpenter NodeClass the NodePools name, sorted, once each."""
    found: set[tuple[str, str]] = set()
    for pool in nodepools:
        ref = ((((pool.get("spec") or {}).get("template") or {}).get("spec") or {}).get("nodeClassRef")) or {}
        group, kind = str(ref.get("group") or ""), str(ref.get("kind") or "")
        if group and kind.endswith("NodeClass"):
            found.add((group, kind))
    return sorted(found)


def plural_of(kind: str) -> str:
    """The plural Karpenter's providers use: ``EC2NodeClass`` -> ``ec2nodeclasses``."""
    lower = kind.lower()
    return lower + "es" if lower.endswith(("s", "x", "ch", "sh")) else lower + "s"


def typed(resource: Resource, items: Iterable[dict[str, Any]]) -> list[dict[str, Any]]:
    """List items as standalone objects: ``apiVersion`` and ``kind`` set, ``managedFields`` dropped."""
    out = []
    for item in items:
        meta = {k: v for k, v in (item.get("metadata") or {}).items() if k != "managedFields"}
        out.append({"apiVersion": resource.api_version, "kind": resource.kind, **item, "metadata": meta})
    return out


def take(list_all: Lister, preferred_version: Callable[[str], str | None],
         ) -> tuple[list[dict[str, Any]], list[str]]:
    """Every object of the snapshot, and the names of the resources the cluster does not serve (for which
    ``list_all`` raises ``LookupError``)."""
    from extender.status_cmd import resource_name

    objects: list[dict[str, Any]] = []
    missing: list[str] = []
    for resource in SNAPSHOT_RESOURCES:
        try:
            items = list_all(resource, None)
        except LookupError:
            missing.append(resource_name(resource))
            continue
        if resource is resources.PODS:
            items = [p for p in items if (p.get("status") or {}).get("phase") not in FINISHED]
        objects += typed(resource, items)
        if resource is resources.NODEPOOLS:
            for group, kind in node_class_resources(items):
                version = preferred_version(group)
                node_class = Resource(group, version or "v1", plural_of(kind), kind, False)
                if version is None:
                    missing.append(resource_name(node_class))
                    continue
                try:
                    objects += typed(node_class, list_all(node_class, None))
                except LookupError:
                    missing.append(resource_name(node_class))
    return objects, missing


def write_snapshot(objects: list[dict[str, Any]], out: TextIO, header: str) -> None:
    import yaml

    out.write(f"# {header}\n")
    for obj in objects:
        out.write("---\n")
        out.write(yaml.safe_dump(obj, sort_keys=False))


# --- I/O ------------------------------------------------------------------------------------------------


def add_snapshot_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--kubeconfig", default=None,
                        help="kubeconfig file (default: $KUBECONFIG, else ~/.kube/config)")
    parser.add_argument("--context", default=None,
                        help="the kubeconfig context to use (default: its current context)")
    parser.add_argument("-f", "--filename", default="-", metavar="FILE",
                        help="where to write the snapshot (default -: standard output)")


def main_snapshot(args: argparse.Namespace) -> int:
    from extender.kube.client import KubeConfigError, load_api_client, request_json

    prog = getattr(args, "prog", "kubectl tf snapshot")
    try:
        api = load_api_client(args.kubeconfig, context=args.context)
    except KubeConfigError as exc:
        return fail(prog, str(exc), EXIT_USAGE)
    try:
        objects, missing = take(_lister(api), lambda group: _preferred_version(api, group, request_json))
    except RuntimeError as exc:
        return fail(prog, str(exc), EXIT_FAILED)
    finally:
        api.close()  # type: ignore[no-untyped-call]
    if missing:
        print(f"{prog}: note: the cluster serves no {', '.join(missing)} (left out)", file=sys.stderr)
    header = (f"kubectl tf snapshot, {dt.datetime.now(dt.UTC).isoformat(timespec='seconds')}, "
              f"{len(objects)} objects")
    if args.filename == "-":
        write_snapshot(objects, sys.stdout, header)
        sys.stdout.flush()
    else:
        try:
            with open(args.filename, "w", encoding="utf-8") as handle:
                write_snapshot(objects, handle, header)
        except OSError as exc:
            from extender.common.cli import describe

            return fail(prog, describe(exc), EXIT_FAILED)
        print(f"{prog}: wrote {len(objects)} objects to {args.filename}", file=sys.stderr)
    return 0


def _lister(api: Any) -> Lister:
    from extender.status_cmd import kube_lister

    missing: list[str] = []
    list_all = kube_lister(api, missing)

    def listing(resource: Resource, selector: str | None) -> list[dict[str, Any]]:
        before = len(missing)
        items = list_all(resource, selector)
        if len(missing) > before:
            raise LookupError(missing[-1])
        return items

    return listing


def _preferred_version(api: Any, group: str, request_json: Callable[..., Any]) -> str | None:
    from extender.kube.client import cli_error, not_found

    try:
        found = request_json(api, "GET", f"/apis/{group}")
    except Exception as exc:
        if not_found(exc):
            return None
        raise RuntimeError(cli_error(exc, f"API group {group}")) from exc
    version = ((found or {}).get("preferredVersion") or {}).get("version")
    return str(version) if version else None
