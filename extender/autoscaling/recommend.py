"""TensorFusion's recommenders and their merge, pure: given a workload's state, what to recommend.

Three recommenders answer each tick, as in TensorFusion (``internal/autoscaler/recommender``):

- **percentile** (``autoSetResources``): estimates are a histogram percentile times ``1 + marginFraction``,
  truncated to whole TFLOPS and whole bytes; the limit is the upper bound, the request the lower bound for
  QoS low and medium, the target for high, the upper bound for critical; floors of 1 TFLOPS and 1 GiB; then
  clamped to [min, max] x the original (the spec's) request and limit; the compute limit never drops below
  the original limit; no change when both requests move by no more than ``updateThreshold``; nothing before
  ``initialDelayPeriod``.
- **cron** (``cronScalingRules``): while a rule is active its ``desiredResources`` are recommended once and
  then hold as a floor (a lower recommendation from the others is dropped); when it ends, the original
  resources are recommended once.
- **external** (``externalScaler``): the scaler's ``recommendedResources`` when it answers ``needScaleUp``
  or ``needScaleDown``.

The merge takes, per resource, the result with the larger request among those not yet applied, drops it all
when it falls below a cron floor, and fills a zero resource from the current one.

The room left on the workers' GPUs is not considered here: the ledger's resize verb clamps to it.
"""

from __future__ import annotations

import datetime as dt
import math
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from fractions import Fraction
from zoneinfo import ZoneInfo

from extender.autoscaling.config import (
    AutoScalingConfig,
    AutoSetResources,
    CronRule,
    Percentiles,
    Resources,
)
from extender.autoscaling.usage import WorkloadUsage
from extender.common.cron import CronSchedule
from extender.common.quantity import Format, format_quantity

MAX_RESOURCE_AMOUNT = 1e14
MIN_TFLOPS = Fraction(1)
MIN_VRAM = Fraction(2**30)

# Reasons of the ResourceUpdate condition, TensorFusion's
LOW_CONFIDENCE = "LowConfidence"
INSIDE_THRESHOLD = "InsideUpdateThreshold"
UPDATED = "Updated"
NO_SCALING_NEEDED = "NoScalingNeeded"
RULE_ACTIVE = "RuleActive"
RULE_INACTIVE = "RuleInactive"


@dataclass(frozen=True)
class Result:
    resources: Resources
    applied: bool  # TensorFusion's HasApplied: nothing to do
    scale_down_locking: bool = False  # a cron floor


@dataclass
class Outcome:
    """What one recommender said: a result (or None), and the condition it set (reason, message)."""

    result: Result | None
    reason: str = ""
    message: str = ""


@dataclass(frozen=True)
class Estimates:
    lower_tflops: Fraction
    target_tflops: Fraction
    upper_tflops: Fraction
    lower_vram: Fraction
    target_vram: Fraction
    upper_vram: Fraction


def _amount(value: float) -> float:
    if value < 0:
        return 0.0
    return min(value, MAX_RESOURCE_AMOUNT)


def _with_margin(base: float, margin: float) -> float:
    base = _amount(base)
    return base + _amount(base * margin)


def _whole(value: float) -> Fraction:
    """Go's ``int64(amount)``: toward zero."""
    return Fraction(int(value))


def estimate(usage: WorkloadUsage, p: Percentiles) -> Estimates | None:
    if usage.is_empty():
        return None
    t, v = usage.tflops, usage.vram
    return Estimates(
        _whole(_with_margin(t.percentile(p.lower_tflops), p.margin)),
        _whole(_with_margin(t.percentile(p.target_tflops), p.margin)),
        _whole(_with_margin(t.percentile(p.upper_tflops), p.margin)),
        _whole(_with_margin(v.percentile(p.lower_vram), p.margin)),
        _whole(_with_margin(v.percentile(p.target_vram), p.margin)),
        _whole(_with_margin(v.percentile(p.upper_vram), p.margin)),
    )


def _value(q: Fraction) -> int:
    """``resource.Quantity.Value()``: rounded up to an integer."""
    return math.ceil(q)


def _approx(q: Fraction) -> float:
    return float(q)


