"""A workload's ``autoScalingConfig`` (TensorFusion's ``AutoScalingConfig``) read from its JSON form.

What cannot be read falls back to TensorFusion's default, as TensorFusion does, and is named in
``AutoScalingConfig.problems`` (the field path, the value and why) so the workload's ``ResourceUpdate``
condition can say which field was ignored; TensorFusion only logs it.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from fractions import Fraction
from typing import Any

from extender.common.cron import CronError, CronSchedule
from extender.common.numbers import shown
from extender.common.quantity import QuantityError, parse_quantity

NS = 10**9
DEFAULT_HISTORY_PERIOD_NS = 2 * 3600 * NS
DEFAULT_INITIAL_DELAY_NS = 30 * 60 * NS
MAX_HISTORY_PERIOD_NS = 30 * 86400 * NS  # TensorFusion's limit on historyDataPeriod
QOS_LEVELS = ("low", "medium", "high", "critical")
TARGETS = ("all", "compute", "vram")


@dataclass(frozen=True)
class Resources:
    """Requests and limits of one worker per GPU: TFLOPS and VRAM bytes, exact."""

    req_tflops: Fraction = Fraction(0)
    req_vram: Fraction = Fraction(0)
    lim_tflops: Fraction = Fraction(0)
    lim_vram: Fraction = Fraction(0)

    def is_zero(self) -> bool:
        return not (self.req_tflops or self.req_vram or self.lim_tflops or self.lim_vram)

    @classmethod
    def from_json(cls, obj: Any, path: str, problems: list[str]) -> Resources:
        """TensorFusion's ``{requests: {tflops, vram}, limits: {tflops, vram}}``; absent parts are zero."""
        values: dict[str, Fraction] = {}
        obj = typed_fields(obj, path, {"requests": "object", "limits": "object"}, problems)
        for side in ("requests", "limits"):
            part = typed_fields(obj.get(side), f"{path}.{side}", {"tflops": "text", "vram": "text"}, problems)
            for name in ("tflops", "vram"):
                raw = part.get(name)
                value = Fraction(0)
                if raw not in (None, ""):
                    try:
                        value = parse_quantity(str(raw)).value
                    except QuantityError:
                        problems.append(f"{path}.{side}.{name}: {shown(raw)} is not a quantity")
                    else:
                        if value < 0:
                            problems.append(f"{path}.{side}.{name}: {shown(raw)} is negative")
                            value = Fraction(0)
                values[f"{side[:3]}_{name}"] = value
        return cls(values["req_tflops"], values["req_vram"], values["lim_tflops"], values["lim_vram"])


@dataclass(frozen=True)
class Percentiles:
    target_tflops: float = 0.95
    lower_tflops: float = 0.5
    upper_tflops: float = 0.99
    target_vram: float = 0.98
    lower_vram: float = 0.5
    upper_vram: float = 0.99
    margin: float = 0.15
    update_threshold: float = 0.1
    min_vram_ratio: float = 0.2
    max_vram_ratio: float = 5.0
    min_compute_ratio: float = 0.1
    max_compute_ratio: float = 10.0


# JSON field of autoSetResources -> Percentiles attribute, and whether it is a fraction of one
_FLOAT_FIELDS = (
    ("targetComputePercentile", "target_tflops", True),
    ("lowerBoundComputePercentile", "lower_tflops", True),
    ("upperBoundComputePercentile", "upper_tflops", True),
    ("targetVRAMPercentile", "target_vram", True),
    ("lowerBoundVRAMPercentile", "lower_vram", True),
    ("upperBoundVRAMPercentile", "upper_vram", True),
    ("marginFraction", "margin", False),
    ("updateThreshold", "update_threshold", False),
    ("minVRAMResourcesRatio", "min_vram_ratio", False),
    ("maxVRAMResourcesRatio", "max_vram_ratio", False),
    ("minComputeResourcesRatio", "min_compute_ratio", False),
    ("maxComputeResourcesRatio", "max_compute_ratio", False),
)


