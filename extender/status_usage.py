"""``tf-extender status --prometheus URL``: allocated against used per pool, node, GPU and workload (step 1
of TensorFusion's "Optimize GPU Efficiency" guide).

Allocated comes from the ledger (the same ``ClusterState`` the rest of ``status`` builds); used from
dcgm-exporter's device series in Prometheus, by ``UUID`` (``DCGM_FI_DEV_GPU_UTIL`` % x the GPU's TFLOPS
capacity, ``DCGM_FI_DEV_FB_USED`` MiB). A workload's use on a GPU it shares is the device's use times its
share of what is allocated there: an estimate (docs/autoscaling.md, attribution).
"""

from __future__ import annotations

import json
import urllib.parse
import urllib.request
from collections.abc import Mapping, Sequence
from fractions import Fraction
from typing import Any

from extender.common.contract import WORKLOAD_LABEL
from extender.controllers.gpustatus import tflops_text, vram_text
from extender.scheduling.state import ClusterState

MIB = 2**20
UTIL_QUERY = "max by (UUID) (DCGM_FI_DEV_GPU_UTIL)"
FB_QUERY = "max by (UUID) (DCGM_FI_DEV_FB_USED)"


class PrometheusError(Exception):
    pass


def instant(url: str, query: str, timeout: float = 10.0) -> dict[str, float]:
    """``UUID`` -> value of an instant query."""
    data = urllib.parse.urlencode({"query": query}).encode()
    try:
        with urllib.request.urlopen(url.rstrip("/") + "/api/v1/query", data=data, timeout=timeout) as r:
            body = json.loads(r.read())
    except (OSError, ValueError) as exc:
        raise PrometheusError(f"Prometheus at {url}: {exc}") from exc
    if not isinstance(body, dict) or body.get("status") != "success":
        raise PrometheusError(f"Prometheus at {url}: {query}: {(body or {}).get('error')}")
    out = {}
    for sample in (body.get("data") or {}).get("result") or []:
        uuid = (sample.get("metric") or {}).get("UUID")
        if uuid:
            out[str(uuid)] = float(sample["value"][1])
    return out


def _row(key: dict[str, str], alloc_t: Fraction, used_t: Fraction | None, alloc_v: int,
         used_v: int | None) -> dict[str, Any]:
    return {**key, "tflops": {"allocated": tflops_text(alloc_t),
                              "used": None if used_t is None else tflops_text(used_t)},
            "vram": {"allocated": vram_text(alloc_v), "used": None if used_v is None else vram_text(used_v)}}


def usage_report(state: ClusterState, pods: Sequence[Mapping[str, Any]], util: Mapping[str, float],
                 fb_mib: Mapping[str, float]) -> dict[str, Any]:
    """Allocated vs used; ``used`` is None where dcgm-exporter reports nothing for a GPU."""
    per_gpu: dict[str, tuple[str, str, Fraction, Fraction | None, int, int | None]] = {}
    views = {}
    for node in state.nodes():
        for view in state.node_gpus(node):
            uuid = view.device.dcgm_uuid
            views[view.name] = view
            used_t = None if uuid not in util else view.capacity_tflops * Fraction(util[uuid]) / 100
            used_v = None if uuid not in fb_mib else int(fb_mib[uuid] * MIB)
            per_gpu[view.name] = (uuid, node, view.used_tflops, used_t, view.used_vram, used_v)
    labels = {f"{(p.get('metadata') or {}).get('namespace')}/{(p.get('metadata') or {}).get('name')}":
              str(((p.get("metadata") or {}).get("labels") or {}).get(WORKLOAD_LABEL) or "")
              for p in pods}

    def total(keyed: dict[tuple[str, ...], list[tuple[Fraction, Fraction | None, int, int | None]]],
              names: tuple[str, ...]) -> list[dict[str, Any]]:
        rows = []
        for key, parts in sorted(keyed.items()):
            used_t = None if any(p[1] is None for p in parts) else sum((p[1] or Fraction(0) for p in parts),
                                                                        Fraction(0))
            used_v = None if any(p[3] is None for p in parts) else sum(p[3] or 0 for p in parts)
            rows.append(_row(dict(zip(names, key, strict=True)), sum((p[0] for p in parts), Fraction(0)),
                             used_t, sum(p[2] for p in parts), used_v))
        return rows

    gpus: dict[tuple[str, ...], list[Any]] = {}
    nodes: dict[tuple[str, ...], list[Any]] = {}
    pools: dict[tuple[str, ...], list[Any]] = {}
    for name, (uuid, node, at, ut, av, uv) in per_gpu.items():
        gpus[(node, uuid)] = [(at, ut, av, uv)]
        nodes.setdefault((node,), []).append((at, ut, av, uv))
        pools.setdefault((views[name].pool or "-",), []).append((at, ut, av, uv))
    workloads: dict[tuple[str, ...], list[Any]] = {}
    for allocation in state.allocations():
        if state.bound_allocation(allocation.uid) is not allocation:
            continue
        namespace = allocation.pod_key.partition("/")[0]
        key = (namespace, labels.get(allocation.pod_key) or allocation.pod_key.partition("/")[2])
        for gpu in allocation.gpu_ids:
            if gpu not in per_gpu:
                continue
            uuid, _, gpu_t, used_t, gpu_v, used_v = per_gpu[gpu]
            mine_t = allocation.request.tflops_on(views[gpu].capacity_tflops)
            mine_v = allocation.request.vram_on(views[gpu].capacity_vram)
            share_t = mine_t / gpu_t if gpu_t else Fraction(0)
            share_v = Fraction(mine_v, gpu_v) if gpu_v else Fraction(0)
            workloads.setdefault(key, []).append((
                mine_t, None if used_t is None else used_t * share_t, mine_v,
                None if used_v is None else int(used_v * share_v)))
    return {"pools": total(pools, ("pool",)), "nodes": total(nodes, ("node",)),
            "gpus": total(gpus, ("node", "UUID")), "workloads": total(workloads, ("namespace", "workload"))}


def render_usage(usage: Mapping[str, Any]) -> str:
    lines = ["", "Allocated vs used (used from dcgm-exporter; a shared GPU's use split by allocation share, "
             "an estimate):"]
    for section, names in (("pools", ("pool",)), ("nodes", ("node",)), ("gpus", ("node", "UUID")),
                           ("workloads", ("namespace", "workload"))):
        for row in usage[section]:
            what = "/".join(str(row[n]) for n in names)
            t, v = row["tflops"], row["vram"]
            lines.append(f"  {section[:-1]:<8} {what}: TFLOPS {t['allocated']} allocated, "
                         f"{t['used'] if t['used'] is not None else '?'} used; VRAM {v['allocated']} "
                         f"allocated, {v['used'] if v['used'] is not None else '?'} used")
    return "\n".join(lines) + "\n"
