"""The defragmentation planner of ``tf-extender plan --defrag``: for every pool with defragmentation
enabled, the evictions a run would make now ("evict", with the node the simulation found) and the
candidate nodes it would leave as they are ("skip", with the reason). The live loop runs the same
``extender.controllers.defrag.plan.plan_pool``."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from extender.controllers.defrag.config import DefragConfigError, parse_config
from extender.controllers.defrag.plan import Plan, Snapshot, plan_pool
from extender.planning.action import Action
from extender.planning.inputs import Inputs
from extender.scheduling.inventory import object_name


def snapshot_of(inputs: Inputs) -> Snapshot:
    pods_by_node: dict[str, list[Mapping[str, Any]]] = {}
    for pod in inputs.pods:
        node = (pod.get("spec") or {}).get("nodeName")
        if node:
            pods_by_node.setdefault(str(node), []).append(pod)
    return Snapshot(inputs.nodes, pods_by_node, inputs.pdbs)


def defrag_actions(plan: Plan) -> list[Action]:
    out = [Action("evict", plan.pool, m.reason, details={"pod": m.pod, "from": m.source, "to": m.target},
                  payload=m) for m in plan.moves]
    out += [Action("skip", plan.pool, s.message, node=s.node, payload=s) for s in plan.skips]
    return out


def plan_defrag(inputs: Inputs) -> Iterable[Action]:
    snapshot = snapshot_of(inputs)
    for pool in sorted(inputs.pools, key=object_name):
        name = object_name(pool)
        try:
            config = parse_config(pool)
        except DefragConfigError as exc:
            yield Action("skip", name, str(exc))
            continue
        if config.enabled:
            yield from defrag_actions(plan_pool(inputs.state, name, config, snapshot, inputs.now))
