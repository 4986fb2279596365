"""The pod contract of the ``tensor-fusion.ai`` domain (DESIGN §3).

This module owns every key of the pod contract and its parsing (the other
well-known keys are in :mod:`extender.common.labels`). The webhook uses it to
turn a user's pod into one canonical request; the extender uses it to read
that request back. Everything here is pure: no I/O, no clock.

Effective values are layered: pool defaults, then the pod's WorkloadProfile,
then the pod's own annotations (a later layer overrides an earlier one).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from enum import Enum, StrEnum
from fractions import Fraction
from typing import Any, TypeVar

from pydantic import BaseModel, ConfigDict

from extender.common.labels import AMD_GPU, NVIDIA_GPU
from extender.common.labels import DOMAIN as DOMAIN  # the pod contract's domain, read here by its parsers
from extender.common.labels import key as _key
from extender.common.numbers import MAX_DIGITS, NumberError, parse_int
from extender.common.quantity import Format, QuantityError, format_quantity, parse_quantity

# Labels
ENABLED_LABEL = _key("enabled")
COMPONENT_LABEL = _key("component")
WORKLOAD_LABEL = _key("workload")
POOL_LABEL = _key("gpupool")
# the schedulerName the webhook gives GPU pods, and the one the extender serves (TensorFusion's)
DEFAULT_SCHEDULER_NAME = "tensor-fusion-scheduler"
COMPONENT_WORKER = "worker"

# Annotations a user (or a WorkloadProfile) sets
TFLOPS_REQUEST = _key("tflops-request")
TFLOPS_LIMIT = _key("tflops-limit")
VRAM_REQUEST = _key("vram-request")
VRAM_LIMIT = _key("vram-limit")
PERCENT_REQUEST = _key("compute-percent-request")
PERCENT_LIMIT = _key("compute-percent-limit")
GPU_COUNT = _key("gpu-count")
GPU_POOL = _key("gpupool")
GPU_MODEL = _key("gpu-model")
VENDOR = _key("vendor")
GPU_INDICES = _key("gpu-indices")
ISOLATION = _key("isolation")
QOS = _key("qos")
WORKLOAD_PROFILE = _key("workload-profile")
AUTOSCALE = _key("autoscale")
AUTOSCALE_TARGET = _key("autoscale-target")
INJECT_CONTAINER = _key("inject-container")

# GPU topology overrides of one pod (TensorFusion's GPUNetworkTopologyAware plugin; docs/topology.md)
REQUIRE_GPU_TOPOLOGY = _key("require-gpu-topology")  # "true": hard mode, "false": soft mode
GPU_TOPOLOGY_MAX_TIER = _key("gpu-topology-max-tier")  # 0 NVLink group, 1 NUMA node, 2 across NUMA, 3 unknown
GPU_TOPOLOGY_SOURCE = _key("gpu-topology-source")  # auto | numa | vendor
GPU_TOPOLOGY_SOURCES = ("auto", "numa", "vendor")
MAX_TOPOLOGY_TIER = 3

# Annotations written at bind time: the durable allocation record
GPU_IDS = _key("gpu-ids")
POD_INDEX = _key("index")
# written at bind: what the pod was granted on each of its GPUs (see format_allocated); the ledger counts
# this, not the request annotations, which a tenant could change after the bind
ALLOCATED = _key("allocated")
# every annotation only the GPU scheduler's bind may write
BIND_TIME_ANNOTATIONS = (GPU_IDS, POD_INDEX, ALLOCATED)

# Other objects
DEFAULT_POOL_ANNOTATION = _key("is-default-pool")
USED_BY_TAINT_KEY = _key("used-by")
USED_BY_TAINT_VALUE = "tensor-fusion"
POOL_LABEL_ON_GPU = POOL_LABEL

NATIVE_GPU_RESOURCES = (NVIDIA_GPU, AMD_GPU)

MAX_GPU_COUNT = 128
MAX_POD_INDEX = 128
INDEX_RESOURCE_PREFIX = _key("index_")

_E = TypeVar("_E", bound=Enum)

_TFLOPS_KEYS = (TFLOPS_REQUEST, TFLOPS_LIMIT)
_PERCENT_KEYS = (PERCENT_REQUEST, PERCENT_LIMIT)


class Isolation(StrEnum):
    SHARED = "shared"
    SOFT = "soft"
    HARD = "hard"
    PARTITIONED = "partitioned"


class QoS(StrEnum):
    LOW = "low"
    MEDIUM = "medium"
    HIGH = "high"
    CRITICAL = "critical"


class AutoscaleTarget(StrEnum):
    ALL = "all"
    COMPUTE = "compute"
    VRAM = "vram"


_MAX_SHOWN_VALUE = 200


class ContractError(ValueError):
    """A value breaks the pod contract. The message names the key and the value."""

    def __init__(self, key: str, value: object, reason: str, source: str | None = None) -> None:
        self.key = key
        self.value = value
        self.reason = reason
        origin = f" (from {source})" if source else ""
        shown = str(value)
        if len(shown) > _MAX_SHOWN_VALUE:  # a huge value is named, not echoed
            shown = f"{shown[:_MAX_SHOWN_VALUE]}... ({len(shown)} characters)"
        super().__init__(f'{key}="{shown}"{origin}: {reason}')


class GPURequest(BaseModel):
    """The effective, validated GPU request of one pod. Amounts are per GPU."""

    model_config = ConfigDict(frozen=True, arbitrary_types_allowed=True)

    pool: str
    tflops_request: Fraction | None = None
    tflops_limit: Fraction | None = None
    percent_request: Fraction | None = None
    percent_limit: Fraction | None = None
    vram_request: int = 0
    vram_limit: int = 0
    gpu_count: int = 1
    gpu_model: str | None = None
    vendor: str | None = None
    gpu_indices: tuple[int, ...] = ()
    isolation: Isolation = Isolation.SOFT
    qos: QoS = QoS.MEDIUM
    workload_profile: str | None = None
    autoscale: bool = False
    autoscale_target: AutoscaleTarget = AutoscaleTarget.ALL
    # topology overrides; None: the pool's setting
    topology_required: bool | None = None
    topology_max_tier: int | None = None
    topology_source: str | None = None

    @property
    def uses_percent(self) -> bool:
        return self.percent_request is not None

    @property
    def takes_whole_gpu(self) -> bool:
        return self.isolation is Isolation.SHARED

    def tflops_on(self, capacity_tflops: Fraction) -> Fraction:
        """TFLOPS this request takes from a GPU of the given capacity."""
        if self.takes_whole_gpu:
            return capacity_tflops
        if self.percent_request is not None:
            return self.percent_request * capacity_tflops / 100
        return self.tflops_request or Fraction(0)

    def vram_on(self, capacity_vram: int) -> int:
        """Bytes of VRAM this request takes from a GPU of the given capacity."""
        return capacity_vram if self.takes_whole_gpu else self.vram_request

    def describe(self) -> str:
        """Human wording of the per-GPU amount, for messages."""
        if self.takes_whole_gpu:
            amount = "a whole idle GPU"
        else:
            compute = (
                f"{format_quantity(self.percent_request)}% compute"
                if self.percent_request is not None
                else f"{format_tflops(self.tflops_request or Fraction(0))} TFLOPS"
            )
            amount = f"{compute} and {format_bytes(self.vram_request)} VRAM"
        plural = "GPU" if self.gpu_count == 1 else "GPUs"
        return f"{self.gpu_count} {plural} with {amount}"


@dataclass(frozen=True)
class PoolDefaults:
    """What a GPUPool contributes to a request."""

    name: str
    default_qos: QoS | None = None


@dataclass(frozen=True)
class RequestContext:
    """Everything besides the pod's annotations that shapes its request."""

    profile_annotations: Mapping[str, str] = field(default_factory=dict)
    profile_source: str | None = None
    pools: Mapping[str, PoolDefaults] | None = None  # None: pool names are not checked
    # Alternative to ``pools`` for callers that look pools up one at a time (the webhook's caches).
    pool_lookup: Callable[[str], PoolDefaults | None] | None = None
    default_pool: str | None = None
    native_gpu_count: int | None = None


