"""Karpenter-mode and Provisioned pools' launches, and compaction: settings (``config``), pure plans
(``launch_plan``, ``compaction_plan``), the port to the cluster (``port``), the executors (``launcher``,
``compactor``, ``provisioned/``) and their reconcilers on the runner (``controller``)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from extender.controllers.capacity.config import CapacityConfig, add_arguments, from_args

if TYPE_CHECKING:
    from extender.controllers.wiring import Built, Deps

NAME = "capacity"
DEFAULT = CapacityConfig(enabled=False)
__all__ = ["DEFAULT", "NAME", "add_arguments", "build", "from_args"]


def build(deps: Deps, config: CapacityConfig) -> Built | None:
    """The capacity controllers, leader-only, over the core caches and the package's own (GPUNodeClaims,
    GPUNodeClasses; NodeClaims, TensorFusionClusters and GPUNodes shared with the packages that read them
    too); the filter hook that wakes the launchers on unmet demand."""
    from extender.controllers.capacity.controller import Capacity
    from extender.controllers.wiring import Built
    from extender.kube import resources

    if not config.enabled:
        return None
    informers = deps.informers
    capacity = Capacity(
        config, deps.api_client, deps.state, recorder=deps.recorder, registry=deps.registry,
        nodes=deps.core.nodes, pools=deps.core.gpupools, pods=deps.core.pods,
        gpunodeclaims=informers.cache(resources.GPU_NODE_CLAIMS, optional=True, name="gpunodeclaims"),
        nodeclaims=informers.cache(resources.NODECLAIMS, optional=True, name="nodeclaims"),
        node_classes=informers.cache(resources.GPU_NODE_CLASSES, optional=True, name="gpunodeclasses"),
        clusters=informers.cache(resources.TENSOR_FUSION_CLUSTERS, optional=True,
                                 name="tensorfusionclusters"),
        gpunodes=informers.cache(resources.GPU_NODES, optional=True, name="gpunodes"),
        core=deps.core.all,
    )
    return Built(controllers=capacity.controllers, hooks=(capacity,), part=capacity)
