"""Settings of the capacity controllers (Karpenter provisioning mode and compaction) as serve flags."""

from __future__ import annotations

import argparse
from dataclasses import dataclass

from extender.cloud.vendor import DEFAULT_KEY_DIR, ENDPOINT_FLAG, Endpoint, parse_endpoint_allow
from extender.common.options import duration
from extender.controllers import LEADER_LEASE
from extender.planning.removal import DEFAULT_PROTECTION_SECONDS

DEFAULT_INTERVAL = 10.0
# How young a tensor-fusion.ai/manual-compaction timestamp must be to trigger a compaction.
DEFAULT_MANUAL_WINDOW = 60.0
DEFAULT_CLUSTER_NAME = "tensor-fusion"
DEFAULT_JOIN_TIMEOUT = 900.0
DEFAULT_ORPHAN_GRACE = 600.0
DEFAULT_CAPACITY_BACKOFF = 300.0


@dataclass(frozen=True)
class CapacityConfig:
    enabled: bool = True
    interval_seconds: float = DEFAULT_INTERVAL
    protection_seconds: float = DEFAULT_PROTECTION_SECONDS
    manual_window_seconds: float = DEFAULT_MANUAL_WINDOW
    catalog_file: str | None = None
    catalog_configmap: str | None = None  # NAMESPACE/NAME
    # Provisioned mode (VMs through the cloud's API)
    computing_vendor_file: str | None = None
    cluster_name: str = DEFAULT_CLUSTER_NAME
    join_timeout_seconds: float = DEFAULT_JOIN_TIMEOUT
    orphan_grace_seconds: float = DEFAULT_ORPHAN_GRACE
    capacity_backoff_seconds: float = DEFAULT_CAPACITY_BACKOFF
    cloud_key_dir: str = DEFAULT_KEY_DIR
    # --cloud-endpoint-allow: the endpoints a cluster object's extraParams may point the cloud client at
    cloud_endpoints: tuple[Endpoint, ...] = ()

    def __post_init__(self) -> None:
        if self.interval_seconds <= 0:
            raise ValueError(f"capacity interval must be positive, got {self.interval_seconds}")
        if self.protection_seconds < 0:
            raise ValueError(f"node protection time must not be negative, got {self.protection_seconds}")
        for flag, value in (("--node-join-timeout", self.join_timeout_seconds),
                            ("--orphan-grace", self.orphan_grace_seconds),
                            ("--capacity-error-backoff", self.capacity_backoff_seconds)):
            if value <= 0:
                raise ValueError(f"{flag} must be positive, got {value}")
        if not self.cluster_name:
            raise ValueError("--cluster-name must not be empty")
        if self.catalog_configmap is not None and self.catalog_configmap.count("/") != 1:
            raise ValueError(f"--catalog-configmap {self.catalog_configmap!r}: expected NAMESPACE/NAME")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group(
        "capacity controllers (Karpenter provisioning mode: GPUNodeClaims from pool targets; compaction)")
    group.add_argument("--capacity-controllers", dest="capacity_enabled",
                       action=argparse.BooleanOptionalAction, default=True,
                       help="run the Karpenter-mode provisioner and the compaction of empty nodes "
                            f"(default on; one active per cluster, Lease {LEADER_LEASE})")
    group.add_argument("--capacity-interval", type=duration("--capacity-interval", positive=True),
                       default=DEFAULT_INTERVAL, metavar="DURATION",
                       help="reconcile pools this often at the latest (default 10s)")
    group.add_argument("--node-protection-time", type=duration("--node-protection-time"),
                       default=DEFAULT_PROTECTION_SECONDS, metavar="DURATION",
                       help="never remove an empty node younger than this (default 5m)")
    group.add_argument("--catalog", dest="catalog_file", default=None, metavar="CATALOG.yaml",
                       help="instance types over the built-in catalog (see tf-extender plan)")
    group.add_argument("--catalog-configmap", default=None, metavar="NAMESPACE/NAME",
                       help="a ConfigMap whose catalog.yaml extends the catalog; read on every reconcile")
    group.add_argument("--computing-vendor", dest="computing_vendor_file", default=None, metavar="FILE.yaml",
                       help="Provisioned mode: the computingVendor (type aws or alibaba, "
                            "params.defaultRegion, accessKeyPath/secretKeyPath, extraParams) of pools no "
                            "TensorFusionCluster owns, or whose cluster has none (a derived pool uses its "
                            "cluster's spec.computingVendor); read on every reconcile")
    group.add_argument("--cloud-key-dir", default=DEFAULT_KEY_DIR, metavar="DIR",
                       help="Provisioned mode: a TensorFusionCluster's (or a claim's recorded) "
                            "computingVendor may name key files only under this directory; "
                            f"--computing-vendor's file is yours and exempt (default {DEFAULT_KEY_DIR})")
    group.add_argument(ENDPOINT_FLAG, dest="cloud_endpoint_allow", default="", metavar="HOST[,HOST...]",
                       type=endpoint_allow,
                       help="Provisioned mode: the endpoints a TensorFusionCluster's (or a claim's recorded) "
                            "computingVendor.params.extraParams.endpoint may name, comma-separated "
                            "(host[:port] or https://host[:port]; no port: any port of the host; http:// "
                            "only for a loopback host); any other is refused with a condition naming it. "
                            "--computing-vendor's file is yours and exempt (default none)")
    group.add_argument("--cluster-name", default=DEFAULT_CLUSTER_NAME,
                       help="Provisioned mode: the tag tensor-fusion.ai/cluster on every VM; the orphan "
                            f"sweep terminates only VMs tagged with it (default {DEFAULT_CLUSTER_NAME})")
    group.add_argument("--node-join-timeout", type=duration("--node-join-timeout", positive=True),
                       default=DEFAULT_JOIN_TIMEOUT, metavar="DURATION",
                       help="Provisioned mode: terminate a VM whose Node has not joined after this long "
                            "(default 15m)")
    group.add_argument("--orphan-grace", type=duration("--orphan-grace"), default=DEFAULT_ORPHAN_GRACE,
                       metavar="DURATION",
                       help="Provisioned mode: terminate a VM tagged for this cluster that no GPUNodeClaim "
                            "owns once it is this old (default 10m)")
    group.add_argument("--capacity-error-backoff", type=duration("--capacity-error-backoff"),
                       default=DEFAULT_CAPACITY_BACKOFF, metavar="DURATION",
                       help="Provisioned mode: an offering the cloud refused for lack of capacity is not "
                            "tried again for this long; a pool whose launch failed otherwise waits as long "
                            "(default 5m)")

def from_args(args: argparse.Namespace) -> CapacityConfig:
    return CapacityConfig(
        enabled=bool(args.capacity_enabled), interval_seconds=float(args.capacity_interval),
        protection_seconds=float(args.node_protection_time), catalog_file=args.catalog_file,
        catalog_configmap=args.catalog_configmap, computing_vendor_file=args.computing_vendor_file,
        cluster_name=str(args.cluster_name), join_timeout_seconds=float(args.node_join_timeout),
        orphan_grace_seconds=float(args.orphan_grace),
        capacity_backoff_seconds=float(args.capacity_error_backoff), cloud_key_dir=str(args.cloud_key_dir),
        cloud_endpoints=endpoint_allow(args.cloud_endpoint_allow),
    )


def endpoint_allow(value: str | tuple[Endpoint, ...]) -> tuple[Endpoint, ...]:
    """The argparse ``type`` of --cloud-endpoint-allow (and its value, parsed once already)."""
    if isinstance(value, tuple):
        return value
    try:
        return parse_endpoint_allow(value)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