def _scale_one(compute: bool, cur_req: Fraction, cur_lim: Fraction, lower: Fraction, target: Fraction,
               upper: Fraction, orig_req: Fraction, orig_lim: Fraction, p: Percentiles,
               qos: str) -> tuple[Fraction, Fraction] | None:
    lim = upper
    req = {"critical": upper, "high": target}.get(qos, lower)
    min_ratio, max_ratio = ((p.min_compute_ratio, p.max_compute_ratio) if compute
                            else (p.min_vram_ratio, p.max_vram_ratio))
    orig_req_f, orig_lim_f = _approx(orig_req), _approx(orig_lim)
    min_req, max_req = orig_req_f * min_ratio, orig_req_f * max_ratio
    min_lim, max_lim = orig_lim_f * min_ratio, orig_lim_f * max_ratio
    floor = MIN_TFLOPS if compute else MIN_VRAM
    lim = max(lim, floor)
    req = max(req, floor)
    req_f = _approx(req)
    if min_req != 0 and req_f < min_req:
        req_f = min_req
        req = _whole(req_f)
    if max_req != 0 and req_f > max_req:
        req_f = max_req
        req = _whole(req_f)
    lim_f = _approx(lim)
    if min_lim != 0 and lim_f < min_lim:
        lim_f = min_lim
        lim = _whole(lim_f)
    if max_lim != 0 and lim_f > max_lim:
        lim_f = max_lim
        lim = _whole(lim_f)
    if compute and lim_f < orig_lim_f:
        lim = _whole(orig_lim_f)
    if cur_req == req and cur_lim == lim:
        return None
    return req, lim


def _threshold_message(name: str, cur: Fraction, rec: Fraction, threshold: float) -> str | None:
    """None when the change is larger than the threshold, else TensorFusion's message part."""
    diff = abs(_value(cur) - _value(rec))
    allowed = int(float(_value(cur)) * threshold)
    if diff > allowed:
        return None
    # Quantity.String() of TensorFusion's whole-number quantities: TFLOPS decimal, VRAM binary (1Gi)
    show = _tf if name == "Compute" else _vr
    return f"{name} change ({show(Fraction(diff))}) within threshold ({show(Fraction(allowed))}), "


def percentile(config: AutoSetResources | None, usage: WorkloadUsage, original: Resources, current: Resources,
               qos: str, age_ns: int) -> Outcome:
    if config is None:
        return Outcome(None)
    if age_ns < config.initial_delay_ns:
        return Outcome(Result(Resources(), applied=True), LOW_CONFIDENCE,
                       "Workload created time less than InitialDelayPeriod "
                       f"{_go_duration(config.initial_delay_ns)}, no update performed")
    p = config.percentiles
    est = estimate(usage, p)
    if est is None:
        return Outcome(None)
    messages = []
    tflops = _scale_one(True, current.req_tflops, current.lim_tflops, est.lower_tflops, est.target_tflops,
                        est.upper_tflops, original.req_tflops, original.lim_tflops, p, qos)
    req_t, lim_t = tflops if tflops else (current.req_tflops, current.lim_tflops)
    if tflops:
        messages.append(f"Compute scaled: request {_tf(current.req_tflops)} -> {_tf(req_t)}, "
                        f"limit {_tf(current.lim_tflops)} -> {_tf(lim_t)}")
    vram = _scale_one(False, current.req_vram, current.lim_vram, est.lower_vram, est.target_vram,
                      est.upper_vram, original.req_vram, original.lim_vram, p, qos)
    req_v, lim_v = vram if vram else (current.req_vram, current.lim_vram)
    if vram:
        messages.append(f"VRAM scaled: request {_vr(current.req_vram)} -> {_vr(req_v)}, "
                        f"limit {_vr(current.lim_vram)} -> {_vr(lim_v)}")
    rec = Resources(req_t, req_v, lim_t, lim_v)
    if not rec.is_zero():
        should_update, inside = False, ""
        if current.req_tflops and rec.req_tflops:
            part = _threshold_message("Compute", current.req_tflops, rec.req_tflops, p.update_threshold)
            should_update |= part is None
            inside += part or ""
        if current.req_vram and rec.req_vram:
            part = _threshold_message("VRAM", current.req_vram, rec.req_vram, p.update_threshold)
            should_update |= part is None
            inside += part or ""
        if not should_update and inside:
            return Outcome(Result(rec, applied=True), INSIDE_THRESHOLD, inside + "no update performed")
    if rec.is_zero():
        return Outcome(None)
    if rec == current:
        return Outcome(Result(rec, applied=True))
    return Outcome(Result(rec, applied=False), UPDATED, ", ".join(messages))