@dataclass(frozen=True)
class AutoSetResources:
    enable: bool
    target: str  # "all", "compute", "vram" or "" (recommend, apply nothing)
    percentiles: Percentiles
    history_period_ns: int
    initial_delay_ns: int
    interval_ns: int = 0  # autoSetResources.interval: how often the workload is evaluated; 0: every pass

    @property
    def read_history_ns(self) -> int:
        """How far back usage is read when the workload is first seen: the period, at most 30 days."""
        return min(self.history_period_ns, MAX_HISTORY_PERIOD_NS)

    def scales(self, resource: str) -> bool:
        """Whether a resize may move ``resource`` ("compute" or "vram")."""
        return self.enable and self.target in ("all", resource)


@dataclass(frozen=True)
class CronRule:
    name: str
    start: CronSchedule  # each with its CRON_TZ= zone, if any (else the controller's configured zone)
    end: CronSchedule
    desired: Resources
    raw: dict[str, Any]


@dataclass(frozen=True)
class ExternalScaler:
    url: str
    secret_namespace: str
    secret_name: str
    initial_delay_ns: int


@dataclass(frozen=True)
class AutoScalingConfig:
    auto_set: AutoSetResources | None = None
    cron_rules: tuple[CronRule, ...] = ()
    external: ExternalScaler | None = None
    problems: tuple[str, ...] = field(default=())

    def configured(self) -> bool:
        return self.auto_set is not None or bool(self.cron_rules) or self.external is not None


BASE = "spec.autoScalingConfig"


_KINDS = {"bool": "a boolean", "text": "text", "number": "a number", "object": "an object"}


def _of_kind(raw: Any, kind: str) -> bool:
    if kind == "bool":
        return isinstance(raw, bool)
    if kind == "object":
        return isinstance(raw, dict)
    if isinstance(raw, bool) or not isinstance(raw, str | int | float):
        return False  # YAML may give text as a number, never as a boolean, a list or a date
    return kind == "number" or not isinstance(raw, float) or math.isfinite(raw)


def typed_fields(obj: Any, path: str, kinds: dict[str, str], problems: list[str]) -> dict[str, Any]:
    """``obj`` (an object, else none) without the fields whose value is not of the kind the CRD gives them
    (``kinds``: bool, text, number, object), each named: the API server refuses such values, a snapshot
    may still hold them, and the parsers then read the field as absent."""
    if obj is None:
        return {}
    if not isinstance(obj, dict):
        problems.append(f"{path}: {shown(obj)} is not an object; read as absent")
        return {}
    wrong = [key for key, kind in kinds.items() if obj.get(key) not in (None, "")
             and not _of_kind(obj[key], kind)]
    for key in wrong:
        problems.append(f"{path}.{key}: {shown(obj[key])} is not {_KINDS[kinds[key]]}; read as absent")
    return {k: v for k, v in obj.items() if k not in wrong}


def parse_config(obj: Any, path: str = BASE) -> AutoScalingConfig:
    problems: list[str] = []
    if not isinstance(obj, dict):
        if obj not in (None, {}):
            problems.append(f"{path}: expected an object")
        return AutoScalingConfig(problems=tuple(problems))
    auto_set = _auto_set(obj.get("autoSetResources"), f"{path}.autoSetResources", problems)
    rules = _cron_rules(obj.get("cronScalingRules"), f"{path}.cronScalingRules", problems)
    external = _external(obj.get("externalScaler"), f"{path}.externalScaler", problems)
    return AutoScalingConfig(auto_set, rules, external, tuple(problems))


_GO_UNITS_NS = {"ns": 1, "us": 1000, "\u00b5s": 1000, "\u03bcs": 1000, "ms": 10**6, "s": NS, "m": 60 * NS,
                "h": 3600 * NS}
_GO_DURATION_PART = re.compile(r"([0-9]*)(?:\.([0-9]*))?([^0-9.]*)")


