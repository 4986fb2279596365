"""Where the webhook grants the high and critical QoS priority classes (``tensor-fusion-high``,
``tensor-fusion-critical``; the second preempts lower priorities): only in the namespaces and pools the
administrator lists (``tf-webhook serve --qos-priority-namespaces`` / ``--qos-priority-pools``; chart
``webhook.qosPriority``). Elsewhere a pod that asks for one (its ``tensor-fusion.ai/qos`` annotation or its
WorkloadProfile) is denied with a message naming the key; a pod that is ``high`` only by derivation (requests
equal to limits) or by its pool's ``defaultQoS`` keeps its QoS but gets no priority class. The ResourceQuota
scope that backs this against a pod naming the class itself is in docs/install.md.
"""

from __future__ import annotations

from dataclasses import dataclass

ANYWHERE = "*"
DEFAULT_NAMESPACES = "tensor-fusion-sys"  # the project's own namespace, as the manifests install it


@dataclass(frozen=True)
class PriorityPolicy:
    """``namespaces`` None: everywhere (the offline ``mutate``, and ``*``)."""

    namespaces: frozenset[str] | None = None
    pools: frozenset[str] = frozenset()

    @classmethod
    def from_lists(cls, namespaces: str, pools: str = "") -> PriorityPolicy:
        names = _split(namespaces)
        return cls(None if ANYWHERE in names else frozenset(names), frozenset(_split(pools)))

    def grants(self, namespace: str, pool: str) -> bool:
        return self.namespaces is None or namespace in self.namespaces or pool in self.pools

    def where(self) -> str:
        """The places it grants, for a denial."""
        spaces = ", ".join(sorted(self.namespaces or ())) or "none"
        pools = ", ".join(sorted(self.pools)) or "none"
        return (f"namespaces {spaces} (--qos-priority-namespaces) and pools {pools} "
                "(--qos-priority-pools)")


def _split(text: str) -> list[str]:
    return [part.strip() for part in text.split(",") if part.strip()]
