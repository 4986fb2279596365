"""The workload autoscaler's reconcile: workloads from the pods cache, TensorFusionWorkloads kept,
recommendations applied through the ledger's resize verb. See the package docstring."""

from __future__ import annotations

import asyncio
import datetime as dt
import logging
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from fractions import Fraction
from typing import Any, Protocol
from zoneinfo import ZoneInfo

from extender.autoscaling.config import DEFAULT_HISTORY_PERIOD_NS, AutoScalingConfig, Resources, parse_config
from extender.autoscaling.recommend import CronState, recommend
from extender.autoscaling.usage import UsageSource, WorkloadUsage
from extender.common.contract import WORKLOAD_LABEL, ContractError, GPURequest
from extender.common.pods import TERMINAL_PHASES, pod_uid
from extender.common.quantity import Format, format_quantity
from extender.common.timefmt import parse_time
from extender.controllers.autoscale.config import AutoscaleOptions
from extender.controllers.autoscale.external import ask
from extender.controllers.autoscale.prometheus import PrometheusUsage, UsageUnavailable
from extender.controllers.autoscale.samples import load_samples
from extender.kube.client import error_message
from extender.kube.resources import TENSOR_FUSION_WORKLOADS
from extender.scheduling.ledger import Allocation, Resized
from extender.server.resize import Resizer, Target

log = logging.getLogger(__name__)

CONDITION = "ResourceUpdate"
INVALID_CONFIG = "InvalidAutoScalingConfig"
USAGE_UNAVAILABLE = "UsageUnavailable"
QUOTA_LIMITED = "QuotaLimited"  # a resize cut by the namespace's GPUResourceQuota


class WorkloadApi(Protocol):
    async def get(self, namespace: str, name: str) -> dict[str, Any] | None: ...

    async def create(self, namespace: str, body: dict[str, Any]) -> dict[str, Any]: ...

    async def patch_status(self, namespace: str, name: str, status: dict[str, Any]) -> None: ...

    async def profile(self, namespace: str, name: str) -> dict[str, Any] | None: ...

    async def secret(self, namespace: str, name: str) -> dict[str, Any] | None: ...


class PodSource(Protocol):
    def list(self) -> list[dict[str, Any]]: ...


class StateLike(Protocol):
    def request_of(self, pod: Mapping[str, Any]) -> GPURequest: ...

    def bound_allocation(self, uid: str) -> Allocation | None: ...


@dataclass
class _Memory:
    usage: WorkloadUsage
    read_until_ns: int
    recommendation: Resources | None = None
    cron: CronState | None = None
    reason: str = ""
    message: str = ""
    seeded: bool = False
    history_ns: int = 0
    evaluated_ns: int = 0  # when the workload was last evaluated (autoSetResources.interval paces it)
    # worker uid -> (target, what it held) after a resize limited by room: not asked again until either moves
    limited: dict[str, tuple[Target, Fraction, int]] = field(default_factory=dict)
    quota_cut: dict[str, str] = field(default_factory=dict)  # worker uid -> the quota's cut, while it cuts


def _q_tflops(value: Fraction) -> str:
    return format_quantity(value)


def _q_vram(value: Fraction | int) -> str:
    return format_quantity(Fraction(value), Format.BINARY_SI)


def resources_json(r: Resources) -> dict[str, Any]:
    return {"requests": {"tflops": _q_tflops(r.req_tflops), "vram": _q_vram(r.req_vram)},
            "limits": {"tflops": _q_tflops(r.lim_tflops), "vram": _q_vram(r.lim_vram)}}


def original_of(request: GPURequest) -> Resources:
    """What the pod's request annotations asked for (the workload's spec.resources)."""
    return Resources(request.tflops_request or Fraction(0), Fraction(request.vram_request),
                     request.tflops_limit or request.tflops_request or Fraction(0),
                     Fraction(request.vram_limit or request.vram_request))