def go_duration_ns(text: str) -> int:
    """Go's ``time.ParseDuration`` (TensorFusion reads every duration of autoScalingConfig with it), in
    nanoseconds: an optional sign, then number-unit parts (``1h30m``, ``1.5h``, ``300ms``), or a bare
    ``0``; no spaces. ``ValueError`` for anything Go refuses."""
    rest, negative = text, False
    if rest[:1] in ("-", "+"):
        negative, rest = rest[0] == "-", rest[1:]
    if rest == "0":
        return 0
    if not rest:
        raise ValueError(f"{text!r} is not a duration")
    total = 0
    while rest:
        match = _GO_DURATION_PART.match(rest)
        assert match is not None  # every group may be empty
        whole, fraction, unit = match.group(1), match.group(2), match.group(3)
        if not whole and not fraction:
            raise ValueError(f"{text!r} is not a duration")
        if unit not in _GO_UNITS_NS:
            raise ValueError(f"{text!r}: {'missing' if not unit else 'unknown'} unit {unit!r}")
        scale = _GO_UNITS_NS[unit]
        value = int(whole or "0") * scale
        if fraction:
            digits = fraction[:18].rstrip("0") or "0"
            value += int(float(int(digits)) * (float(scale) / 10 ** len(digits)))
        total += value
        if total > 2**63 - (0 if negative else 1):
            raise ValueError(f"{text!r} is out of range")
        rest = rest[match.end():]
    return -total if negative else total


_GO_DECIMAL = re.compile(r"[+-]?(?:[0-9]+\.?[0-9]*|\.[0-9]+)(?:[eE][+-]?[0-9]+)?")
_GO_HEX = re.compile(r"[+-]?0[xX](?:[0-9a-fA-F]+\.?[0-9a-fA-F]*|\.[0-9a-fA-F]+)[pP][+-]?[0-9]+")
_GO_SPECIAL = re.compile(r"[+-]?(?:inf|infinity)|nan", re.IGNORECASE)


def go_float(text: str) -> float:
    """Go's ``strconv.ParseFloat(text, 64)`` as TensorFusion reads autoSetResources' numbers: no spaces,
    no digit underscores, hex floats need a ``p`` exponent, out of range is an error."""
    if _GO_SPECIAL.fullmatch(text):
        return float(text)
    if _GO_HEX.fullmatch(text):
        value = float.fromhex(text)
    elif _GO_DECIMAL.fullmatch(text):
        value = float(text)
    else:
        raise ValueError(f"{text!r} is not a number")
    if math.isinf(value):
        raise ValueError(f"{text!r} is out of range")
    return value


def _duration(raw: Any, default_ns: int, where: str, problems: list[str], *, positive: bool = False) -> int:
    """A duration as TensorFusion reads it: empty is the default; what Go cannot read is named and the
    default used (TensorFusion logs it); zero and negative values are kept (a delay of ``0s`` is none)
    unless ``positive`` (where TensorFusion divides by the value or cannot start a ticker with it)."""
    if raw in (None, ""):
        return default_ns
    try:
        ns = go_duration_ns(str(raw))
    except ValueError:
        problems.append(f"{where}: {shown(raw)} is not a duration (like 30m or 2h); using the default")
        return default_ns
    if positive and ns <= 0:
        problems.append(f"{where}: {shown(raw)} must be positive; using the default")
        return default_ns
    return ns


