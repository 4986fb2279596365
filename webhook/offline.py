"""``tf-webhook mutate``'s pure part: the pod a workload's template makes, and every denial of a pod.

The webhook admits pods, one at a time, and stops at the first value it refuses. Offline, a user checks a
manifest before applying it, and wants the whole list at once: after each denial the key at fault is set
aside and the pod is tried again, until it is admitted or a denial names nothing that can be set aside.
A Deployment, StatefulSet, Job, ReplicaSet, DaemonSet or CronJob is turned into the pod its controller
would create from its template, owned by it, so the workload label comes out as it will in the cluster.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from webhook.mutation import Denial, MutationResult

KubeObject = dict[str, Any]

# kind -> path of the pod template in the object
TEMPLATE_PATHS: dict[str, tuple[str, ...]] = {
    "Deployment": ("spec", "template"),
    "StatefulSet": ("spec", "template"),
    "ReplicaSet": ("spec", "template"),
    "DaemonSet": ("spec", "template"),
    "Job": ("spec", "template"),
    "CronJob": ("spec", "jobTemplate", "spec", "template"),
}
KINDS = ("Pod", *TEMPLATE_PATHS)
MAX_DENIALS = 50  # a pod has a few dozen annotations at most: this ends any loop


class NotAPodError(ValueError):
    """An object that is neither a pod nor a workload with a pod template."""


def pod_of(obj: KubeObject, source: str) -> KubeObject:
    """``obj`` itself if it is a Pod, else the pod its controller would create from its template."""
    kind = str(obj.get("kind") or "")
    if kind == "Pod":
        return obj
    path = TEMPLATE_PATHS.get(kind)
    if path is None:
        raise NotAPodError(f"{source}: kind {kind or '(none)'!r} has no pods; give one of {', '.join(KINDS)}")
    template: Any = obj
    for step in path:
        template = template.get(step) if isinstance(template, dict) else None
    if not isinstance(template, dict):
        raise NotAPodError(f"{source}: {kind} has no {'.'.join(path)}")
    meta: KubeObject = obj["metadata"] if isinstance(obj.get("metadata"), dict) else {}
    name = str(meta.get("name") or kind.lower())
    template_meta = template["metadata"] if isinstance(template.get("metadata"), dict) else {}
    pod_meta: KubeObject = json.loads(json.dumps(template_meta))
    pod_meta.setdefault("generateName", f"{name}-")
    if meta.get("namespace"):
        pod_meta.setdefault("namespace", meta["namespace"])
    pod_meta["ownerReferences"] = [{"apiVersion": str(obj.get("apiVersion") or ""), "kind": kind,
                                    "name": name, "controller": True}]
    return {"apiVersion": "v1", "kind": "Pod", "metadata": pod_meta,
            "spec": json.loads(json.dumps(template.get("spec") or {}))}


def every_denial(pod: KubeObject, run: Callable[[KubeObject], MutationResult],
                 ) -> tuple[MutationResult, list[Denial]]:
    """Run ``run`` on ``pod``; while it is denied for a key the pod sets, set that key aside and run
    again. The first result, and every denial in the order found. A denial of a key already set aside is
    the setting aside's doing (no request left once the only one went), never reported."""
    first = run(pod)
    denials: list[Denial] = []
    aside: set[str] = set()
    result, current = first, pod
    while result.denial is not None and len(denials) < MAX_DENIALS:
        if result.denial.reason in aside:
            break
        denials.append(result.denial)
        aside.add(result.denial.reason)
        smaller = _without(current, result.denial.reason)
        if smaller is None:
            break
        current = smaller
        result = run(current)
    return first, denials


def _without(pod: KubeObject, key: str) -> KubeObject | None:
    """``pod`` without the annotation or field ``key``; None when it has no such thing to remove."""
    meta = pod.get("metadata") or {}
    annotations = meta.get("annotations") or {}
    if isinstance(annotations, dict) and key in annotations:
        kept = {k: v for k, v in annotations.items() if k != key}
        return {**pod, "metadata": {**meta, "annotations": kept}}
    if key == "spec.nodeName" and (pod.get("spec") or {}).get("nodeName"):
        return {**pod, "spec": {k: v for k, v in pod["spec"].items() if k != "nodeName"}}
    return None
