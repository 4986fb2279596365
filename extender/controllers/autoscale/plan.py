"""``tf-extender plan --autoscale``: each workload's recommendation from a snapshot and usage samples, and
what a resize of each worker would do on the snapshot's ledger (a copy; nothing is written).

Workloads are the snapshot's bound GPU pods grouped by their ``tensor-fusion.ai/workload`` label. A
TensorFusionWorkload in the snapshot supplies the spec (original resources, ``autoScalingConfig``) and the
status (the current recommendation, the active cron rule); without one, the spec is what the extender would
create from the first pod and the WorkloadProfile it names.
"""

from __future__ import annotations

import datetime as dt
import math
from collections.abc import Sequence
from fractions import Fraction
from typing import Any
from zoneinfo import ZoneInfo

from extender.autoscaling.config import DEFAULT_HISTORY_PERIOD_NS, Resources, parse_config
from extender.autoscaling.recommend import CronState, recommend
from extender.autoscaling.usage import StaticUsageSource, WorkloadUsage
from extender.common.contract import WORKLOAD_LABEL, ContractError
from extender.common.pods import TERMINAL_PHASES, pod_key, pod_uid
from extender.common.timefmt import parse_time
from extender.controllers.autoscale.controller import original_of, resources_json, spec_from_pod
from extender.scheduling.ledger import Resized
from extender.scheduling.state import ClusterState


def _meta(obj: dict[str, Any]) -> dict[str, Any]:
    return obj.get("metadata") or {}


def plan_autoscale(state: ClusterState, objects: Sequence[dict[str, Any]], samples: StaticUsageSource,
                   now: dt.datetime, zone: ZoneInfo) -> list[dict[str, Any]]:
    by_kind: dict[tuple[str, str, str], dict[str, Any]] = {}
    for obj in objects:
        if obj.get("kind") in ("TensorFusionWorkload", "WorkloadProfile"):
            by_kind[(str(obj["kind"]), str(_meta(obj).get("namespace") or "default"),
                     str(_meta(obj).get("name")))] = obj
    groups: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for pod in objects:
        if pod.get("kind") != "Pod":
            continue
        name = (_meta(pod).get("labels") or {}).get(WORKLOAD_LABEL)
        if not name or not (pod.get("spec") or {}).get("nodeName") or \
                str((pod.get("status") or {}).get("phase") or "") in TERMINAL_PHASES:
            continue
        if state.bound_allocation(pod_uid(pod)) is None:
            continue
        groups.setdefault((str(_meta(pod).get("namespace") or "default"), str(name)), []).append(pod)
    now_ns = int(now.timestamp()) * 10**9
    out = []
    with state.what_if() as sim:
        for (namespace, name), pods in sorted(groups.items()):
            pods.sort(key=pod_key)
            out.append(_workload(sim, by_kind, namespace, name, pods, samples, now, now_ns, zone))
    return out


def _workload(sim: ClusterState, by_kind: dict[tuple[str, str, str], dict[str, Any]], namespace: str,
              name: str, pods: list[dict[str, Any]], samples: StaticUsageSource, now: dt.datetime,
              now_ns: int, zone: ZoneInfo) -> dict[str, Any]:
    entry: dict[str, Any] = {"action": "autoscale", "namespace": namespace, "workload": name,
                             "workers": len(pods)}
    try:
        request = sim.request_of(pods[0])
    except ContractError as exc:
        entry["error"] = str(exc)
        return entry
    tfw = by_kind.get(("TensorFusionWorkload", namespace, name))
    profile = by_kind.get(("WorkloadProfile", namespace, request.workload_profile or ""))
    spec = (tfw or {}).get("spec") or spec_from_pod(request, profile)
    status = (tfw or {}).get("status") or {}
    config = parse_config(spec.get("autoScalingConfig"))
    problems: list[str] = []
    original = Resources.from_json(spec.get("resources"), "spec.resources", problems)
    if original.is_zero():
        original = original_of(request)
    if not config.configured():
        entry["recommendation"] = None
        entry["reason"] = "NotConfigured"
        return entry
    auto_set = config.auto_set
    history = auto_set.history_period_ns if auto_set else DEFAULT_HISTORY_PERIOD_NS
    read = auto_set.read_history_ns if auto_set else DEFAULT_HISTORY_PERIOD_NS
    usage = WorkloadUsage(history // 2)
    for sample in sorted(samples.samples.get((namespace, name), []), key=lambda s: s.unix_ns):
        if now_ns - read < sample.unix_ns <= now_ns:
            usage.add(sample)
    current = original
    if isinstance(status.get("recommendation"), dict):
        seeded = Resources.from_json(status["recommendation"], "status.recommendation", problems)
        current = original if seeded.is_zero() else seeded
    cron = None
    rule = status.get("activeCronScalingRule")
    if isinstance(rule, dict) and rule.get("name"):
        cron = CronState(str(rule["name"]), Resources.from_json(rule.get("desiredResources"), "", []))
    created = parse_time(_meta(tfw or pods[0]).get("creationTimestamp"))
    age = now_ns - (int(created.timestamp()) * 10**9 if created else now_ns)
    qos = str(spec.get("qos") or "")  # TensorFusion reads an empty QoS as the lower bound, like low
    tick = recommend(config, usage, original, current, qos, age, now, zone, cron)
    rec = tick.recommendation or (current if current != original else None)
    entry.update({"samples": usage.samples, "recommendation": resources_json(rec) if rec else None,
                  "reason": tick.reason, "message": tick.message,
                  "problems": [*problems, *tick.problems][:20]})
    if rec is None or auto_set is None or not auto_set.enable:
        entry["resizes"] = []
        return entry
    floor = math.ceil(usage.latest_vram_peak() * (1 + auto_set.percentiles.margin))
    vram = max(int(rec.req_vram), floor)
    resizes = []
    for pod in pods:
        held = sim.bound_allocation(pod_uid(pod))
        if held is None:
            continue
        tflops = rec.req_tflops if auto_set.scales("compute") else None
        want_vram = vram if auto_set.scales("vram") else None
        old_t = held.request.tflops_request or Fraction(0)
        outcome = sim.resize(pod_uid(pod), tflops, want_vram)
        after = outcome.after.request if outcome.after else held.request
        resizes.append({"pod": pod_key(pod), "outcome": outcome.outcome.value,
                        "tflops": {"from": str(old_t), "to": str(after.tflops_request or 0)},
                        "vram": {"from": held.request.vram_request, "to": after.vram_request},
                        "message": outcome.message,
                        "event": _event(outcome.outcome, old_t, after.tflops_request or Fraction(0),
                                        held.request.vram_request, after.vram_request)})
    entry["resizes"] = resizes
    return entry


def _event(outcome: Resized, old_t: Fraction, new_t: Fraction, old_v: int, new_v: int) -> str | None:
    if outcome is Resized.REFUSED:
        return "ResizeLimited" if new_t == old_t and new_v == old_v else None
    if outcome is Resized.CLAMPED:
        return "ResizeLimited"
    return "ResourceScaledUp" if new_t > old_t or new_v > old_v else "ResourceScaledDown"
