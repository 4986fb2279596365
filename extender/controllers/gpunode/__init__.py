"""GPUNode: one per GPU node, kept from the extender's inventory and ledger: what it should say
(``plan``), flags (``config``) and the throttled writer (``writer``)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from extender.controllers.gpunode.config import GPUNodeConfig, add_arguments, from_args
from extender.controllers.runner import Reconciler

if TYPE_CHECKING:
    from extender.controllers.wiring import Built, Deps

NAME = "gpunode"
DEFAULT = GPUNodeConfig(enabled=False)
__all__ = ["DEFAULT", "NAME", "add_arguments", "build", "from_args"]


def build(deps: Deps, config: GPUNodeConfig) -> Built | None:
    """The GPUNode writer, on every replica (its writes are idempotent and compare with the watched object),
    once the ledger and the GPUNodes are known."""
    from extender.controllers.gpunode.writer import GPUNodeWriter, KubeGPUNodeApi
    from extender.controllers.wiring import Built
    from extender.kube.resources import GPU_NODES

    if not config.enabled:
        return None
    gpunodes = deps.informers.cache(GPU_NODES, optional=True, name="gpunodes")
    writer = GPUNodeWriter(config, deps.state, KubeGPUNodeApi(deps.kube), nodes=deps.core.nodes,
                           gpunodes=gpunodes, registry=deps.registry)
    return Built(controllers=(Reconciler("gpunodes", writer.reconcile, caches=(*deps.core.all, gpunodes)),),
                 part=writer)
