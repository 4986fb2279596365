"""A GPUResourceQuota's status, as TensorFusion writes it: ``used``, ``availablePercent`` (strings with two
decimals), the ``Ready`` condition (``CapacitySufficient``, or ``AlertThresholdReached`` once any dimension's
available percent is below ``100 - alertThresholdPercent``) and ``lastUpdateTime``."""

from __future__ import annotations

from collections.abc import Mapping
from fractions import Fraction
from typing import Any

from extender.common.contract import format_bytes, format_tflops
from extender.quota.model import Amounts, Quota
from extender.quota.usage import NO_USAGE, Usage

READY = "Ready"
CAPACITY_SUFFICIENT = "CapacitySufficient"
ALERT_THRESHOLD_REACHED = "AlertThresholdReached"
INVALID_FIELDS = "InvalidFields"  # ours: a field is malformed and ignored (TensorFusion skips the quota)
SUFFICIENT_MESSAGE = "GPUResourceQuota is ready and capacity is sufficient"

# availablePercent keys, TensorFusion's
PERCENT_KEYS = ("requests.tflops", "requests.vram", "limits.tflops", "limits.vram", "workers")


def _percent(total: Fraction | int | None, used: Fraction | int) -> str:
    if total is None or total <= 0:
        return "100"  # no cap (and, as TensorFusion shows it, a 0 cap)
    return f"{max(float((Fraction(total) - Fraction(used)) / Fraction(total) * 100), 0.0):.2f}"


def available_percent(quota: Quota, usage: Usage) -> dict[str, str]:
    requests, limits = quota.total_requests, quota.total_limits
    return {
        "requests.tflops": _percent(requests.tflops if requests else None, usage.requests.tflops),
        "requests.vram": _percent(requests.vram if requests else None, usage.requests.vram),
        "limits.tflops": _percent(limits.tflops if limits else None, usage.limits.tflops),
        "limits.vram": _percent(limits.vram if limits else None, usage.limits.vram),
        "workers": _percent(quota.max_workers, usage.workers),
    }


def alerting(quota: Quota, percent: Mapping[str, str]) -> list[str]:
    """The dimensions whose available percent is below what the alert threshold leaves."""
    floor = 100 - quota.alert_threshold
    return [key for key in PERCENT_KEYS if float(percent.get(key) or 100) < floor]


def _amounts(value: Amounts) -> dict[str, str]:
    return {"tflops": format_tflops(value.tflops), "vram": format_bytes(value.vram)}


def ready_condition(quota: Quota, percent: Mapping[str, str]) -> dict[str, str]:
    """The ``Ready`` condition (without ``lastTransitionTime``, which the caller keeps or sets)."""
    if quota.problems:
        return {"type": READY, "status": "False", "reason": INVALID_FIELDS,
                "message": "ignored (no cap from them): " + "; ".join(quota.problems)}
    over = alerting(quota, percent)
    if over:
        return {"type": READY, "status": "False", "reason": ALERT_THRESHOLD_REACHED,
                "message": f"available below {100 - quota.alert_threshold}% "
                           f"(alert threshold {quota.alert_threshold}%) for: {', '.join(over)}"}
    return {"type": READY, "status": "True", "reason": CAPACITY_SUFFICIENT, "message": SUFFICIENT_MESSAGE}


def quota_status(quota: Quota, usage: Usage | None, previous: Mapping[str, Any] | None,
                 now: str) -> dict[str, Any]:
    """The status to write: ``previous`` is the stored status, whose condition keeps its
    ``lastTransitionTime`` while its status and reason stay; ``lastUpdateTime`` is ``now`` only when
    something else changed (so an unchanged quota is not written again)."""
    used = usage or NO_USAGE
    percent = available_percent(quota, used)
    condition = ready_condition(quota, percent)
    old = next((c for c in ((previous or {}).get("conditions") or []) if isinstance(c, Mapping)
                and c.get("type") == READY), None)
    same = old is not None and (old.get("status"), old.get("reason")) == (condition["status"],
                                                                         condition["reason"])
    since = str(old.get("lastTransitionTime")) if same and old else now
    condition = {**condition, "lastTransitionTime": since}
    body: dict[str, Any] = {
        "used": {"requests": _amounts(used.requests), "limits": _amounts(used.limits),
                 "workers": used.workers},
        "availablePercent": percent,
        "conditions": [condition],
    }
    stale = {k: v for k, v in (previous or {}).items() if k != "lastUpdateTime"} != body
    body["lastUpdateTime"] = now if stale else str((previous or {}).get("lastUpdateTime") or now)
    return body


def crossed_alert(previous: Mapping[str, Any] | None, status: Mapping[str, Any]) -> bool:
    """Whether ``status`` reaches the alert threshold and ``previous`` did not."""
    def reason(s: Mapping[str, Any] | None) -> str:
        for c in (s or {}).get("conditions") or []:
            if isinstance(c, Mapping) and c.get("type") == READY:
                return str(c.get("reason") or "")
        return ""
    return reason(status) == ALERT_THRESHOLD_REACHED and reason(previous) != ALERT_THRESHOLD_REACHED