# -- cron ----------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class CronState:
    """The rule active at the last tick (status.activeCronScalingRule): its name and desired resources."""

    name: str
    desired: Resources


def _next(schedule: CronSchedule, default_zone: ZoneInfo, now: dt.datetime) -> dt.datetime | None:
    return schedule.next(now, schedule.resolve_zone(default_zone))


def active_rule(rules: Sequence[CronRule], now: dt.datetime,
                default_zone: ZoneInfo) -> tuple[CronRule | None, str]:
    """The rule active at ``now``, and an error when more than one is (TensorFusion permits one; none is
    then active). TensorFusion's test (``getActiveCronScalingRule`` in ``cron_recommender.go``), with
    robfig's ``Next`` (None: its zero time, earlier than any time): a rule is active when its next end
    comes no later than its next start, or when its start never fires again."""
    active = []
    for rule in rules:
        start, end = _next(rule.start, default_zone, now), _next(rule.end, default_zone, now)
        # Go: if nextStart.Before(nextEnd) { now.After(nextStart) && now.Before(nextEnd) }
        #     else { now.After(nextStart) || now.Before(nextEnd) }, both next times after now or zero
        is_active = start is None or (end is not None and not start < end)
        if is_active:
            active.append(rule)
    if len(active) > 1:
        names = ", ".join(r.name for r in active)
        return None, f"only one active cron scaling rule is permitted at any given time (active: {names})"
    return (active[0] if active else None), ""


def cron(rules: Sequence[CronRule], previous: CronState | None, original: Resources, now: dt.datetime,
         default_zone: ZoneInfo) -> tuple[Outcome, CronState | None, str]:
    """The cron recommender: its outcome, the rule to keep in status, and an error (empty when none)."""
    rule, error = active_rule(rules, now, default_zone)
    if error:
        return Outcome(None), previous, error
    if rule is None and previous is None:
        return Outcome(None), None, ""
    if rule is None:
        assert previous is not None
        return (Outcome(Result(original, applied=False, scale_down_locking=True), RULE_INACTIVE,
                        f"Cron scaling rule {go_quote(previous.name)} is inactive"), None, "")
    state = CronState(rule.name, rule.desired)
    if previous is None or previous.desired != rule.desired:
        return (Outcome(Result(rule.desired, applied=False, scale_down_locking=True), RULE_ACTIVE,
                        f"Cron scaling rule {go_quote(rule.name)} is active"), state, "")
    return Outcome(Result(rule.desired, applied=True, scale_down_locking=True)), previous, ""


# -- external ------------------------------------------------------------------------------------------------


def external(answer: dict[str, object], current: Resources) -> tuple[Outcome, list[str]]:
    """The external scaler's answer (``needScaleUp``, ``needScaleDown``, ``reason``,
    ``recommendedResources``) as a recommender outcome, and what in it could not be read."""
    problems: list[str] = []
    reason = str(answer.get("reason") or "")
    if answer.get("needScaleUp") is not True and answer.get("needScaleDown") is not True:
        return Outcome(Result(Resources(), applied=True), NO_SCALING_NEEDED, reason), problems
    rec = Resources.from_json(answer.get("recommendedResources"), "recommendedResources", problems)
    if rec.is_zero():
        return Outcome(None), problems
    if rec == current:
        return Outcome(Result(rec, applied=True)), problems
    return (Outcome(Result(rec, applied=False), reason or UPDATED,
                    f"External scaler recommendation: {reason}"), problems)


# -- merge ---------------------------------------------------------------------------------------------------


def _larger(into: Resources, other: Resources) -> Resources:
    if into.req_tflops < other.req_tflops:
        into = replace(into, req_tflops=other.req_tflops, lim_tflops=other.lim_tflops)
    if into.req_vram < other.req_vram:
        into = replace(into, req_vram=other.req_vram, lim_vram=other.lim_vram)
    return into


def merge(results: Sequence[Result | None], current: Resources) -> Resources | None:
    """TensorFusion's ``GetRecommendation``: None when there is nothing to change."""
    found = [r for r in results if r is not None]
    if not found:
        return None
    rec, floor = Resources(), Resources()
    for r in found:
        if not r.applied:
            rec = _larger(rec, r.resources)
        if r.scale_down_locking:
            floor = _larger(floor, r.resources)
    if rec.is_zero() or rec.req_tflops < floor.req_tflops or rec.req_vram < floor.req_vram:
        return None
    if not rec.req_tflops or not rec.lim_tflops:
        rec = replace(rec, req_tflops=current.req_tflops, lim_tflops=current.lim_tflops)
    if not rec.req_vram or not rec.lim_vram:
        rec = replace(rec, req_vram=current.req_vram, lim_vram=current.lim_vram)
    return rec


