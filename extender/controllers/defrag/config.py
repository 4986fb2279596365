"""A pool's defragmentation settings: ``spec.nodeManagerConfig.nodeCompaction.defrag`` of a GPUPool, and
the defragmenter's own ``tf-extender serve`` flags (``DefragOptions``).

The fields and defaults are TensorFusion's: ``enabled`` (false), ``schedule`` (five-field cron, ``0 3 * * *``,
no ``TZ=`` prefix), ``timezone`` (IANA name, required when enabled), ``maxDuration`` (Go duration, ``2h``)
and ``utilizationThresholdPercent`` (0..100, 40). Parsing is pure; a bad value is a ``DefragConfigError``
whose message names the field and the value.
"""

from __future__ import annotations

import argparse
import datetime as dt
import zoneinfo
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from extender.common.cron import CronError, CronSchedule
from extender.common.numbers import shown
from extender.common.options import duration
from extender.common.timefmt import parse_duration

FIELD = "spec.nodeManagerConfig.nodeCompaction.defrag"
DEFAULT_SCHEDULE = "0 3 * * *"
DEFAULT_MAX_DURATION = dt.timedelta(hours=2)
MAX_DURATION = dt.timedelta(days=7)  # a run's deadline is computed from it: far below what a datetime holds
DEFAULT_THRESHOLD = 40
DEFAULT_TICK_SECONDS = 5.0
DEFAULT_REPLACEMENT_TIMEOUT_SECONDS = 300.0


class DefragConfigError(ValueError):
    """The pool's defrag settings cannot be used; the message is meant for the user."""


_DEFAULT_CRON = CronSchedule.parse(DEFAULT_SCHEDULE)


@dataclass(frozen=True)
class DefragConfig:
    enabled: bool = False
    schedule: CronSchedule = _DEFAULT_CRON
    timezone: zoneinfo.ZoneInfo | None = None
    max_duration: dt.timedelta = DEFAULT_MAX_DURATION
    threshold_percent: int = DEFAULT_THRESHOLD

    @property
    def scheduled(self) -> bool:
        """Whether cron runs apply (a manual run needs no timezone)."""
        return self.enabled and self.timezone is not None


def defrag_section(pool: Mapping[str, Any]) -> Mapping[str, Any]:
    """The raw ``defrag`` mapping of a GPUPool object ({} when absent)."""
    spec = pool.get("spec")
    node_manager = spec.get("nodeManagerConfig") if isinstance(spec, Mapping) else None
    compaction = node_manager.get("nodeCompaction") if isinstance(node_manager, Mapping) else None
    section = compaction.get("defrag") if isinstance(compaction, Mapping) else None
    return section if isinstance(section, Mapping) else {}


def parse_config(pool: Mapping[str, Any]) -> DefragConfig:
    """The pool's settings with defaults; raises ``DefragConfigError`` for a value that cannot be used."""
    raw = defrag_section(pool)
    section: Any = pool
    path = ""
    for key in ("spec", "nodeManagerConfig", "nodeCompaction", "defrag"):  # a wrong type on the way is named
        section, path = section.get(key), f"{path}.{key}".lstrip(".")
        if section is None:
            break
        if not isinstance(section, Mapping):
            raise DefragConfigError(f"{path}={shown(section)}: expected an object")
    enabled = raw.get("enabled", False)
    if not isinstance(enabled, bool):
        raise DefragConfigError(f"{FIELD}.enabled must be true or false, got {shown(enabled)}")
    schedule_text = raw.get("schedule", DEFAULT_SCHEDULE)
    if not isinstance(schedule_text, str):
        raise DefragConfigError(f"{FIELD}.schedule must be a string, got {shown(schedule_text)}")
    if "=" in schedule_text:
        raise DefragConfigError(f"{FIELD}.schedule {shown(schedule_text)} must not carry a TZ= prefix; "
                                f"set {FIELD}.timezone instead")
    try:
        schedule = CronSchedule.parse(schedule_text)
    except CronError as exc:
        raise DefragConfigError(f"{FIELD}.schedule {shown(schedule_text)}: {exc}") from exc
    timezone = _timezone(raw.get("timezone"), enabled)
    max_duration_text = raw.get("maxDuration", "2h")
    try:
        if not isinstance(max_duration_text, str):
            raise ValueError(f"{shown(max_duration_text)} is not a duration like 90s, 5m or 1h30m")
        max_duration = parse_duration(max_duration_text)
    except ValueError as exc:
        raise DefragConfigError(f"{FIELD}.maxDuration: {exc}") from exc
    if max_duration <= dt.timedelta(0) or max_duration > MAX_DURATION:
        raise DefragConfigError(f"{FIELD}.maxDuration must be positive and at most {MAX_DURATION.days} days, "
                                f"got {shown(max_duration_text)}")
    threshold = raw.get("utilizationThresholdPercent", DEFAULT_THRESHOLD)
    if isinstance(threshold, bool) or not isinstance(threshold, int) or not 0 <= threshold <= 100:
        raise DefragConfigError(
            f"{FIELD}.utilizationThresholdPercent must be an integer from 0 to 100, got {shown(threshold)}")
    return DefragConfig(enabled, schedule, timezone, max_duration, threshold)


def _timezone(value: object, enabled: bool) -> zoneinfo.ZoneInfo | None:
    if value is None or value == "":
        if enabled:
            raise DefragConfigError(f"{FIELD}.timezone is required when defrag is enabled "
                                    "(an IANA name such as UTC or Europe/Berlin)")
        return None
    if not isinstance(value, str):
        raise DefragConfigError(f"{FIELD}.timezone must be an IANA name, got {shown(value)}")
    try:
        return zoneinfo.ZoneInfo(value)
    except (zoneinfo.ZoneInfoNotFoundError, ValueError, OSError) as exc:
        raise DefragConfigError(f"{FIELD}.timezone {shown(value)} is not a known IANA time zone") from exc


@dataclass(frozen=True)
class DefragOptions:
    """How the live defragmenter runs in this process (the pools say when and what)."""

    enabled: bool = True
    replacement_timeout: float = DEFAULT_REPLACEMENT_TIMEOUT_SECONDS
    tick_seconds: float = DEFAULT_TICK_SECONDS


def add_arguments(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("defragmentation (GPUPool nodeCompaction.defrag)")
    group.add_argument("--defrag", action=argparse.BooleanOptionalAction, default=True,
                       help="run defragmentation for GPUPools that enable it (nodeCompaction.defrag) or "
                            "carry the tensor-fusion.ai/manual-defrag annotation (default on)")
    group.add_argument("--defrag-replacement-timeout", metavar="DURATION",
                       type=duration("--defrag-replacement-timeout", positive=True),
                       default=DEFAULT_REPLACEMENT_TIMEOUT_SECONDS,
                       help="how long a defragmentation run waits for an evicted pod's replacement to be "
                            "bound before it stops (default 5m)")


def from_args(args: argparse.Namespace) -> DefragOptions:
    return DefragOptions(enabled=bool(args.defrag),
                         replacement_timeout=float(args.defrag_replacement_timeout))
