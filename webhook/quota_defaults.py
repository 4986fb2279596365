"""A namespace's GPUResourceQuota defaults (``spec.single.defaultRequests`` / ``defaultLimits``): the
amounts the webhook fills in for a pod that gives none, below its WorkloadProfile and its own annotations.

- A request default fills a request neither the pod nor its profile gives; a limit default fills a
  missing limit unless it would be below the request (then the limit is the request, as without it).
- TFLOPS and compute percent are one choice: a pod (or profile) that names either keeps that unit; a quota
  that defaults both gives TFLOPS.
- A pod asking for whole GPUs (isolation shared, or only a native ``nvidia.com/gpu`` limit) gets none.
- With several quotas in the namespace, the oldest (then by name) that sets a field gives it.

The values go through the pod contract like any annotation, so a malformed default is denied with its key
and the quota named as its source.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from fractions import Fraction
from typing import Any

from extender.common.contract import (
    ISOLATION,
    PERCENT_LIMIT,
    PERCENT_REQUEST,
    TFLOPS_LIMIT,
    TFLOPS_REQUEST,
    VRAM_LIMIT,
    VRAM_REQUEST,
    Isolation,
)
from extender.common.quantity import QuantityError, parse_quantity

# (request key, limit key, the field of a quota's Resource)
_FIELDS = ((TFLOPS_REQUEST, TFLOPS_LIMIT, "tflops"), (VRAM_REQUEST, VRAM_LIMIT, "vram"),
           (PERCENT_REQUEST, PERCENT_LIMIT, "compute"))


def _ordered(quotas: Iterable[Mapping[str, Any]]) -> list[Mapping[str, Any]]:
    def key(q: Mapping[str, Any]) -> tuple[str, str]:
        meta = q.get("metadata") or {}
        return str(meta.get("creationTimestamp") or ""), str(meta.get("name") or "")
    return sorted(quotas, key=key)


def _default(quotas: list[Mapping[str, Any]], section: str, field: str) -> tuple[str, str] | None:
    """The first quota's value of ``spec.single.<section>.<field>`` and the quota's name."""
    for quota in quotas:
        single = (quota.get("spec") or {}).get("single")
        values = single.get(section) if isinstance(single, Mapping) else None
        raw = values.get(field) if isinstance(values, Mapping) else None
        if raw is not None and not isinstance(raw, bool) and str(raw).strip():
            return str(raw).strip(), str((quota.get("metadata") or {}).get("name") or "")
    return None


def _amount(text: str | None) -> Fraction | None:
    try:
        return parse_quantity(text).value if text is not None else None
    except QuantityError:
        return None


def quota_defaults(quotas: Iterable[Mapping[str, Any]], given: Mapping[str, Any],
                   native_gpus: bool = False) -> tuple[dict[str, str], str | None]:
    """The annotations the namespace's quotas fill in for a pod whose profile and annotations are ``given``
    (their keys and values), and the source to name in errors (``GPUResourceQuota ns/name``);
    ``native_gpus``: the pod has a native GPU limit (whole GPUs, unless it asks for amounts)."""
    ordered = _ordered(quotas)
    whole_gpus = native_gpus and not any(k in given for fields in _FIELDS for k in fields[:2])
    if not ordered or whole_gpus or str(given.get(ISOLATION) or "").strip() == Isolation.SHARED.value:
        return {}, None
    unit = ("tflops" if any(k in given for k in (TFLOPS_REQUEST, TFLOPS_LIMIT))
            else "compute" if any(k in given for k in (PERCENT_REQUEST, PERCENT_LIMIT)) else None)
    if unit is None:
        unit = "compute" if (_default(ordered, "defaultRequests", "compute")
                             and not _default(ordered, "defaultRequests", "tflops")) else "tflops"
    out: dict[str, str] = {}
    names: list[str] = []
    for request_key, limit_key, field in _FIELDS:
        if field in ("tflops", "compute") and field != unit:
            continue
        request = given.get(request_key)
        if request is None and (found := _default(ordered, "defaultRequests", field)) is not None:
            request = out[request_key] = found[0]
            names.append(found[1])
        if given.get(limit_key) is None and (found := _default(ordered, "defaultLimits", field)) is not None:
            asked, limit = _amount(str(request) if request is not None else None), _amount(found[0])
            if asked is None or limit is None or limit >= asked:
                out[limit_key] = found[0]
                names.append(found[1])
    if not out:
        return {}, None
    namespace = str((ordered[0].get("metadata") or {}).get("namespace") or "")
    return out, "GPUResourceQuota " + ", ".join(f"{namespace}/{n}" for n in dict.fromkeys(names))
