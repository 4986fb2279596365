"""The workload autoscaler's options and ``serve`` flags."""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from extender.common.numbers import int_flag
from extender.common.options import duration
from extender.common.timefmt import parse_duration
from extender.controllers.autoscale.prometheus import (
    DEFAULT_MAX_POINTS,
    PRESETS,
    PrometheusOptions,
)

DEFAULT_INTERVAL = "30s"  # TensorFusion's autoScalingInterval
DEFAULT_INTERVAL_SECONDS = parse_duration(DEFAULT_INTERVAL).total_seconds()


@dataclass(frozen=True)
class AutoscaleOptions:
    enabled: bool = False
    interval_seconds: float = 30.0
    usage_file: str | None = None
    cron_zone: str = "UTC"
    prometheus: PrometheusOptions | None = None


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
    group.add_argument("--autoscale-prometheus-url", default=None,
                       help="read usage from this Prometheus (its HTTP API, e.g. http://prometheus:9090)")
    group.add_argument("--autoscale-usage-metrics", choices=sorted(PRESETS), default="dcgm",
                       help="which PromQL templates to start from: dcgm (NVIDIA dcgm-exporter, a shared GPU "
                            "apportioned by allocation share) or hypervisor (TensorFusion's worker metrics)")
    group.add_argument("--autoscale-tflops-query", default=None,
                       help="PromQL for TFLOPS in use per worker (a series per `pod`); $namespace and "
                            "$workload are substituted; overrides the preset's")
    group.add_argument("--autoscale-vram-query", default=None,
                       help="PromQL for VRAM bytes in use per worker, as --autoscale-tflops-query")
    group.add_argument("--autoscale-prometheus-step", default="30s", metavar="DURATION",
                       type=duration("--autoscale-prometheus-step", positive=True, legacy_seconds=False),
                       help="query_range step, a Go duration (default 30s)")
    group.add_argument("--autoscale-prometheus-max-points", type=int_flag(1), default=DEFAULT_MAX_POINTS,
                       help=f"points per query_range request; longer ranges are paged (default "
                            f"{DEFAULT_MAX_POINTS})")
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
    prometheus = prometheus_from_args(args)
    if prometheus is not None and args.autoscale_usage_file:
        raise SystemExit("--autoscale-prometheus-url and --autoscale-usage-file: give one usage source")
    return AutoscaleOptions(True, interval, args.autoscale_usage_file, str(args.autoscale_cron_time_zone),
                            prometheus)


def prometheus_from_args(args: argparse.Namespace) -> PrometheusOptions | None:
    url = getattr(args, "autoscale_prometheus_url", None)
    if not url:
        return None
    if not str(url).startswith(("http://", "https://")):
        raise SystemExit(f"--autoscale-prometheus-url: {url!r} is not an http(s) URL")
    step = float(args.autoscale_prometheus_step)  # a positive duration, checked by the parser
    points = int(args.autoscale_prometheus_max_points)
    if not 2 <= points <= 11000:
        raise SystemExit(f"--autoscale-prometheus-max-points: {points} is not in [2, 11000] "
                         "(Prometheus refuses more than 11000 points per series)")
    tflops, vram = PRESETS[str(args.autoscale_usage_metrics)]
    return PrometheusOptions(str(url), args.autoscale_tflops_query or tflops,
                             args.autoscale_vram_query or vram, step, points)
