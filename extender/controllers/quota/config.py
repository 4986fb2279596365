"""Settings of the GPU quota controller as serve flags."""

from __future__ import annotations

import argparse
from dataclasses import dataclass

from extender.common.options import duration

DEFAULT_INTERVAL = 5.0


@dataclass(frozen=True)
class QuotaConfig:
    enabled: bool = True
    interval_seconds: float = DEFAULT_INTERVAL  # status writes: at most one per quota per interval

    def __post_init__(self) -> None:
        if self.interval_seconds <= 0:
            raise ValueError(f"--gpu-quota-status-interval must be positive, got {self.interval_seconds}")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("GPU quotas (GPUResourceQuota, docs/quota.md)")
    group.add_argument("--gpu-quotas", dest="gpu_quotas_enabled", action=argparse.BooleanOptionalAction,
                       default=True,
                       help="enforce each namespace's GPUResourceQuota at filter and bind, and keep its "
                            "status (the leader writes it) (default on)")
    group.add_argument("--gpu-quota-status-interval",
                       type=duration("--gpu-quota-status-interval", positive=True),
                       default=DEFAULT_INTERVAL, metavar="DURATION",
                       help="time between GPUResourceQuota status passes: at most one write per quota per "
                            "pass (default 5s)")


def from_args(args: argparse.Namespace) -> QuotaConfig:
    return QuotaConfig(enabled=bool(args.gpu_quotas_enabled),
                       interval_seconds=float(args.gpu_quota_status_interval))
