"""Planning: what the capacity controllers would do now, as actions one can read before they happen.

A *planner* is a pure function from ``Inputs`` (a picture of the cluster) to ``Action`` objects.
``tf-extender plan`` runs the planners on a snapshot file and prints one JSON object per action; the
live controllers run the same planners on their watch caches, log the same objects and carry them out.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from extender.planning.inputs import Inputs


@dataclass(frozen=True)
class Action:
    """One thing a controller would do. ``details`` go into the JSON line between ``pool``/``node`` and
    ``reason``; ``payload`` is for the controller that executes it and is never printed."""

    action: str
    pool: str
    reason: str
    node: str | None = None
    details: Mapping[str, Any] = field(default_factory=dict)
    payload: Any = field(default=None, compare=False)

    def as_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"action": self.action, "pool": self.pool}
        if self.node is not None:
            out["node"] = self.node
        out.update(self.details)
        out["reason"] = self.reason
        return out


Planner = Callable[[Inputs], Iterable[Action]]


def plan(inputs: Inputs, planners: Iterable[Planner]) -> list[Action]:
    """Every planner's actions, in planner order."""
    return [action for planner in planners for action in planner(inputs)]


__all__ = ["Action", "Inputs", "Planner", "plan"]