def format_tflops(value: Fraction) -> str:
    return format_quantity(value)


def format_bytes(value: int) -> str:
    return format_quantity(value, Format.BINARY_SI)


def parse_request(annotations: Mapping[str, str], context: RequestContext | None = None) -> GPURequest:
    """Build the effective request from a pod's annotations, raising ``ContractError`` on bad input."""
    context = context or RequestContext()
    values = _Layered(context.profile_annotations, context.profile_source, annotations)

    tflops_request, tflops_limit = _request_and_limit(values, TFLOPS_REQUEST, TFLOPS_LIMIT, _tflops)
    percent_request, percent_limit = _request_and_limit(values, PERCENT_REQUEST, PERCENT_LIMIT, _percent)
    vram_request, vram_limit = _request_and_limit(values, VRAM_REQUEST, VRAM_LIMIT, _bytes)
    if tflops_request is not None and percent_request is not None:
        key = TFLOPS_REQUEST if values.get(TFLOPS_REQUEST) is not None else TFLOPS_LIMIT
        raise values.error(key, "TFLOPS and compute percent cannot be requested together")

    gpu_indices = _gpu_indices(values)
    gpu_count = _gpu_count(values, gpu_indices, context.native_gpu_count)
    has_amount = any(v is not None for v in (tflops_request, percent_request, vram_request))
    isolation = _choice(values, ISOLATION, Isolation, default=None)
    if isolation is None:
        isolation = Isolation.SHARED if context.native_gpu_count and not has_amount else Isolation.SOFT
    if not has_amount and isolation is not Isolation.SHARED:
        raise ContractError(
            TFLOPS_REQUEST,
            "",
            "no TFLOPS, compute percent or VRAM requested; set one, or isolation=shared for whole GPUs",
        )

    pool, pool_defaults = _pool(values, context)
    qos = _choice(values, QOS, QoS, default=None)
    if qos is None:
        requests = (tflops_request, percent_request, vram_request)
        guaranteed = requests == (tflops_limit, percent_limit, vram_limit)
        pool_default = pool_defaults.default_qos if pool_defaults else None
        qos = QoS.HIGH if guaranteed else pool_default or QoS.MEDIUM

    return GPURequest(
        pool=pool,
        tflops_request=tflops_request,
        tflops_limit=tflops_limit,
        percent_request=percent_request,
        percent_limit=percent_limit,
        vram_request=vram_request or 0,
        vram_limit=vram_limit or 0,
        gpu_count=gpu_count,
        gpu_model=_text(values, GPU_MODEL),
        vendor=_text(values, VENDOR),
        gpu_indices=gpu_indices,
        isolation=isolation,
        qos=qos,
        workload_profile=_text(values, WORKLOAD_PROFILE),
        autoscale=_boolean(values, AUTOSCALE),
        autoscale_target=_choice(values, AUTOSCALE_TARGET, AutoscaleTarget, default=AutoscaleTarget.ALL),
        **_topology_overrides(values),
    )