def spec_from_pod(request: GPURequest, profile: Mapping[str, Any] | None) -> dict[str, Any]:
    """A new TensorFusionWorkload's spec: the pod's request, QoS and pool, the WorkloadProfile's
    autoScalingConfig, and the pod's ``autoscale`` / ``autoscale-target`` annotations over it."""
    autoscaling = dict(((profile or {}).get("spec") or {}).get("autoScalingConfig") or {})
    if request.autoscale:
        auto_set = dict(autoscaling.get("autoSetResources") or {})
        auto_set["enable"] = True
        auto_set["targetResource"] = request.autoscale_target.value
        autoscaling["autoSetResources"] = auto_set
    spec: dict[str, Any] = {"poolName": request.pool, "qos": request.qos.value, "gpuCount": request.gpu_count,
                            "resources": resources_json(original_of(request))}
    if autoscaling:
        spec["autoScalingConfig"] = autoscaling
    return spec


def _creation_ns(obj: Mapping[str, Any] | None) -> int | None:
    when = parse_time(((obj or {}).get("metadata") or {}).get("creationTimestamp"))
    return None if when is None else int(when.timestamp()) * 10**9


class WorkloadAutoscaler:
    """The workloads' recommendations and resizes, one pass over every workload per ``reconcile``; what it
    remembers between passes (usage read, recommendation, active cron rule) is per workload."""

    def __init__(self, state: StateLike, pods: PodSource, api: WorkloadApi, resizer: Resizer,
                 options: AutoscaleOptions, source: UsageSource | None = None) -> None:
        self.state = state
        self.pods = pods
        self.api = api
        self.resizer = resizer
        self.options = options
        if source is None and options.prometheus is not None:
            source = PrometheusUsage(options.prometheus)
        self.source = source
        self.zone = ZoneInfo(options.cron_zone)
        self._memory: dict[tuple[str, str], _Memory] = {}
        self.source_problems: list[str] = []

    def _source(self) -> UsageSource | None:
        if self.options.usage_file:
            source, problems = load_samples(self.options.usage_file)
            if problems and problems != self.source_problems:
                log.warning("usage samples not read",
                            extra={"problems": problems[:5], "count": len(problems)})
            self.source_problems = problems
            return source
        return self.source

    def workloads(self) -> dict[tuple[str, str], list[dict[str, Any]]]:
        groups: dict[tuple[str, str], list[dict[str, Any]]] = {}
        for pod in self.pods.list():
            meta = pod.get("metadata") or {}
            name = (meta.get("labels") or {}).get(WORKLOAD_LABEL)
            if not name or meta.get("deletionTimestamp") or not (pod.get("spec") or {}).get("nodeName"):
                continue
            if str((pod.get("status") or {}).get("phase") or "") in TERMINAL_PHASES:
                continue
            if self.state.bound_allocation(pod_uid(pod)) is None:
                continue
            groups.setdefault((str(meta.get("namespace") or "default"), str(name)), []).append(pod)
        return {key: sorted(pods, key=lambda p: str(p["metadata"].get("name")))
                for key, pods in groups.items()}

    async def reconcile(self, now: dt.datetime) -> None:
        source = self._source()
        groups = self.workloads()
        for key in [k for k in self._memory if k not in groups]:
            del self._memory[key]
        for (namespace, name), pods in sorted(groups.items()):
            try:
                await self.workload(namespace, name, pods, source, now)
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                log.warning("workload not evaluated", extra={"workload": f"{namespace}/{name}",
                                                             "error": error_message(exc)})

    async def workload(self, namespace: str, name: str, pods: Sequence[dict[str, Any]],
                       source: UsageSource | None, now: dt.datetime) -> None:
        try:
            request = self.state.request_of(pods[0])
        except ContractError:
            return
        tfw = await self.api.get(namespace, name)
        if tfw is None:
            profile = (await self.api.profile(namespace, request.workload_profile)
                       if request.workload_profile else None)
            body = {"apiVersion": TENSOR_FUSION_WORKLOADS.api_version, "kind": TENSOR_FUSION_WORKLOADS.kind,
                    "metadata": {"name": name, "namespace": namespace},
                    "spec": spec_from_pod(request, profile)}
            tfw = await self.api.create(namespace, body)
            log.info("workload created", extra={"workload": f"{namespace}/{name}"})
        spec = tfw.get("spec") or {}
        config = parse_config(spec.get("autoScalingConfig"))
        problems: list[str] = []
        original = Resources.from_json(spec.get("resources"), "spec.resources", problems)
        if original.is_zero():
            original = original_of(request)
        now_ns = int(now.timestamp() * 10**9)
        memory = self._remember(namespace, name, tfw, config, now_ns)
        every = config.auto_set.interval_ns if config.auto_set is not None else 0
        if every and memory.evaluated_ns and now_ns - memory.evaluated_ns < every:
            return  # not due: autoSetResources.interval, as TensorFusion evaluates each workload on its own
        memory.evaluated_ns = now_ns
        status: dict[str, Any] = {"workerCount": len(pods)}
        unavailable = ""
        if config.configured() and source is not None:
            try:
                samples = await source.workload_usage(namespace, name, memory.read_until_ns, now_ns)
            except UsageUnavailable as exc:
                unavailable = str(exc)  # nothing read, nothing recommended or resized this pass
                samples = []
                log.warning("usage not read", extra={"workload": f"{namespace}/{name}", "error": unavailable})
            else:
                memory.read_until_ns = now_ns
            for sample in samples:
                memory.usage.add(sample)
        memory.usage.forget_workers(str(p["metadata"]["name"]) for p in pods)
        if unavailable:
            if memory.recommendation is not None:
                status["recommendation"] = resources_json(memory.recommendation)
            status["conditions"] = [self._condition(tfw, [], memory, unavailable)]
            await self._write_status(namespace, name, status)
            return
        if config.configured():
            created = _creation_ns(tfw) or min((_creation_ns(pod) or now_ns) for pod in pods)
            current = memory.recommendation or original
            qos = str(spec.get("qos") or "")  # TensorFusion reads an empty QoS as the lower bound, like low
            answer = None
            if config.external is not None and now_ns - created >= config.external.initial_delay_ns:
                answer, error = await ask(config.external, namespace, name, resources_json(current),
                                          self.api.secret)
                if error:
                    problems.append(f"spec.autoScalingConfig.externalScaler.{error}")
            tick = recommend(config, memory.usage, original, current, qos, now_ns - created, now, self.zone,
                             memory.cron, answer)
            problems += tick.problems
            memory.cron = tick.cron_state
            if tick.reason:
                memory.reason, memory.message = tick.reason, tick.message
            if tick.recommendation is not None:
                memory.recommendation = tick.recommendation
            if memory.recommendation is not None and config.auto_set is not None and config.auto_set.enable:
                await self._apply(pods, memory, config)
            if memory.recommendation is not None:
                status["recommendation"] = resources_json(memory.recommendation)
            active = next((r.raw for r in config.cron_rules
                           if memory.cron and r.name == memory.cron.name), None)
            status["activeCronScalingRule"] = active
        status["conditions"] = [self._condition(tfw, problems, memory)]
        await self._write_status(namespace, name, status)

    async def _write_status(self, namespace: str, name: str, status: dict[str, Any]) -> None:
        try:
            await self.api.patch_status(namespace, name, status)
        except Exception as exc:
            log.warning("workload status not written", extra={"workload": f"{namespace}/{name}",
                                                              "error": error_message(exc)})

    def _remember(self, namespace: str, name: str, tfw: Mapping[str, Any], config: AutoScalingConfig,
                  now_ns: int) -> _Memory:
        auto_set = config.auto_set
        history = auto_set.history_period_ns if auto_set else DEFAULT_HISTORY_PERIOD_NS
        read = auto_set.read_history_ns if auto_set else DEFAULT_HISTORY_PERIOD_NS
        memory = self._memory.get((namespace, name))
        if memory is None or memory.history_ns != history:
            memory = _Memory(WorkloadUsage(history // 2), now_ns - read, history_ns=history)
            self._memory[(namespace, name)] = memory
            # a restart: the recommendation and cron rule in status stand until the next one
            st = tfw.get("status") or {}
            if isinstance(st.get("recommendation"), dict):
                seeded = Resources.from_json(st["recommendation"], "status.recommendation", [])
                memory.recommendation = None if seeded.is_zero() else seeded
            rule = st.get("activeCronScalingRule")
            if isinstance(rule, dict) and rule.get("name"):
                memory.cron = CronState(str(rule["name"]),
                                        Resources.from_json(rule.get("desiredResources"), "", []))
        return memory

    async def _apply(self, pods: Sequence[dict[str, Any]], memory: _Memory,
                     config: AutoScalingConfig) -> None:
        auto_set = config.auto_set
        assert auto_set is not None and memory.recommendation is not None
        rec = memory.recommendation
        # never below the latest VRAM peak x (1 + margin)
        floor = math.ceil(memory.usage.latest_vram_peak() * (1 + auto_set.percentiles.margin))
        vram = max(int(rec.req_vram), floor)
        for pod in pods:
            allocation = self.state.bound_allocation(pod_uid(pod))
            if allocation is None:
                continue
            held = allocation.request
            target = Target(
                tflops_request=rec.req_tflops if auto_set.scales("compute") else None,
                tflops_limit=rec.lim_tflops if auto_set.scales("compute") else None,
                vram_request=vram if auto_set.scales("vram") else None,
                vram_limit=max(int(rec.lim_vram), vram) if auto_set.scales("vram") else None)
            if ((target.tflops_request is None or target.tflops_request == held.tflops_request)
                    and (target.vram_request is None or target.vram_request == held.vram_request)):
                continue
            uid = pod_uid(pod)
            holding = (held.tflops_request or Fraction(0), held.vram_request)
            if memory.limited.get(uid) == (target, *holding):
                continue  # the room was not there last pass for this same ask: no event every pass
            result = await self.resizer.resize(pod, target)
            if result.outcome in (Resized.CLAMPED, Resized.REFUSED):
                memory.limited[uid] = (target, result.tflops, result.vram)
            else:
                memory.limited.pop(uid, None)
            if result.quota:
                memory.quota_cut[uid] = f"{allocation.pod_key}: {result.quota}"
            elif not result.error:
                memory.quota_cut.pop(uid, None)
            log.info("worker resize", extra={"pod": allocation.pod_key, "outcome": result.outcome.value,
                                             "detail": result.message})

    @staticmethod
    def _condition(tfw: Mapping[str, Any], problems: list[str], memory: _Memory,
                   unavailable: str = "") -> dict[str, Any]:
        if unavailable:
            status, reason, message = "False", USAGE_UNAVAILABLE, f"usage not read, no resize: {unavailable}"
        elif problems:
            status, reason = "False", INVALID_CONFIG
            more = f" (and {len(problems) - 5} more)" if len(problems) > 5 else ""
            message = "; ".join(problems[:5]) + more
        elif memory.quota_cut:
            cuts = sorted(memory.quota_cut.values())
            status, reason = "True", QUOTA_LIMITED
            message = ("resized within the namespace's GPU quota, short of the recommendation: "
                       + "; ".join(cuts))
        else:
            status, reason, message = "True", memory.reason or "Pending", memory.message or \
                "no recommendation yet"
        previous = next((c for c in ((tfw.get("status") or {}).get("conditions") or [])
                         if isinstance(c, dict) and c.get("type") == CONDITION), None)
        changed = previous is None or (previous.get("status"), previous.get("reason")) != (status, reason)
        stamp = dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ") if changed or previous is None \
            else previous.get("lastTransitionTime")
        return {"type": CONDITION, "status": status, "reason": reason, "message": message[:1024],
                "lastTransitionTime": stamp,
                "observedGeneration": (tfw.get("metadata") or {}).get("generation", 0)}
