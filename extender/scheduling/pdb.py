"""PodDisruptionBudgets in preemption: which victims a budget protects, and how many budgets a set of
victims would break.

A budget allows ``status.disruptionsAllowed`` more disruptions of the pods its selector matches (in its
namespace); the disruption controller keeps that number. As kube-scheduler counts them: going through the
victims in order, a victim matched by a budget with no disruption left is a violation, otherwise it uses up
one disruption of every budget that matches it. A victim counts once however many budgets it breaks.

The preemptor prefers victim sets that break no budget and evicts through the Eviction API, so the API
server itself refuses an eviction a budget does not allow.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from extender.kube.selectors import selects


@dataclass(frozen=True)
class Budget:
    key: str  # namespace/name
    namespace: str
    selector: Mapping[str, Any] | None
    allowed: int


def budgets_from(objects: Iterable[Mapping[str, Any]]) -> list[Budget]:
    out = []
    for obj in objects:
        meta = obj.get("metadata") or {}
        allowed = (obj.get("status") or {}).get("disruptionsAllowed")
        namespace = str(meta.get("namespace") or "")
        out.append(Budget(f"{namespace}/{meta.get('name') or ''}", namespace,
                          (obj.get("spec") or {}).get("selector"),
                          allowed if isinstance(allowed, int) and not isinstance(allowed, bool) else 0))
    return out


def covering(budgets: Sequence[Budget], namespace: str, labels: Mapping[str, str]) -> list[Budget]:
    return [b for b in budgets if b.namespace == namespace and selects(b.selector, labels)]


def violations(victims: Sequence[tuple[str, Mapping[str, str]]], budgets: Sequence[Budget]) -> int:
    """How many of ``victims`` (namespace, labels), evicted in this order, a budget would not allow."""
    left = {b.key: b.allowed for b in budgets}
    count = 0
    for namespace, labels in victims:
        matched = covering(budgets, namespace, labels)
        if any(left[b.key] <= 0 for b in matched):
            count += 1
            continue
        for b in matched:
            left[b.key] -= 1
    return count


class PodLookup(Protocol):
    def get(self, name: str, namespace: str | None = None) -> dict[str, Any] | None: ...


class BudgetSource(Protocol):
    def list(self) -> list[dict[str, Any]]: ...


class PdbGuard:
    """Budgets from the PDB watch cache, pod labels from the pods cache, for the state's victim choice."""

    def __init__(self, pods: PodLookup, budgets: BudgetSource) -> None:
        self.pods = pods
        self.budgets = budgets

    def _labels(self, pod_key: str) -> tuple[str, Mapping[str, str]]:
        namespace, _, name = pod_key.partition("/")
        pod = self.pods.get(name, namespace) or {}
        labels = (pod.get("metadata") or {}).get("labels") or {}
        return namespace, labels if isinstance(labels, dict) else {}

    def protected(self, pod_key: str) -> bool:
        """Whether evicting this pod alone would break a budget."""
        namespace, labels = self._labels(pod_key)
        return any(b.allowed <= 0 for b in covering(budgets_from(self.budgets.list()), namespace, labels))

    def violations(self, pod_keys: Sequence[str]) -> int:
        return violations([self._labels(k) for k in pod_keys], budgets_from(self.budgets.list()))
