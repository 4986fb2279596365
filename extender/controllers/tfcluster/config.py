"""Settings of the TensorFusionCluster controller as serve flags."""

from __future__ import annotations

import argparse
from dataclasses import dataclass

from extender.cloud.vendor import DEFAULT_KEY_DIR, Endpoint
from extender.common.options import duration

DEFAULT_INTERVAL = 30.0


@dataclass(frozen=True)
class TFClusterConfig:
    enabled: bool = True
    interval_seconds: float = DEFAULT_INTERVAL
    cloud_key_dir: str = DEFAULT_KEY_DIR  # --cloud-key-dir (a capacity flag): where key files may be
    cloud_endpoints: tuple[Endpoint, ...] = ()  # --cloud-endpoint-allow (a capacity flag)

    def __post_init__(self) -> None:
        if self.interval_seconds <= 0:
            raise ValueError(f"--tensorfusion-cluster-interval must be positive, got {self.interval_seconds}")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("TensorFusionCluster controller (GPUPools from spec.gpuPools)")
    group.add_argument("--tensorfusion-clusters", dest="tfcluster_enabled",
                       action=argparse.BooleanOptionalAction, default=True,
                       help="derive, update and delete each TensorFusionCluster's GPUPools and write its "
                            "status (default on; the leader only; off when TensorFusion's own controller "
                            "runs)")
    group.add_argument("--tensorfusion-cluster-interval",
                       type=duration("--tensorfusion-cluster-interval", positive=True),
                       default=DEFAULT_INTERVAL, metavar="DURATION",
                       help="reconcile every TensorFusionCluster this often at the latest (default 30s)")


def from_args(args: argparse.Namespace) -> TFClusterConfig:
    return TFClusterConfig(enabled=bool(args.tfcluster_enabled),
                           interval_seconds=float(args.tensorfusion_cluster_interval),
                           cloud_key_dir=str(getattr(args, "cloud_key_dir", DEFAULT_KEY_DIR)),
                           cloud_endpoints=_endpoints(getattr(args, "cloud_endpoint_allow", ())))


def _endpoints(value: object) -> tuple[Endpoint, ...]:
    from extender.cloud.vendor import parse_endpoint_allow

    return value if isinstance(value, tuple) else parse_endpoint_allow(str(value or ""))
