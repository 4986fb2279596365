"""GPUResourceQuota objects, read totally: every field this project uses, each malformed one named.

TensorFusion's semantics (``api/v1/gpuresourcequota_types.go``): in ``spec.total`` a figure that is set
caps the namespace, 0 included (0 allows nothing); an unset ``requests`` or ``limits`` caps nothing;
``maxWorkers`` defaults to 32768 and ``alertThresholdPercent`` to 95. In ``spec.single`` a 0 means no cap.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from fractions import Fraction
from typing import Any

from extender.common.contract import format_bytes, format_tflops
from extender.common.quantity import QuantityError, parse_quantity

KIND = "GPUResourceQuota"
DEFAULT_MAX_WORKERS = 32768
DEFAULT_ALERT_THRESHOLD = 95


@dataclass(frozen=True)
class Amounts:
    """TFLOPS and VRAM bytes (a request's, a usage's or a cap's)."""

    tflops: Fraction = Fraction(0)
    vram: int = 0

    def __add__(self, other: Amounts) -> Amounts:
        return Amounts(self.tflops + other.tflops, self.vram + other.vram)

    def __sub__(self, other: Amounts) -> Amounts:
        return Amounts(self.tflops - other.tflops, self.vram - other.vram)

    def times(self, n: int) -> Amounts:
        return Amounts(self.tflops * n, self.vram * n)

    def most(self, other: Amounts) -> Amounts:
        return Amounts(max(self.tflops, other.tflops), max(self.vram, other.vram))

    def describe(self) -> str:
        return f"{format_tflops(self.tflops)} TFLOPS and {format_bytes(self.vram)} VRAM"


ZERO = Amounts()


@dataclass(frozen=True)
class Defaults:
    """``single.defaultRequests`` / ``defaultLimits``: what the webhook fills in (None: not given)."""

    tflops: Fraction | None = None
    vram: int | None = None
    percent: Fraction | None = None  # the ``compute`` field: a percent of a GPU


@dataclass(frozen=True)
class Quota:
    namespace: str
    name: str
    created: str = ""  # creationTimestamp, to order several quotas of one namespace
    total_requests: Amounts | None = None  # None: no cap
    total_limits: Amounts | None = None
    max_workers: int = DEFAULT_MAX_WORKERS
    alert_threshold: int = DEFAULT_ALERT_THRESHOLD
    max_requests: Amounts = ZERO  # per GPU; a 0 figure is no cap
    max_limits: Amounts = ZERO
    max_gpu_count: int = 0  # 0: no cap
    default_requests: Defaults | None = None
    default_limits: Defaults | None = None
    problems: tuple[str, ...] = ()  # malformed fields, each named with its value; those fields are ignored

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}"


def _path(*parts: str) -> str:
    return "spec." + ".".join(parts)


class _Reader:
    def __init__(self) -> None:
        self.problems: list[str] = []

    def section(self, parent: Mapping[str, Any], name: str, path: str) -> Mapping[str, Any] | None:
        value = parent.get(name)
        if value is None:
            return None
        if not isinstance(value, Mapping):
            self.problems.append(f"{path}={value!r}: not an object")
            return None
        return value

    def quantity(self, parent: Mapping[str, Any], name: str, path: str, *, whole: bool = False,
                 most: Fraction | None = None) -> Fraction | None:
        raw = parent.get(name)
        if raw is None:
            return None
        try:
            value = parse_quantity(str(raw)).value if not isinstance(raw, bool) else None
        except QuantityError:
            value = None
        if value is None:
            self.problems.append(f"{path}={raw!r}: not a Kubernetes quantity")
            return None
        if value < 0:
            self.problems.append(f"{path}={raw!r}: must not be negative")
            return None
        if most is not None and value > most:
            self.problems.append(f"{path}={raw!r}: must be at most {most}")
            return None
        if whole:
            value = Fraction(int(value) if value.denominator == 1 else int(value) + 1)
        return value

    def integer(self, parent: Mapping[str, Any], name: str, path: str, low: int, high: int) -> int | None:
        raw = parent.get(name)
        if raw is None:
            return None
        if isinstance(raw, bool) or not isinstance(raw, int) or not low <= raw <= high:
            self.problems.append(f"{path}={raw!r}: expected an integer within {low}..{high}")
            return None
        return raw

    def amounts(self, parent: Mapping[str, Any], name: str, path: str) -> Amounts | None:
        section = self.section(parent, name, path)
        if section is None:
            return None
        tflops = self.quantity(section, "tflops", f"{path}.tflops")
        vram = self.quantity(section, "vram", f"{path}.vram", whole=True)
        return Amounts(tflops or Fraction(0), int(vram or 0))

    def defaults(self, parent: Mapping[str, Any], name: str, path: str) -> Defaults | None:
        section = self.section(parent, name, path)
        if section is None:
            return None
        tflops = self.quantity(section, "tflops", f"{path}.tflops")
        vram = self.quantity(section, "vram", f"{path}.vram", whole=True)
        percent = self.quantity(section, "compute", f"{path}.compute", most=Fraction(100))
        return Defaults(tflops or None, int(vram) if vram else None, percent or None)


def parse_quota(obj: Mapping[str, Any]) -> Quota:
    """A GPUResourceQuota object as a ``Quota``; never raises: a malformed field is left out (no cap from
    it) and named in ``problems``."""
    raw_meta = obj.get("metadata")
    meta: Mapping[str, Any] = raw_meta if isinstance(raw_meta, Mapping) else {}
    namespace, name = str(meta.get("namespace") or ""), str(meta.get("name") or "")
    read = _Reader()
    spec = read.section(obj, "spec", "spec") or {}
    total = read.section(spec, "total", _path("total")) or {}
    single = read.section(spec, "single", _path("single")) or {}
    total_requests = read.amounts(total, "requests", _path("total", "requests"))
    total_limits = read.amounts(total, "limits", _path("total", "limits"))
    workers = read.integer(total, "maxWorkers", _path("total", "maxWorkers"), 0, 2**31 - 1)
    threshold = read.integer(total, "alertThresholdPercent", _path("total", "alertThresholdPercent"), 0, 100)
    max_requests = read.amounts(single, "maxRequests", _path("single", "maxRequests")) or ZERO
    max_limits = read.amounts(single, "maxLimits", _path("single", "maxLimits")) or ZERO
    max_gpus = read.integer(single, "maxGPUCount", _path("single", "maxGPUCount"), 0, 2**31 - 1)
    default_requests = read.defaults(single, "defaultRequests", _path("single", "defaultRequests"))
    default_limits = read.defaults(single, "defaultLimits", _path("single", "defaultLimits"))
    return Quota(
        namespace=namespace, name=name, created=str(meta.get("creationTimestamp") or ""),
        total_requests=total_requests, total_limits=total_limits,
        max_workers=DEFAULT_MAX_WORKERS if workers is None else workers,
        alert_threshold=DEFAULT_ALERT_THRESHOLD if threshold is None else threshold,
        max_requests=max_requests, max_limits=max_limits, max_gpu_count=max_gpus or 0,
        default_requests=default_requests, default_limits=default_limits, problems=tuple(read.problems))


def by_namespace(quotas: Any) -> dict[str, list[Quota]]:
    """Quotas (parsed or objects) grouped by namespace, each namespace's oldest first (then by name)."""
    out: dict[str, list[Quota]] = {}
    for item in quotas:
        quota = item if isinstance(item, Quota) else parse_quota(item)
        out.setdefault(quota.namespace, []).append(quota)
    for items in out.values():
        items.sort(key=lambda q: (q.created, q.name))
    return out
