"""What every component reads of a Pod object: its key, uid, priority and pod index, and the phases after
which it holds nothing.

Pods reach the extender from watches and from the scheduler's HTTP body, where any field may have any
shape: a field of the wrong type reads as missing, it never raises.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from extender.common.contract import POD_INDEX, decode_index

TERMINAL_PHASES = ("Succeeded", "Failed")


def as_map(value: Any) -> Mapping[str, Any]:
    """``value`` when it is an object, else an empty one (a wrong type reads as "missing")."""
    return value if isinstance(value, dict) else {}


def pod_key(pod: Mapping[str, Any]) -> str:
    meta = as_map(pod.get("metadata"))
    return f"{meta.get('namespace') or 'default'}/{meta.get('name') or ''}"


def pod_uid(pod: Mapping[str, Any]) -> str:
    return str(as_map(pod.get("metadata")).get("uid") or pod_key(pod))


def pod_priority(pod: Mapping[str, Any]) -> int:
    priority = as_map(pod.get("spec")).get("priority")
    return priority if isinstance(priority, int) and not isinstance(priority, bool) else 0


def pod_index(pod: Mapping[str, Any]) -> int | None:
    """The ``index`` annotation when written, else the index encoded in the containers' resources."""
    annotations = as_map(as_map(pod.get("metadata")).get("annotations"))
    raw = str(annotations.get(POD_INDEX, "")).strip()
    if raw.isdigit() and len(raw) < 6:
        return int(raw)
    containers = as_map(pod.get("spec")).get("containers")
    for container in containers if isinstance(containers, list) else ():
        resources = as_map(as_map(container).get("resources"))
        for section in ("limits", "requests"):
            index = decode_index(as_map(resources.get(section)))
            if index is not None:
                return index
    return None
