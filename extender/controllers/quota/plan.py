"""The pods a namespace's GPU quota holds, as ``plan`` actions: nothing is done for them (no node is bought,
capacity planning leaves them out), and ``tf-extender plan`` says so, one ``quota-hold`` line per pod."""

from __future__ import annotations

from collections.abc import Iterable

from extender.common.pods import pod_key
from extender.planning.action import Action
from extender.planning.inputs import Inputs
from extender.scheduling.state import PlacementError


def plan_quota_holds(inputs: Inputs) -> Iterable[Action]:
    gate = inputs.state.quota_gate
    if gate is None:
        return []
    out = []
    for pod in inputs.pods:
        meta, spec = pod.get("metadata") or {}, pod.get("spec") or {}
        if spec.get("nodeName") or meta.get("deletionTimestamp"):
            continue
        if str((pod.get("status") or {}).get("phase") or "Pending") != "Pending":
            continue
        refusal = gate.blocks(pod)
        if refusal is None:
            continue
        try:
            pool = inputs.state.request_of(pod).pool
        except PlacementError:
            continue
        out.append(Action("quota-hold", pool, refusal.message, details={"pod": pod_key(pod)}))
    return out