@dataclass
class Tick:
    """Everything one evaluation of a workload produced."""

    recommendation: Resources | None
    cron_state: CronState | None
    reason: str = ""
    message: str = ""
    problems: list[str] = field(default_factory=list)


def recommend(config: AutoScalingConfig, usage: WorkloadUsage, original: Resources, current: Resources,
              qos: str, age_ns: int, now: dt.datetime, default_zone: ZoneInfo,
              previous_cron: CronState | None, external_answer: dict[str, object] | None = None) -> Tick:
    """One tick for one workload. ``current`` is status.recommendation when set, else ``original``; the
    condition reason is the last recommender's that set one (percentile, cron, external in turn)."""
    problems = list(config.problems)
    outcomes = [percentile(config.auto_set, usage, original, current, qos, age_ns)]
    cron_outcome, cron_state, error = cron(config.cron_rules, previous_cron, original, now, default_zone)
    if error:
        problems.append(f"spec.autoScalingConfig.cronScalingRules: {error}")
    outcomes.append(cron_outcome)
    if external_answer is not None:
        if config.external is not None and age_ns < config.external.initial_delay_ns:
            age, delay = _go_duration(age_ns), _go_duration(config.external.initial_delay_ns)
            outcomes.append(Outcome(Result(Resources(), applied=True), LOW_CONFIDENCE,
                                    f"Workload created {age} ago, less than InitialDelayPeriod {delay}, "
                                    "no update performed"))
        else:
            ext, ext_problems = external(external_answer, current)
            problems += [f"spec.autoScalingConfig.externalScaler: answer: {p}" for p in ext_problems]
            outcomes.append(ext)
    rec = merge([o.result for o in outcomes], current)
    reason, message = "", ""
    for o in outcomes:
        if o.reason:
            reason, message = o.reason, o.message
    return Tick(rec, cron_state, reason, message, problems)


def go_quote(text: str) -> str:
    """Go's ``%q`` of a string (``strconv.Quote``): double quotes, Go's escapes, printable text kept."""
    escapes = {"\a": "\\a", "\b": "\\b", "\f": "\\f", "\n": "\\n", "\r": "\\r", "\t": "\\t",
               "\v": "\\v", "\\": "\\\\", '"': '\\"'}
    out = []
    for ch in text:
        if ch in escapes:
            out.append(escapes[ch])
        elif ch.isprintable():
            out.append(ch)
        elif ord(ch) < 0x80:
            out.append(f"\\x{ord(ch):02x}")
        elif ord(ch) <= 0xFFFF:
            out.append(f"\\u{ord(ch):04x}")
        else:
            out.append(f"\\U{ord(ch):08x}")
    return '"' + "".join(out) + '"'


def _tf(q: Fraction) -> str:
    return format_quantity(q, Format.DECIMAL_SI)


def _vr(q: Fraction) -> str:
    return format_quantity(q, Format.BINARY_SI)


def _go_duration(ns: int) -> str:
    """Go's ``time.Duration.String``: ``30m0s``, ``1h0m0.5s``, ``1.5s``, ``300ms``, ``0s``."""
    if ns == 0:
        return "0s"
    sign, u = ("-" if ns < 0 else ""), abs(ns)
    if u < 10**9:
        if u < 1000:
            return f"{sign}{u}ns"
        return sign + (_go_fraction(u, 3) + "\u00b5s" if u < 10**6 else _go_fraction(u, 6) + "ms")
    seconds = u // 10**9
    h, m, s = seconds // 3600, seconds // 60 % 60, seconds % 60
    return (sign + (f"{h}h" if h else "") + (f"{m}m" if h or m else "")
            + _go_fraction(s * 10**9 + u % 10**9, 9) + "s")


def _go_fraction(value: int, digits: int) -> str:
    whole, fraction = divmod(value, 10**digits)
    tail = str(fraction).rjust(digits, "0").rstrip("0")
    return f"{whole}.{tail}" if tail else str(whole)