def _topology_overrides(values: _Layered) -> dict[str, Any]:
    out: dict[str, Any] = {}
    required = _raw(values, REQUIRE_GPU_TOPOLOGY)
    if required:
        if required not in ("true", "false"):
            raise values.error(REQUIRE_GPU_TOPOLOGY, 'must be "true" (hard) or "false" (soft)')
        out["topology_required"] = required == "true"
    tier = _raw(values, GPU_TOPOLOGY_MAX_TIER)
    if tier:
        if not (tier.isdigit() and int(tier) <= MAX_TOPOLOGY_TIER):
            raise values.error(GPU_TOPOLOGY_MAX_TIER, "must be a tier 0..3 (0 one NVLink group, "
                               "1 one NUMA node, 2 across NUMA nodes, 3 unknown)")
        out["topology_max_tier"] = int(tier)
    source = _raw(values, GPU_TOPOLOGY_SOURCE)
    if source:
        if source not in GPU_TOPOLOGY_SOURCES:
            allowed = ", ".join(GPU_TOPOLOGY_SOURCES)
            raise values.error(GPU_TOPOLOGY_SOURCE, f"unknown value; allowed: {allowed}")
        out["topology_source"] = source
    return out


def render_annotations(request: GPURequest) -> dict[str, str]:
    """The canonical annotations of a request: every effective value, quantities canonical."""
    out: dict[str, str] = {GPU_POOL: request.pool}
    if request.tflops_request is not None and request.tflops_limit is not None:
        out[TFLOPS_REQUEST] = format_tflops(request.tflops_request)
        out[TFLOPS_LIMIT] = format_tflops(request.tflops_limit)
    if request.percent_request is not None and request.percent_limit is not None:
        out[PERCENT_REQUEST] = format_quantity(request.percent_request)
        out[PERCENT_LIMIT] = format_quantity(request.percent_limit)
    # Always written, even when zero: a VRAM-only request of 0 must still re-parse as a request.
    out[VRAM_REQUEST] = format_bytes(request.vram_request)
    out[VRAM_LIMIT] = format_bytes(request.vram_limit)
    out[GPU_COUNT] = str(request.gpu_count)
    if request.gpu_model:
        out[GPU_MODEL] = request.gpu_model
    if request.vendor:
        out[VENDOR] = request.vendor
    if request.gpu_indices:
        out[GPU_INDICES] = ",".join(str(i) for i in request.gpu_indices)
    out[ISOLATION] = request.isolation.value
    out[QOS] = request.qos.value
    if request.workload_profile:
        out[WORKLOAD_PROFILE] = request.workload_profile
    out[AUTOSCALE] = "true" if request.autoscale else "false"
    out[AUTOSCALE_TARGET] = request.autoscale_target.value
    return out


