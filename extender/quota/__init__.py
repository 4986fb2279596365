"""Namespace GPU quotas (TensorFusion's ``GPUResourceQuota``): the arithmetic, pure (no I/O, no clock).

- ``model``: ``parse_quota(obj) -> Quota``, total: a malformed field is ignored and named in
  ``Quota.problems``; ``by_namespace``; ``Amounts`` (TFLOPS, VRAM bytes).
- ``usage``: ``demand_of(request, capacities) -> Demand`` (request x GPU count, one worker; a percent or a
  whole GPU counted in the TFLOPS and VRAM of the GPUs it lands on), ``demands(allocations, ...)`` and
  ``usage_by_namespace(...)``: a namespace's ``Usage`` from the ledger's allocations (bound pods, binds in
  flight, filters' holds), so it is as exact as the ledger and rebuilt with it after a restart.
- ``check``: the one admission question, for one pod or several pods of a namespace at once (a gang)::

      check(quotas, usage, namespace, [demand, ...]) -> Refusal | None

  ``usage`` must not already count the demands. The first ``Refusal`` says which quota, which dimension
  (TensorFusion's names), used, requested and the cap (``.message``); ``.unresolvable`` is True for single
  caps (no preemption or new node helps). ``room(quotas, usage, namespace)`` is what the totals leave.
- ``book``: ``QuotaBook(state, quotas)``, those questions over a cluster state's ledger: ``blocks(pod)``,
  ``refusal(pod, request, capacities)``, ``refusal_together([(pod, request), ...])`` (a gang: the members
  left out of the usage, their demands added together), ``fits_without`` (preemption) and ``resize_room``.
  On the live state it is reachable as ``ClusterState.quota_gate`` (the quota controller's rule).
- ``status``: ``quota_status(quota, usage, previous, now)``, the status TensorFusion writes.
"""

from extender.quota.check import Dimension, Refusal, check, room
from extender.quota.model import ZERO, Amounts, Defaults, Quota, by_namespace, parse_quota
from extender.quota.usage import NO_USAGE, Demand, Usage, demand_of, demands, needs_gpus, usage_by_namespace

__all__ = [
    "NO_USAGE", "ZERO", "Amounts", "Defaults", "Demand", "Dimension", "Quota", "Refusal", "Usage",
    "by_namespace", "check", "demand_of", "demands", "needs_gpus", "parse_quota", "room",
    "usage_by_namespace",
]
