"""TensorFusionCluster: the GPUPools each cluster derives (``derive``), its cloud vendor check
(``vendor``), flags (``config``) and the leader-only reconciler that writes them (``controller``), woken by
every cluster or pool change."""

from __future__ import annotations

from typing import TYPE_CHECKING

from extender.controllers.tfcluster.config import TFClusterConfig, add_arguments, from_args

if TYPE_CHECKING:
    from extender.controllers.wiring import Built, Deps

NAME = "tfcluster"
DEFAULT = TFClusterConfig(enabled=False)
__all__ = ["DEFAULT", "NAME", "add_arguments", "build", "from_args"]


def build(deps: Deps, config: TFClusterConfig) -> Built | None:
    """The TensorFusionCluster controller on the process's one TensorFusionCluster cache (shared with the
    capacity controllers) and the GPUPools, on the leader only."""
    if not config.enabled:
        return None
    from extender.controllers.runner import Reconciler
    from extender.controllers.tfcluster.controller import TFClusterController
    from extender.controllers.wiring import Built
    from extender.kube import resources

    clusters = deps.informers.cache(resources.TENSOR_FUSION_CLUSTERS, optional=True,
                                    name="tensorfusionclusters")
    pools = deps.core.gpupools
    controller = TFClusterController(config, deps.api_client, pools=pools, clusters=clusters,
                                     recorder=deps.recorder)
    reconciler = Reconciler("tensorfusioncluster", controller.reconcile, interval=config.interval_seconds,
                            leader_only=True, caches=(clusters, pools))
    clusters.subscribe(reconciler.wake)
    pools.subscribe(reconciler.wake)
    return Built(controllers=(reconciler,), part=controller)