# Pod index encoding (DESIGN §3): index N in 1..128 is the resource
# ``index_<hex((N-1) div 8)>`` with quantity ``((N-1) mod 8)+1``.


def index_resource(index: int) -> tuple[str, int]:
    if not 1 <= index <= MAX_POD_INDEX:
        raise ValueError(f"pod index {index} is outside 1..{MAX_POD_INDEX}")
    return f"{INDEX_RESOURCE_PREFIX}{(index - 1) // 8:x}", (index - 1) % 8 + 1


def index_resource_names() -> list[str]:
    return [f"{INDEX_RESOURCE_PREFIX}{group:x}" for group in range(MAX_POD_INDEX // 8)]


def decode_index(resources: Mapping[str, object]) -> int | None:
    """The pod index encoded in a container's resource map, if any."""
    for name, raw in resources.items():
        if not name.startswith(INDEX_RESOURCE_PREFIX):
            continue
        try:
            suffix = name[len(INDEX_RESOURCE_PREFIX):]
            if len(suffix) > MAX_DIGITS:
                return None
            group = int(suffix, 16)
            position = parse_int(str(raw))
        except ValueError:
            return None
        if 0 <= group < MAX_POD_INDEX // 8 and 1 <= position <= 8:
            return group * 8 + position
    return None


def parse_gpu_ids(value: str | None) -> tuple[str, ...]:
    if not value:
        return ()
    return tuple(part.strip() for part in value.split(",") if part.strip())


def native_gpu_count(limits_by_container: Iterable[Mapping[str, object]]) -> int | None:
    """Sum of native GPU limits (``nvidia.com/gpu``, ``amd.com/gpu``) over containers, None when absent."""
    total: int | None = None
    for limits in limits_by_container:
        for resource in NATIVE_GPU_RESOURCES:
            if resource in limits:
                raw = str(limits[resource])
                try:
                    count = parse_quantity(raw).value
                except QuantityError as exc:
                    raise ContractError(resource, raw, "not a whole number of GPUs") from exc
                if count.denominator != 1 or count < 0:
                    raise ContractError(resource, raw, "not a whole number of GPUs")
                total = (total or 0) + int(count)
    return total


class _Layered:
    """Profile values overlaid by pod annotations, remembering where each value came from."""

    def __init__(self, profile: Mapping[str, str], profile_source: str | None,
                 pod: Mapping[str, str]) -> None:
        base = dict(profile)
        # A pod that chooses its own compute unit replaces the profile's other unit.
        if any(k in pod for k in _TFLOPS_KEYS):
            for k in _PERCENT_KEYS:
                base.pop(k, None)
        if any(k in pod for k in _PERCENT_KEYS):
            for k in _TFLOPS_KEYS:
                base.pop(k, None)
        self._values: dict[str, tuple[str, str | None]] = {k: (v, profile_source) for k, v in base.items()}
        self._values.update({k: (v, None) for k, v in pod.items() if k.startswith(DOMAIN + "/")})

    def get(self, key: str) -> str | None:
        entry = self._values.get(key)
        return None if entry is None else entry[0]

    def error(self, key: str, reason: str) -> ContractError:
        value, source = self._values.get(key, ("", None))
        return ContractError(key, value, reason, source)


def _raw(values: _Layered, key: str) -> str | None:
    raw = values.get(key)
    if raw is None:
        return None
    if not isinstance(raw, str):
        raise values.error(key, "must be a string")
    return raw.strip()


def _quantity(values: _Layered, key: str) -> Fraction | None:
    raw = _raw(values, key)
    if raw is None:
        return None
    try:
        amount = parse_quantity(raw).value
    except QuantityError as exc:
        raise values.error(key, "not a Kubernetes quantity (examples: 10, 1.5, 500m, 16Gi)") from exc
    if amount < 0:
        raise values.error(key, "must not be negative")
    return amount


def _tflops(values: _Layered, key: str) -> Fraction | None:
    return _quantity(values, key)


def _percent(values: _Layered, key: str) -> Fraction | None:
    amount = _quantity(values, key)
    if amount is not None and amount > 100:
        raise values.error(key, "compute percent must be within 0..100")
    return amount


def _bytes(values: _Layered, key: str) -> int | None:
    amount = _quantity(values, key)
    if amount is None:
        return None
    if amount.denominator != 1:
        raise values.error(key, "VRAM must be a whole number of bytes")
    return int(amount)


def _request_and_limit(values: _Layered, request_key: str, limit_key: str,
                       parse: Any) -> tuple[Any, Any]:
    request = parse(values, request_key)
    limit = parse(values, limit_key)
    if request is None:
        request = limit
    if limit is None:
        limit = request
    if request is not None and limit < request:
        raise values.error(limit_key, f"limit is below the request {values.get(request_key)}")
    return request, limit


def _gpu_indices(values: _Layered) -> tuple[int, ...]:
    raw = _raw(values, GPU_INDICES)
    if raw is None or raw == "":
        return ()
    parts = [p.strip() for p in raw.split(",")]
    try:
        if not all(p.isdigit() for p in parts):
            raise NumberError("negative or not a number")
        indices = tuple(parse_int(p, minimum=0) for p in parts)
    except NumberError:
        raise values.error(GPU_INDICES, "must be a comma-separated list of non-negative integers "
                           f"(at most {MAX_DIGITS} digits each)") from None
    if len(set(indices)) != len(indices):
        raise values.error(GPU_INDICES, "lists the same GPU index twice")
    if len(indices) > MAX_GPU_COUNT:
        raise values.error(GPU_INDICES, f"lists more than {MAX_GPU_COUNT} GPUs")
    return indices


def _gpu_count(values: _Layered, indices: tuple[int, ...], native: int | None) -> int:
    raw = _raw(values, GPU_COUNT)
    if raw is None:
        if indices:
            return len(indices)
        count = native if native else 1
        if not 1 <= count <= MAX_GPU_COUNT:
            raise ContractError(NVIDIA_GPU, count, f"GPU count must be within 1..{MAX_GPU_COUNT}")
        return count
    try:
        if not raw.isdigit():
            raise NumberError("not digits")
        count = parse_int(raw, minimum=1, maximum=MAX_GPU_COUNT)
    except NumberError:
        raise values.error(GPU_COUNT, f"must be an integer within 1..{MAX_GPU_COUNT}") from None
    if indices and count != len(indices):
        raise values.error(GPU_COUNT, f"does not match the {len(indices)} GPUs listed in {GPU_INDICES}")
    if native and count != native:
        raise values.error(GPU_COUNT, f"does not match the native GPU limit of {native}")
    return count


def _choice(values: _Layered, key: str, kind: type[_E], default: _E | None) -> Any:
    raw = _raw(values, key)
    if raw is None or raw == "":
        return default
    try:
        return kind(raw)
    except ValueError as exc:
        allowed = ", ".join(str(member.value) for member in kind)
        raise values.error(key, f"unknown value; allowed: {allowed}") from exc


def _boolean(values: _Layered, key: str) -> bool:
    raw = _raw(values, key)
    if raw is None or raw == "":
        return False
    if raw.lower() in ("true", "false"):
        return raw.lower() == "true"
    raise values.error(key, 'must be "true" or "false"')


def _text(values: _Layered, key: str) -> str | None:
    raw = _raw(values, key)
    return raw or None


def _pool(values: _Layered, context: RequestContext) -> tuple[str, PoolDefaults | None]:
    name = _text(values, GPU_POOL) or context.default_pool
    if name is None:
        raise ContractError(GPU_POOL, "", "no pool named and no GPUPool is annotated as the default pool")
    if context.pools is not None:
        defaults = context.pools.get(name)
    elif context.pool_lookup is not None:
        defaults = context.pool_lookup(name)
    else:
        return name, None
    if defaults is None:
        raise values.error(GPU_POOL, "no such GPUPool") if values.get(GPU_POOL) else ContractError(
            GPU_POOL, name, "no such GPUPool")
    return name, defaults


# --- the allocation record written at bind (ALLOCATED) ----------------------------------------------------

ALLOCATED_WHOLE = "whole"
_ALLOCATED_POOL = "-"  # a bound pod's record does not need its pool: only what it holds counts


def format_allocated(request: GPURequest) -> str:
    """What ``request`` takes from each of its GPUs, as the bind records it in ``tensor-fusion.ai/allocated``:
    ``whole`` (isolation shared: the GPU whole), ``tflops=<q>,vram=<q>`` or ``percent=<q>,vram=<q>`` (a
    share of the GPU's TFLOPS), quantities in Kubernetes notation. Limits, QoS and autoscaling are left
    out: they do not change what the pod holds."""
    if request.takes_whole_gpu:
        return ALLOCATED_WHOLE
    if request.percent_request is not None:
        compute = f"percent={format_tflops(request.percent_request)}"
    else:
        compute = f"tflops={format_tflops(request.tflops_request or Fraction(0))}"
    return f"{compute},vram={format_bytes(request.vram_request)}"


def parse_allocated(value: str, gpu_count: int) -> GPURequest:
    """The request a bound pod holds per GPU, read back from its ``allocated`` record; raises
    ``ContractError`` for anything ``format_allocated`` does not write."""
    text = value.strip()
    if text == ALLOCATED_WHOLE:
        return GPURequest(pool=_ALLOCATED_POOL, gpu_count=gpu_count, isolation=Isolation.SHARED)
    fields: dict[str, Fraction] = {}
    for part in text.split(","):
        name, sep, raw = part.partition("=")
        name = name.strip()
        if not sep or name not in ("tflops", "percent", "vram") or name in fields:
            raise ContractError(ALLOCATED, value, "expected whole, tflops=Q,vram=Q or percent=Q,vram=Q")
        try:
            amount = parse_quantity(raw.strip()).value
        except QuantityError as exc:
            raise ContractError(ALLOCATED, value, f"{name} is not a Kubernetes quantity") from exc
        if amount < 0:
            raise ContractError(ALLOCATED, value, f"{name} must not be negative")
        fields[name] = amount
    if "vram" not in fields or ("tflops" in fields) == ("percent" in fields):
        raise ContractError(ALLOCATED, value, "expected whole, tflops=Q,vram=Q or percent=Q,vram=Q")
    vram = fields["vram"]
    if vram.denominator != 1:
        raise ContractError(ALLOCATED, value, "VRAM must be a whole number of bytes")
    if "percent" in fields and fields["percent"] > 100:
        raise ContractError(ALLOCATED, value, "compute percent must be within 0..100")
    return GPURequest(pool=_ALLOCATED_POOL, tflops_request=fields.get("tflops"),
                      percent_request=fields.get("percent"), vram_request=int(vram), gpu_count=gpu_count)
