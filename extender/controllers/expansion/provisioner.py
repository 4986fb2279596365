"""Who grows the GPU nodes of a pool: Karpenter (a NodeClaim copied from a template node) or the Cluster
Autoscaler (a placeholder pod it acts on), and the settings of the Cluster Autoscaler side (pure, plus the
``tf-extender serve`` flags)."""

from __future__ import annotations

import argparse
import os
from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from extender.common.labels import NODE_PROVISIONER
from extender.controllers.expansion.config import DEFAULT_NAMESPACE, ENV_POD_NAMESPACE, _env_bool

DEFAULT_IMAGE = "registry.k8s.io/pause:3.10"
DEFAULT_SCHEDULER = "default-scheduler"
PLACEHOLDER_PRIORITY_CLASS = "tensor-fusion-placeholder"
RESERVATION_PRIORITY_CLASS = "tensor-fusion-gpu-reservation"

ENV_PROVISIONER = "TF_NODE_PROVISIONER"
ENV_RESERVATIONS = "TF_GPU_RESERVATIONS"
ENV_NAMESPACE = "TF_PLACEHOLDER_NAMESPACE"
ENV_IMAGE = "TF_PLACEHOLDER_IMAGE"
ENV_SCHEDULER = "TF_PLACEHOLDER_SCHEDULER_NAME"


class Provisioner(StrEnum):
    AUTO = "auto"  # a NodeClaim when a Karpenter template node exists, else a placeholder
    KARPENTER = "karpenter"  # NodeClaims only (no placeholders)
    CLUSTER_AUTOSCALER = "cluster-autoscaler"  # placeholders only (no NodeClaims)


def pool_provisioner(gpupool: Mapping[str, Any] | None, default: Provisioner) -> Provisioner:
    """The pool's ``tensor-fusion.ai/node-provisioner`` annotation, else ``default``; unknown values count
    as unset."""
    annotations = ((gpupool or {}).get("metadata") or {}).get("annotations") or {}
    raw = str(annotations.get(NODE_PROVISIONER, "")).strip().lower()
    try:
        return Provisioner(raw)
    except ValueError:
        return default


@dataclass(frozen=True)
class AutoscalerConfig:
    provisioner: Provisioner = Provisioner.AUTO
    reservations: bool = True
    namespace: str = DEFAULT_NAMESPACE
    image: str = DEFAULT_IMAGE
    scheduler_name: str = DEFAULT_SCHEDULER
    placeholder_priority_class: str = PLACEHOLDER_PRIORITY_CLASS
    reservation_priority_class: str = RESERVATION_PRIORITY_CLASS

    @property
    def placeholders(self) -> bool:
        return self.provisioner is not Provisioner.KARPENTER


def add_arguments(parser: argparse.ArgumentParser, environ: Mapping[str, str] | None = None) -> None:
    env = os.environ if environ is None else environ
    group = parser.add_argument_group("Cluster Autoscaler (placeholder and GPU reservation pods)")
    group.add_argument(
        "--node-provisioner", choices=[p.value for p in Provisioner],
        default=env.get(ENV_PROVISIONER, Provisioner.AUTO.value),
        help="who grows GPU nodes for capacity-only failures: auto (a Karpenter NodeClaim when a template "
             "node owned by Karpenter exists, else a placeholder pod for the Cluster Autoscaler), karpenter, "
             f"or cluster-autoscaler; a GPUPool annotation {NODE_PROVISIONER} overrides it per pool "
             f"(env {ENV_PROVISIONER})")
    group.add_argument(
        "--gpu-reservations", dest="gpu_reservations", action=argparse.BooleanOptionalAction,
        default=_env_bool(env[ENV_RESERVATIONS]) if ENV_RESERVATIONS in env else True,
        help="hold nvidia.com/gpu: 1 with a pod bound to the node for every GPU that GPU pods share, on "
             "nodes that advertise nvidia.com/gpu, so the Cluster Autoscaler counts it as used "
             f"(env {ENV_RESERVATIONS})")
    group.add_argument(
        "--placeholder-namespace", metavar="NAMESPACE",
        default=env.get(ENV_NAMESPACE) or env.get(ENV_POD_NAMESPACE) or DEFAULT_NAMESPACE,
        help=f"namespace of placeholder and reservation pods (env {ENV_NAMESPACE}, else {ENV_POD_NAMESPACE})")
    group.add_argument(
        "--placeholder-image", metavar="IMAGE", default=env.get(ENV_IMAGE, DEFAULT_IMAGE),
        help=f"container image of placeholder and reservation pods (env {ENV_IMAGE})")
    group.add_argument(
        "--placeholder-scheduler-name", metavar="NAME", default=env.get(ENV_SCHEDULER, DEFAULT_SCHEDULER),
        help=f"scheduler of placeholder pods (env {ENV_SCHEDULER})")


def from_args(args: argparse.Namespace) -> AutoscalerConfig:
    return AutoscalerConfig(
        provisioner=Provisioner(args.node_provisioner),
        reservations=bool(args.gpu_reservations),
        namespace=str(args.placeholder_namespace),
        image=str(args.placeholder_image),
        scheduler_name=str(args.placeholder_scheduler_name),
    )
