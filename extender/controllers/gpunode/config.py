"""Settings of the GPUNode writer as serve flags."""

from __future__ import annotations

import argparse
from dataclasses import dataclass

from extender.common.options import duration

DEFAULT_INTERVAL = 5.0


@dataclass(frozen=True)
class GPUNodeConfig:
    enabled: bool = True
    interval_seconds: float = DEFAULT_INTERVAL  # at most one write per GPUNode per interval
    concurrency: int = 4
    settle_seconds: float = 10.0  # how long our own write may take to come back through the watch

    def __post_init__(self) -> None:
        if self.interval_seconds <= 0:
            raise ValueError(f"--gpu-node-interval must be positive, got {self.interval_seconds}")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("GPUNode objects (kubectl get gpunode)")
    group.add_argument("--gpu-nodes", dest="gpu_nodes_enabled", action=argparse.BooleanOptionalAction,
                       default=True,
                       help="keep one GPUNode per GPU node (totals, availability, GPU count, phase) from the "
                            "ledger, owned by its Node (default on; off when TensorFusion's own controller "
                            "writes GPUNodes)")
    group.add_argument("--gpu-node-interval", type=duration("--gpu-node-interval", positive=True),
                       default=DEFAULT_INTERVAL, metavar="DURATION",
                       help="time between GPUNode passes: at most one write per GPUNode per pass, however "
                            "many pods bind (default 5s)")


def from_args(args: argparse.Namespace) -> GPUNodeConfig:
    return GPUNodeConfig(enabled=bool(args.gpu_nodes_enabled), interval_seconds=float(args.gpu_node_interval))
