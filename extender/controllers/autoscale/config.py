"""The autoscaling loop's options."""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from extender.common.options import duration
from extender.common.timefmt import parse_duration

DEFAULT_INTERVAL = "30s"  # TensorFusion's autoScalingInterval
DEFAULT_INTERVAL_SECONDS = parse_duration(DEFAULT_INTERVAL).total_seconds()


@dataclass(frozen=True)
class AutoscaleOptions:
    enabled: bool = False
    interval_seconds: float = 30.0
    usage_file: str | None = None
    cron_zone: str = "UTC"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("workload autoscaling")
    group.add_argument("--autoscale", action=argparse.BooleanOptionalAction, default=False,
                       help="keep a TensorFusionWorkload per GPU workload, recommend from usage history and "
                            "resize workers in place where autoSetResources is enabled")
    group.add_argument("--autoscale-interval", metavar="DURATION", default=DEFAULT_INTERVAL_SECONDS,
                       type=duration("--autoscale-interval", positive=True, legacy_seconds=False),
                       help="how often every workload is evaluated (default 30s)")
    group.add_argument("--autoscale-usage-file", default=None,
                       help="read usage samples from this JSON file (a list of {namespace, workload, worker, "
                            "tflops, vram, time}), re-read every pass")
    group.add_argument("--autoscale-cron-time-zone", default="UTC",
                       help="IANA time zone of cronScalingRules without a CRON_TZ= prefix (default UTC)")


def from_args(args: argparse.Namespace) -> AutoscaleOptions:
    if not args.autoscale:
        return AutoscaleOptions()
    interval = float(args.autoscale_interval)  # a positive duration, checked by the parser
    try:
        ZoneInfo(str(args.autoscale_cron_time_zone))
    except (ZoneInfoNotFoundError, ValueError) as exc:
        raise SystemExit(f"--autoscale-cron-time-zone: {args.autoscale_cron_time_zone!r} is not an IANA "
                         "time zone") from exc
    return AutoscaleOptions(True, interval, args.autoscale_usage_file, str(args.autoscale_cron_time_zone))
