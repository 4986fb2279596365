"""The pure pod mutation of the admission webhook (DESIGN §7).

``mutate`` turns an opted-in pod into its canonical form and returns the mutated pod with the RFC 6902
patch from the original, or a denial whose message names the offending key and value. It performs no I/O:
pools, profiles, templates and owners come from a ``ClusterView``.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from extender.common.contract import (
    AUTOSCALE,
    AUTOSCALE_TARGET,
    BIND_TIME_ANNOTATIONS,
    COMPONENT_LABEL,
    COMPONENT_WORKER,
    ENABLED_LABEL,
    GPU_POOL,
    INDEX_RESOURCE_PREFIX,
    INJECT_CONTAINER,
    NATIVE_GPU_RESOURCES,
    POOL_LABEL,
    QOS,
    USED_BY_TAINT_KEY,
    USED_BY_TAINT_VALUE,
    WORKLOAD_LABEL,
    WORKLOAD_PROFILE,
    AutoscaleTarget,
    ContractError,
    GPURequest,
    PoolDefaults,
    QoS,
    RequestContext,
    decode_index,
    index_resource,
    native_gpu_count,
    parse_request,
    render_annotations,
)
from extender.common.gang import desired_members, gang_settings, stamps
from extender.common.pods import as_map
from extender.common.profiles import ProfileError, profile_annotations
from extender.kube.selectors import selects
from webhook.karpenter import add_do_not_disrupt
from webhook.patch import PatchOp, diff
from webhook.priority import PriorityPolicy
from webhook.quota_defaults import quota_defaults
from webhook.view import ClusterView, KubeObject, name_of
from webhook.workload import controller_ref, label_value, workload_name

TOLERATION_EFFECT = "PreferNoSchedule"
USED_BY_TOLERATION: dict[str, str] = {
    "key": USED_BY_TAINT_KEY,
    "operator": "Equal",
    "value": USED_BY_TAINT_VALUE,
    "effect": TOLERATION_EFFECT,
}
PRIORITY_CLASSES = {QoS.HIGH: "tensor-fusion-high", QoS.CRITICAL: "tensor-fusion-critical"}
EVERYWHERE = PriorityPolicy()  # the offline mutate's: every namespace (serve passes its flags')

# Denial reasons that are rules rather than annotation keys.
REASON_POD_SHAPE = "pod-shape"


@dataclass(frozen=True)
class Denial:
    message: str
    reason: str  # the annotation key (or rule) at fault, a low-cardinality metric label


@dataclass(frozen=True)
class MutationResult:
    pod: KubeObject  # the mutated pod; the original when skipped or denied
    patch: list[PatchOp] = field(default_factory=list)
    denial: Denial | None = None
    skipped: bool = False  # not opted in: passed untouched
    request: GPURequest | None = None
    # positions in spec.containers of the containers that carry the pod index (see ``webhook.memo``)
    gpu_positions: tuple[int, ...] = ()

    @property
    def allowed(self) -> bool:
        return self.denial is None


def is_opted_in(pod: Mapping[str, Any]) -> bool:
    labels = (pod.get("metadata") or {}).get("labels") or {}
    # a dict is the usual case: checked first, as the Mapping check is an ABC lookup
    return (type(labels) is dict or isinstance(labels, Mapping)) and labels.get(ENABLED_LABEL) == "true"


def mutate(pod: KubeObject, view: ClusterView, *, scheduler_name: str, index: int,
           namespace: str | None = None, do_not_disrupt: bool = False,
           priority: PriorityPolicy = EVERYWHERE) -> MutationResult:
    """Mutate ``pod`` (an API JSON dict, left unchanged). ``index`` is used only when the pod has none yet;
    ``namespace`` defaults to the pod's own, then ``default``. ``do_not_disrupt`` adds
    ``karpenter.sh/do-not-disrupt: "true"`` unless the pod sets it (see ``webhook.karpenter``).
    ``priority`` says where the high and critical priority classes are granted (``webhook.priority``).
    """
    if not is_opted_in(pod):
        return MutationResult(pod=pod, skipped=True)
    shape_problem = _shape_problem(pod)
    if shape_problem:
        return MutationResult(pod=pod, denial=Denial(shape_problem, REASON_POD_SHAPE))
    forged = preset_allocation(pod, scheduler_name)
    if forged is not None:
        return MutationResult(pod=pod, denial=forged)
    namespace = namespace or str(pod["metadata"].get("namespace") or "") or "default"
    try:
        mutated, request, positions = _mutated(pod, view, namespace, scheduler_name, index, priority)
        if do_not_disrupt:
            add_do_not_disrupt(mutated["metadata"]["annotations"])
    except ContractError as exc:
        return MutationResult(pod=pod, denial=Denial(str(exc), exc.key))
    return MutationResult(pod=mutated, patch=diff(pod, mutated), request=request, gpu_positions=positions)


def preset_allocation(pod: KubeObject, scheduler_name: str) -> Denial | None:
    """Only the GPU scheduler writes allocations: a pod must not arrive with what its bind writes (the
    allocation record, the pod index) nor with ``spec.nodeName``, which would skip the scheduler."""
    annotations = pod["metadata"].get("annotations") or {}
    for key in BIND_TIME_ANNOTATIONS:
        if key in annotations:
            value = str(annotations[key])
            shown = value if len(value) <= 100 else value[:100] + "..."
            return Denial(f'{key}="{shown}": written by {scheduler_name} when it binds the pod; '
                          f"a pod may not set it (remove the annotation)", key)
    node = pod["spec"].get("nodeName")
    if node:
        shown = str(node)[:100]
        return Denial(f'spec.nodeName="{shown}": a GPU pod is placed by {scheduler_name}, which chooses the '
                      f"node and its GPUs; remove spec.nodeName (use a nodeSelector to pin a node)",
                      "spec.nodeName")
    return None


def _shape_problem(pod: KubeObject) -> str | None:
    if not isinstance(pod.get("metadata"), dict):
        return "pod has no metadata"
    for section in ("annotations", "labels"):
        values = pod["metadata"].get(section)
        if values is not None and not isinstance(values, dict):
            return f"pod metadata.{section} must be a map"
    spec = pod.get("spec")
    if not isinstance(spec, dict):
        return "pod has no spec"
    containers = spec.get("containers")
    if not isinstance(containers, list) or not containers or not all(
        isinstance(c, dict) and isinstance(c.get("name"), str) for c in containers
    ):
        return "pod spec.containers must be a non-empty list of named containers"
    for c in containers:
        resources = c.get("resources")
        if resources is not None and not isinstance(resources, dict):
            return f"container {c['name']}: resources must be a map"
        for part in ("limits", "requests"):
            if resources and resources.get(part) is not None and not isinstance(resources[part], dict):
                return f"container {c['name']}: resources.{part} must be a map"
    tolerations = spec.get("tolerations")
    if tolerations is not None and not isinstance(tolerations, list):
        return "pod spec.tolerations must be a list"
    return None


def _mutated(pod: KubeObject, view: ClusterView, namespace: str, scheduler_name: str,
             index: int, priority: PriorityPolicy) -> tuple[KubeObject, GPURequest, tuple[int, ...]]:
    new = json.loads(json.dumps(pod))  # a deep copy; several times faster than copy.deepcopy for JSON
    metadata = new["metadata"]
    spec = new["spec"]
    annotations: dict[str, Any] = dict(metadata.get("annotations") or {})
    labels: dict[str, Any] = dict(metadata.get("labels") or {})
    containers: list[dict[str, Any]] = spec["containers"]

    gpu_containers = _gpu_containers(containers, annotations)
    positions = tuple(i for i, c in enumerate(containers) if any(c is g for g in gpu_containers))
    native = native_gpu_count(_limits(c) for c in gpu_containers)

    inputs = dict(annotations)
    if GPU_POOL not in inputs and isinstance(labels.get(POOL_LABEL), str):
        inputs[GPU_POOL] = labels[POOL_LABEL]
    profile_values, profile_source = _profile(inputs, namespace, view)
    given = {**profile_values, **inputs}
    defaults, defaults_source = quota_defaults(view.quotas(namespace), given, native_gpus=bool(native))
    if defaults:  # the lowest layer, below the profile (named as the source of what it gives)
        profile_values = {**defaults, **profile_values}
        profile_source = " over ".join(s for s in (profile_source, defaults_source) if s)
    default_pool = view.default_pool()
    context = RequestContext(
        profile_annotations=profile_values,
        profile_source=profile_source,
        pool_lookup=lambda name: _pool_defaults(view.pool(name)),
        default_pool=name_of(default_pool) if default_pool else None,
        native_gpu_count=native,
    )
    request = parse_request(inputs, context)

    workload = workload_name(pod, namespace, view)
    labels[COMPONENT_LABEL] = COMPONENT_WORKER
    labels[POOL_LABEL] = label_value(request.pool)
    labels[WORKLOAD_LABEL] = label_value(workload)
    annotations.update(_gang_stamps(pod, annotations, view, namespace, workload))
    if AUTOSCALE not in inputs and AUTOSCALE not in profile_values:
        request = _template_autoscale(request, view, labels, explicit_target=AUTOSCALE_TARGET in inputs
                                      or AUTOSCALE_TARGET in profile_values)

    annotations.update(render_annotations(request))
    metadata["annotations"] = annotations
    metadata["labels"] = labels
    spec["schedulerName"] = scheduler_name
    set_index(gpu_containers, index)
    tolerations = list(spec.get("tolerations") or [])
    if not any(_is_used_by_toleration(t) for t in tolerations):
        spec["tolerations"] = [*tolerations, dict(USED_BY_TOLERATION)]
    priority_class = PRIORITY_CLASSES.get(request.qos)
    if priority_class and not priority.grants(namespace, request.pool):
        if QOS in inputs or QOS in profile_values:  # asked for: a clear no rather than a silent downgrade
            raise ContractError(QOS, request.qos.value,
                                f"the priority class {priority_class} is granted only in {priority.where()}; "
                                f"namespace {namespace}, pool {request.pool} is not listed (ask your "
                                "administrator, or use qos medium or low)",
                                profile_source if QOS not in inputs else None)
        priority_class = None  # high by derivation or by the pool's default: the QoS, not the class
    if priority_class and not spec.get("priorityClassName"):
        spec["priorityClassName"] = priority_class
        # The Priority admission plugin resolves the class into these; stale values would conflict.
        spec.pop("priority", None)
        spec.pop("preemptionPolicy", None)
    return new, request, positions


def _gang_stamps(pod: KubeObject, annotations: Mapping[str, Any], view: ClusterView, namespace: str,
                 workload: str) -> dict[str, str]:
    """The gang annotations (``extender.common.gang``) for a pod in a gang; nothing for the others."""
    profile_name = str(annotations.get(WORKLOAD_PROFILE) or "").strip()
    profile = view.profile(namespace, profile_name) if profile_name else None
    profile_spec = (profile or {}).get("spec") or {}
    settings = gang_settings(annotations, profile_spec, f"WorkloadProfile {namespace}/{profile_name}")
    if settings is None:
        return {}
    ref = controller_ref(pod)
    owner = view.owner(namespace, str(ref.get("kind") or ""), str(ref.get("name") or "")) if ref else None
    return stamps(settings, desired_members(annotations, profile_spec, owner), f"{namespace}/{workload}")


def _limits(container: Mapping[str, Any]) -> Mapping[str, Any]:
    return (container.get("resources") or {}).get("limits") or {}


def _has_gpu_limit(container: Mapping[str, Any]) -> bool:
    limits = _limits(container)
    return any(r in limits for r in NATIVE_GPU_RESOURCES) or any(
        str(r).startswith(INDEX_RESOURCE_PREFIX) for r in limits
    )


def _gpu_containers(containers: list[dict[str, Any]], annotations: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The containers that get the GPU: named by inject-container, else those with GPU limits (native or
    an index set by an earlier mutation), else the only container."""
    names = [c["name"] for c in containers]
    chosen = annotations.get(INJECT_CONTAINER)
    if chosen is not None:
        wanted = [n.strip() for n in str(chosen).split(",") if n.strip()]
        unknown = [n for n in wanted if n not in names]
        if not wanted or unknown:
            raise ContractError(INJECT_CONTAINER, chosen,
                                f"no container named {', '.join(unknown) or '(empty)'}; "
                                f"the pod's containers are {', '.join(names)}")
        return [c for c in containers if c["name"] in wanted]
    with_gpu = [c for c in containers if _has_gpu_limit(c)]
    if with_gpu:
        return with_gpu
    if len(containers) == 1:
        return containers
    raise ContractError(
        INJECT_CONTAINER, "",
        f"the pod has {len(containers)} containers ({', '.join(names)}) and none has a GPU limit; "
        f"name the GPU container in {INJECT_CONTAINER}",
    )


