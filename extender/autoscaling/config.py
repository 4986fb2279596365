"""A workload's ``autoScalingConfig`` (TensorFusion's ``AutoScalingConfig``) read from its JSON form.

What cannot be read falls back to TensorFusion's default, as TensorFusion does, and is named in
``AutoScalingConfig.problems`` (the field path, the value and why) so the workload's ``ResourceUpdate``
condition can say which field was ignored; TensorFusion only logs it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from fractions import Fraction
from typing import Any
from zoneinfo import ZoneInfo

from extender.common.cron import CronError, CronSchedule
from extender.common.quantity import QuantityError, parse_quantity
from extender.common.timefmt import parse_duration

NS = 10**9
DEFAULT_HISTORY_PERIOD_NS = 2 * 3600 * NS
DEFAULT_INITIAL_DELAY_NS = 30 * 60 * NS
MAX_HISTORY_PERIOD_NS = 30 * 86400 * NS  # TensorFusion's limit on historyDataPeriod
QOS_LEVELS = ("low", "medium", "high", "critical")
TARGETS = ("all", "compute", "vram")
CRON_TZ_PREFIXES = ("CRON_TZ=", "TZ=")


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
        obj = obj if isinstance(obj, dict) else {}
        for side in ("requests", "limits"):
            part = obj.get(side) if isinstance(obj.get(side), dict) else {}
            for name in ("tflops", "vram"):
                raw = part.get(name)
                value = Fraction(0)
                if raw not in (None, ""):
                    try:
                        value = parse_quantity(str(raw)).value
                    except QuantityError:
                        problems.append(f"{path}.{side}.{name}: {raw!r} is not a quantity")
                    else:
                        if value < 0:
                            problems.append(f"{path}.{side}.{name}: {raw!r} is negative")
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

    def scales(self, resource: str) -> bool:
        """Whether a resize may move ``resource`` ("compute" or "vram")."""
        return self.enable and self.target in ("all", resource)


@dataclass(frozen=True)
class CronRule:
    name: str
    start: CronSchedule
    end: CronSchedule
    start_zone: str | None  # a CRON_TZ=/TZ= prefix; None: the controller's configured zone
    end_zone: str | None
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


def _duration(raw: Any, default_ns: int, where: str, problems: list[str]) -> int:
    if raw in (None, ""):
        return default_ns
    try:
        value = parse_duration(str(raw))
    except ValueError:
        problems.append(f"{where}: {raw!r} is not a duration (like 30m or 2h); using the default")
        return default_ns
    ns = (value.days * 86400 + value.seconds) * NS + value.microseconds * 1000
    if ns <= 0:
        problems.append(f"{where}: {raw!r} must be positive; using the default")
        return default_ns
    return ns


def _auto_set(obj: Any, path: str, problems: list[str]) -> AutoSetResources | None:
    if obj is None:
        return None
    if not isinstance(obj, dict):
        problems.append(f"{path}: expected an object")
        return None
    values: dict[str, float] = {}
    defaults = Percentiles()
    for key, attr, is_percentile in _FLOAT_FIELDS:
        raw = obj.get(key)
        if raw in (None, ""):
            continue
        try:
            text = str(raw).strip()
            if "_" in text:  # Python reads 1_0 as 10; Go's ParseFloat, as TensorFusion uses it, does not
                raise ValueError(text)
            value = float(text)
        except ValueError:
            problems.append(f"{path}.{key}: {raw!r} is not a number; using the default "
                            f"{getattr(defaults, attr)}")
            continue
        if not math.isfinite(value) or value < 0 or (is_percentile and value > 1):
            problems.append(f"{path}.{key}: {raw!r} is outside {'0-1' if is_percentile else '0 and up'}; "
                            f"using the default {getattr(defaults, attr)}")
            continue
        values[attr] = value
    target = str(obj.get("targetResource") or "").lower()
    if target and target not in TARGETS:
        problems.append(f"{path}.targetResource: {obj.get('targetResource')!r} is not one of "
                        f"{', '.join(TARGETS)}; nothing is resized")
        target = ""
    history = _duration(obj.get("historyDataPeriod"), DEFAULT_HISTORY_PERIOD_NS, f"{path}.historyDataPeriod",
                        problems)
    if history > MAX_HISTORY_PERIOD_NS:
        problems.append(f"{path}.historyDataPeriod: {obj.get('historyDataPeriod')!r} is longer than 30 days; "
                        "using 30 days")
        history = MAX_HISTORY_PERIOD_NS
    return AutoSetResources(
        enable=obj.get("enable") is True,
        target=target,
        percentiles=Percentiles(**values),
        history_period_ns=history,
        initial_delay_ns=_duration(obj.get("initialDelayPeriod"), DEFAULT_INITIAL_DELAY_NS,
                                   f"{path}.initialDelayPeriod", problems),
        interval_ns=_duration(obj.get("interval"), 0, f"{path}.interval", problems),
    )


def split_zone(text: str) -> tuple[str | None, str]:
    """``CRON_TZ=Europe/Berlin 0 9 * * 1-5`` -> ("Europe/Berlin", "0 9 * * 1-5"), as robfig/cron reads it."""
    stripped = text.strip()
    for prefix in CRON_TZ_PREFIXES:
        if stripped.startswith(prefix):
            zone, _, rest = stripped[len(prefix):].partition(" ")
            return zone, rest.strip()
    return None, stripped


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
        # TensorFusion skips these silently
        if raw.get("enable") is not True or not raw.get("name") or not raw.get("start") or not raw.get("end"):
            continue
        if raw["start"] == raw["end"]:
            problems.append(f"{where}: start and end are the same ({raw['start']!r}); rule ignored")
            continue
        parsed = []
        for key in ("start", "end"):
            zone, expression = split_zone(str(raw[key]))
            try:
                if zone is not None:
                    ZoneInfo(zone)
                parsed.append((zone, CronSchedule.parse(expression)))
            except CronError as err:
                problems.append(f"{where}.{key}: {raw[key]!r}: {err}; rule ignored")
            except (ValueError, KeyError, OSError):
                problems.append(f"{where}.{key}: {zone!r} is not an IANA time zone; rule ignored")
        if len(parsed) != 2:
            continue
        desired = Resources.from_json(raw.get("desiredResources"), f"{where}.desiredResources", problems)
        rules.append(CronRule(str(raw["name"]), parsed[0][1], parsed[1][1], parsed[0][0], parsed[1][0],
                              desired, raw))
    return tuple(rules)


def _external(obj: Any, path: str, problems: list[str]) -> ExternalScaler | None:
    if obj is None:
        return None
    if not isinstance(obj, dict):
        problems.append(f"{path}: expected an object")
        return None
    if obj.get("enable") is not True:
        return None
    url = str(obj.get("url") or "")
    if not url.startswith(("http://", "https://")):
        problems.append(f"{path}.url: {obj.get('url')!r} is not an http(s) URL; external scaler ignored")
        return None
    raw_ref = obj.get("apiKeySecretRef")
    ref: dict[str, Any] = raw_ref if isinstance(raw_ref, dict) else {}
    return ExternalScaler(url, str(ref.get("namespace") or ""), str(ref.get("name") or ""),
                          _duration(obj.get("initialDelayPeriod"), DEFAULT_INITIAL_DELAY_NS,
                                    f"{path}.initialDelayPeriod", problems))
