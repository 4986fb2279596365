"""``--autoscale``: TensorFusion's workload autoscaling on the extender's ledger.

One leader-only controller, ``workload-autoscale``: every ``--autoscale-interval`` it groups bound GPU pods
into workloads (their ``tensor-fusion.ai/workload`` label), keeps one TensorFusionWorkload per workload
(worker count, ``status.recommendation``, ``status.activeCronScalingRule``, condition ``ResourceUpdate``),
reads usage samples from a ``UsageSource``, asks the pure recommender (extender/autoscaling) and, where
``autoSetResources`` is enabled, resizes each worker in place through the ledger (extender/server/resize.py).
One replica resizes: two would each decide from their own ledger and patch the same pods.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from extender.controllers.autoscale.config import AutoscaleOptions, add_arguments, from_args

if TYPE_CHECKING:
    from extender.controllers.wiring import Built, Deps

NAME = "autoscale"
DEFAULT = AutoscaleOptions()
__all__ = ["DEFAULT", "NAME", "add_arguments", "build", "from_args"]


def build(deps: Deps, options: AutoscaleOptions) -> Built | None:
    """The workload autoscaler, on the leader only, once the ledger knows every pod (the core caches)."""
    if not options.enabled:
        return None
    from extender.controllers.autoscale.controller import WorkloadAutoscaler
    from extender.controllers.autoscale.port import KubeWorkloadApi
    from extender.controllers.runner import Reconciler
    from extender.controllers.wiring import Built
    from extender.server.resize import Resizer

    autoscaler = WorkloadAutoscaler(deps.state, deps.core.pods, KubeWorkloadApi(deps.kube),
                                    Resizer(deps.state, deps.pod_api, deps.recorder,
                                            quota=lambda: deps.state.quota_gate), options)
    controller = Reconciler("workload-autoscale", autoscaler.reconcile, interval=options.interval_seconds,
                            leader_only=True, caches=deps.core.all)
    return Built(controllers=(controller,), part=autoscaler)
