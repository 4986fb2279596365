"""GPUResourceQuota (docs/quota.md): the rule in the verbs (``rule``: filter, bind, preemption), the
leader-only status writer and the quota gauges (``controller``), flags (``config``). The arithmetic is
``extender.quota``; usage is the ledger's, so it is exact at bind and rebuilt with the ledger on restart."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from extender.controllers.quota.config import QuotaConfig, add_arguments, from_args

if TYPE_CHECKING:
    from extender.controllers.wiring import Built, Deps

NAME = "quota"
DEFAULT = QuotaConfig(enabled=False)
__all__ = ["DEFAULT", "NAME", "add_arguments", "build", "from_args"]


def build(deps: Deps, config: QuotaConfig) -> Built | None:
    """The quota rule on every replica (each answers its own scheduler's verbs) and the status writer on the
    leader, over one GPUResourceQuota cache (optional: without the CRD no namespace has a quota)."""
    if not config.enabled:
        return None
    from extender.controllers.quota.controller import KubeQuotaStatusApi, QuotaMetrics, QuotaStatusWriter
    from extender.controllers.quota.rule import QuotaRule
    from extender.controllers.runner import Reconciler
    from extender.controllers.wiring import Built
    from extender.kube.resources import GPU_RESOURCE_QUOTAS
    from extender.quota.book import QuotaBook

    quotas = deps.informers.cache(GPU_RESOURCE_QUOTAS, optional=True, name="gpuresourcequotas")
    pods = deps.core.pods

    def pod_of(key: str) -> dict[str, Any] | None:
        namespace, _, name = key.partition("/")
        return pods.get(name, namespace)

    book = QuotaBook(deps.state, quotas.list, pod_of)
    quotas.subscribe(book.quotas_changed)
    metrics = QuotaMetrics(deps.registry)
    rule = QuotaRule(book, quotas, deps.recorder, metrics, node_gpus=deps.state.node_gpus)
    deps.state.quota_gate = rule
    writer = QuotaStatusWriter(book, quotas, KubeQuotaStatusApi(deps.api_client), deps.recorder, metrics)
    status = Reconciler("gpuresourcequota-status", writer.reconcile, interval=config.interval_seconds,
                        leader_only=True, caches=(*deps.core.all, quotas))
    quotas.subscribe(status.wake)
    return Built(controllers=(status,), hooks=(rule,), part=rule)
