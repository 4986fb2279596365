"""Planning: what the capacity controllers would do now, as actions one can read before they happen.

A *planner* is a pure function from ``Inputs`` (a picture of the cluster) to ``Action`` objects.
``tf-extender plan`` runs the planners on a snapshot file and prints one JSON object per action; the
live controllers run the same planners on their watch caches, log the same objects and carry them out.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from extender.common.logs import describe_exception
from extender.planning.inputs import Inputs
from extender.scheduling.inventory import object_name


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


def plan(inputs: Inputs, planners: Iterable[Planner], problems: list[str] | None = None) -> list[Action]:
    """Every planner's actions, in planner order. A planner that raises on the whole picture is run again
    one pool at a time: the pools it raises on are named in ``problems`` (the planner's name, the pool and
    the error) and left out, and every other pool is planned as if they were absent."""
    actions: list[Action] = []
    for planner in planners:
        try:
            actions.extend(planner(inputs))
        except Exception:
            actions.extend(_pool_by_pool(inputs, planner, problems))
    return actions


def _pool_by_pool(inputs: Inputs, planner: Planner, problems: list[str] | None) -> list[Action]:
    good: list[Mapping[str, Any]] = []
    for pool in inputs.pools:
        try:
            list(planner(replace(inputs, pools=[pool])))
            good.append(pool)
        except Exception as exc:
            if problems is not None:
                name = getattr(planner, "__name__", "planner")
                problems.append(f"GPUPool {object_name(pool) or '?'}: {name} cannot plan it: "
                                f"{describe_exception(exc, 200)}")
    try:
        return list(planner(replace(inputs, pools=good)))
    except Exception as exc:  # not a pool's doing: the planner's actions are left out, and said so
        if problems is not None:
            problems.append(f"{getattr(planner, '__name__', 'planner')}: cannot plan: "
                            f"{describe_exception(exc, 200)}")
        return []


__all__ = ["Action", "Inputs", "Planner", "plan"]