def _auto_set(obj: Any, path: str, problems: list[str]) -> AutoSetResources | None:
    if obj is None:
        return None
    if not isinstance(obj, dict):
        problems.append(f"{path}: expected an object")
        return None
    obj = typed_fields(obj, path, {"enable": "bool", "targetResource": "text", "historyDataPeriod": "text",
                                   "initialDelayPeriod": "text", "interval": "text",
                                   **{key: "number" for key, _, _ in _FLOAT_FIELDS}}, problems)
    values: dict[str, float] = {}
    defaults = Percentiles()
    for key, attr, is_percentile in _FLOAT_FIELDS:
        raw = obj.get(key)
        if raw in (None, ""):
            continue
        try:
            value = go_float(str(raw))
        except ValueError:
            problems.append(f"{path}.{key}: {shown(raw)} is not a number; using the default "
                            f"{getattr(defaults, attr)}")
            continue
        if not math.isfinite(value) or value < 0 or (is_percentile and value > 1):
            allowed = "0-1" if is_percentile else "0 and up"
            problems.append(f"{path}.{key}: {shown(raw)} is outside {allowed}; "
                            f"using the default {getattr(defaults, attr)}")
            continue
        values[attr] = value
    target = str(obj.get("targetResource") or "").lower()
    if target and target not in TARGETS:
        problems.append(f"{path}.targetResource: {shown(obj.get('targetResource'))} is not one of "
                        f"{', '.join(TARGETS)}; nothing is resized")
        target = ""
    # the histograms' half-life is half of the period, however long; only the history read at start is
    # capped at 30 days (``read_history_ns``), as TensorFusion's workload handler and metrics loader do
    history = _duration(obj.get("historyDataPeriod"), DEFAULT_HISTORY_PERIOD_NS, f"{path}.historyDataPeriod",
                        problems, positive=True)
    return AutoSetResources(
        enable=obj.get("enable") is True,
        target=target,
        percentiles=Percentiles(**values),
        history_period_ns=history,
        initial_delay_ns=_duration(obj.get("initialDelayPeriod"), DEFAULT_INITIAL_DELAY_NS,
                                   f"{path}.initialDelayPeriod", problems),
        interval_ns=_duration(obj.get("interval"), 0, f"{path}.interval", problems, positive=True),
    )


def _cron_rules(obj: Any, path: str, problems: list[str]) -> tuple[CronRule, ...]:
    if obj is None:
        return ()
    if not isinstance(obj, list):
        problems.append(f"{path}: expected a list")
        return ()
    rules: list[CronRule] = []
    for i, raw in enumerate(obj):
        where = f"{path}[{i}]"
        if not isinstance(raw, dict):
            problems.append(f"{where}: expected an object")
            continue
        raw = typed_fields(raw, where, {"enable": "bool", "name": "text", "start": "text", "end": "text",
                                        "desiredResources": "object"}, problems)
        # TensorFusion skips these silently
        if raw.get("enable") is not True or not raw.get("name") or not raw.get("start") or not raw.get("end"):
            continue
        if raw["start"] == raw["end"]:
            problems.append(f"{where}: start and end are the same ({shown(raw['start'])}); rule ignored")
            continue
        parsed = []
        for key in ("start", "end"):
            try:  # the whole string, CRON_TZ= prefix included, as TensorFusion's parser reads it
                parsed.append(CronSchedule.parse(str(raw[key])))
            except CronError as err:
                problems.append(f"{where}.{key}: {shown(raw[key])}: {str(err)[:200]}; rule ignored")
        if len(parsed) != 2:
            continue
        desired = Resources.from_json(raw.get("desiredResources"), f"{where}.desiredResources", problems)
        rules.append(CronRule(str(raw["name"]), parsed[0], parsed[1], desired, raw))
    return tuple(rules)


def _external(obj: Any, path: str, problems: list[str]) -> ExternalScaler | None:
    if obj is None:
        return None
    if not isinstance(obj, dict):
        problems.append(f"{path}: expected an object")
        return None
    obj = typed_fields(obj, path, {"enable": "bool", "url": "text", "initialDelayPeriod": "text",
                                   "apiKeySecretRef": "object"}, problems)
    if obj.get("enable") is not True:
        return None
    url = str(obj.get("url") or "")
    if not url.startswith(("http://", "https://")):
        problems.append(f"{path}.url: {shown(obj.get('url'))} is not an http(s) URL; external scaler ignored")
        return None
    raw_ref = obj.get("apiKeySecretRef")
    ref: dict[str, Any] = raw_ref if isinstance(raw_ref, dict) else {}
    return ExternalScaler(url, str(ref.get("namespace") or ""), str(ref.get("name") or ""),
                          _duration(obj.get("initialDelayPeriod"), DEFAULT_INITIAL_DELAY_NS,
                                    f"{path}.initialDelayPeriod", problems))