def _profile(annotations: Mapping[str, Any], namespace: str,
             view: ClusterView) -> tuple[dict[str, str], str | None]:
    raw = annotations.get(WORKLOAD_PROFILE)
    if not isinstance(raw, str) or not raw.strip():
        return {}, None
    name = raw.strip()
    profile = view.profile(namespace, name)
    if profile is None:
        raise ContractError(WORKLOAD_PROFILE, raw, f"no such WorkloadProfile in namespace {namespace}")
    try:
        values = profile_annotations(profile.get("spec") or {})
    except ProfileError as exc:
        raise ContractError(WORKLOAD_PROFILE, raw, f"WorkloadProfile {namespace}/{name} {exc}") from None
    return values, f"WorkloadProfile {namespace}/{name}"


def _pool_defaults(pool: KubeObject | None) -> PoolDefaults | None:
    if pool is None:
        return None
    raw = as_map(as_map(pool.get("spec")).get("qosConfig")).get("defaultQoS")
    # a free-form field (the CRD keeps what a user writes): anything but one of the names is no default
    default_qos = QoS(raw) if isinstance(raw, str) and raw in {q.value for q in QoS} else None
    return PoolDefaults(name=name_of(pool), default_qos=default_qos)


def _template_autoscale(request: GPURequest, view: ClusterView, labels: Mapping[str, Any],
                        *, explicit_target: bool) -> GPURequest:
    """Autoscaling from the first matching, enabled vertical scaling rule of the pool's template."""
    pool = view.pool(request.pool)
    template_name = as_map(as_map(pool).get("spec")).get("schedulingConfigTemplate")
    template = view.template(template_name) if isinstance(template_name, str) and template_name else None
    if template is None:
        return request
    rules = as_map(template.get("spec")).get("verticalScalingRules")
    rules = rules if isinstance(rules, list) else []  # a wrong type: no rule (the extender names it)
    string_labels = {str(k): str(v) for k, v in labels.items()}
    for position, rule in enumerate(rules):
        if not isinstance(rule, dict):
            continue
        auto = as_map(as_map(rule.get("autoScaling")).get("autoSetResources"))
        # a malformed rule selects nothing
        if not selects(rule.get("selector"), string_labels) or auto.get("enable") is not True:
            continue
        target = request.autoscale_target
        raw_target = auto.get("targetResource")
        if raw_target and not explicit_target:
            try:
                target = AutoscaleTarget(raw_target)
            except (ValueError, TypeError) as exc:
                rule_name = rule.get("name") or f"#{position}"
                allowed = ", ".join(t.value for t in AutoscaleTarget)
                raise ContractError(AUTOSCALE_TARGET, raw_target, f"unknown value; allowed: {allowed}",
                                    f"SchedulingConfigTemplate {name_of(template)} rule {rule_name}") from exc
        return request.model_copy(update={"autoscale": True, "autoscale_target": target})
    return request


def set_index(containers: list[dict[str, Any]], index: int) -> None:
    """Give ``containers`` (the pod's GPU containers) the pod index: the one they already carry, else
    ``index``; native GPU resources and other index resources are dropped."""
    existing = next((i for c in containers if (i := decode_index(_limits(c))) is not None), None)
    resource, quantity = index_resource(existing or index)
    for container in containers:
        resources = container.setdefault("resources", {})
        for part in ("limits", "requests"):
            values = {
                name: value for name, value in (resources.get(part) or {}).items()
                if name not in NATIVE_GPU_RESOURCES
                and not (str(name).startswith(INDEX_RESOURCE_PREFIX) and name != resource)
            }
            if values.get(resource) != str(quantity):
                values[resource] = str(quantity)
            resources[part] = values


def _is_used_by_toleration(toleration: Any) -> bool:
    if not isinstance(toleration, dict) or toleration.get("key") != USED_BY_TAINT_KEY:
        return False
    operator = toleration.get("operator") or "Equal"
    effect = toleration.get("effect") or ""
    value_ok = operator == "Exists" or toleration.get("value") == USED_BY_TAINT_VALUE
    return value_ok and effect in ("", TOLERATION_EFFECT)
