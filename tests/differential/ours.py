"""Our recommender on the cases of ``cases.py``, in the shape ``tfrecommend`` prints."""

from __future__ import annotations

import datetime as dt
import math
from fractions import Fraction
from typing import Any
from zoneinfo import ZoneInfo

from extender.autoscaling.config import Resources, parse_config
from extender.autoscaling.recommend import recommend
from extender.autoscaling.usage import VramPeakWeight, WorkerUsage, WorkloadUsage
from extender.common.cron import CronError, CronSchedule
from extender.common.quantity import parse_quantity

KEYS = ("requests.tflops", "requests.vram", "limits.tflops", "limits.vram")


def _milli(q: Fraction) -> int:
    return math.ceil(q * 1000)


def run_case(case: dict[str, Any], peak_weight: VramPeakWeight) -> list[dict[str, Any]]:
    return run_case_with_usage(case, peak_weight)[0]


def run_case_with_usage(case: dict[str, Any],
                        peak_weight: VramPeakWeight) -> tuple[list[dict[str, Any]], WorkloadUsage]:
    config = parse_config({"autoSetResources": case["auto_set_resources"],
                           **({"autoSetResources": {**case["auto_set_resources"],
                                                    "historyDataPeriod": case["history_period"]}}
                              if case["history_period"] else {})})
    assert config.auto_set is not None and not config.problems, config.problems
    r = {k: parse_quantity(v).value for k, v in case["resources"].items()}
    original = Resources(r["requests.tflops"], r["requests.vram"], r["limits.tflops"], r["limits.vram"])
    usage = WorkloadUsage(config.auto_set.history_period_ns // 2, peak_weight)
    current = original
    out = []
    for tick in case["ticks"]:
        for s in tick["samples"]:
            usage.add(WorkerUsage(s["worker"], s["tflops"], s["vram"], s["unix_ns"]))
        result = recommend(config, usage, original, current, case["qos"], case["creation_age_ns"],
                           dt.datetime.now(dt.UTC), ZoneInfo("UTC"), None)
        rec = None
        if result.recommendation is not None:
            current = result.recommendation
            c = current
            rec = dict(zip(KEYS, (_milli(c.req_tflops), _milli(c.req_vram), _milli(c.lim_tflops),
                                  _milli(c.lim_vram)), strict=True))
        out.append({"recommendation": rec, "reason": result.reason, "message": result.message})
    return out, usage


# -- cron ----------------------------------------------------------------------------------------------------


def cron_accepts(expr: str) -> bool:
    try:
        CronSchedule.parse(expr)
    except CronError:
        return False
    return True


def cron_next(case: dict[str, Any]) -> int | None:
    at = dt.datetime.fromtimestamp(case["unix_ns"] / 10**9, dt.UTC)
    found = CronSchedule.parse(case["expr"]).next(at, ZoneInfo(case["zone"]))
    return None if found is None else int(found.timestamp())


def run_cron_case(case: dict[str, Any]) -> list[dict[str, Any]]:
    """Our cron recommender on one rule case, tick by tick, in the shape ``tfrecommend cron`` prints."""
    config = parse_config({"cronScalingRules": case["rules"]})
    r = {k: parse_quantity(v).value for k, v in case["resources"].items()}
    original = Resources(r["requests.tflops"], r["requests.vram"], r["limits.tflops"], r["limits.vram"])
    usage = WorkloadUsage(3600 * 10**9)
    current, previous = original, None
    out = []
    for tick in case["ticks"]:
        now = dt.datetime.fromtimestamp(tick["unix_ns"] // 1000 / 10**6, dt.UTC)
        result = recommend(config, usage, original, current, "", 0, now, ZoneInfo("UTC"), previous)
        rec = None
        if result.recommendation is not None:
            current = result.recommendation
            rec = dict(zip(KEYS, (_milli(current.req_tflops), _milli(current.req_vram),
                                  _milli(current.lim_tflops), _milli(current.lim_vram)), strict=True))
        previous = result.cron_state
        out.append({"recommendation": rec, "reason": result.reason, "message": result.message,
                    "error": bool(result.problems),
                    "active": previous.name if previous else ""})
    return out
