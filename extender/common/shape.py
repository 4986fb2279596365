"""The shape an API object from a request must have before any code reads it.

The extender's verbs and the webhook's ``/mutate`` take Pods (and Nodes) as plain JSON dicts from the caller.
Code further in reads them as the API server would have them: text where Kubernetes has text, and a depth no
real object comes near. A body that breaks either (a ``metadata.resourceVersion`` that is a list nested
1,000 deep, say) would otherwise reach ``str()``, ``repr()`` or a log line and end in a ``RecursionError``.
``object_problem`` checks both once, at the edge, and names the field at fault, so the caller gets a 4xx
that says what is wrong.
"""

from __future__ import annotations

from typing import Any

# A real Pod is about 10 levels deep (spec.affinity...matchExpressions.values, managedFields' fieldsV1 a
# few more); 64 leaves room for any CRD-like extension while every recursive walk stays far below Python's
# recursion limit (1,000).
MAX_DEPTH = 64

_TEXT = (str, type(None))
# the fields of an object the project reads as text, by section (k8s.io/api core/v1 and meta/v1 types)
_TEXT_FIELDS: dict[str, tuple[str, ...]] = {
    "metadata": ("name", "generateName", "namespace", "uid", "resourceVersion", "creationTimestamp",
                 "deletionTimestamp"),
    "spec": ("nodeName", "schedulerName", "priorityClassName", "preemptionPolicy", "serviceAccountName"),
    "status": ("phase", "nominatedNodeName", "qosClass"),
}
_MAPS = ("metadata", "spec", "status")
_STRING_MAPS = (("metadata", "labels"), ("metadata", "annotations"), ("spec", "nodeSelector"))


def object_problem(obj: Any, where: str = "object") -> str | None:
    """Why ``obj`` is not an API object this project can read, naming the field (``where.metadata.uid``),
    or None. Costs one walk of the object, stopping at ``MAX_DEPTH``."""
    if not isinstance(obj, dict):
        return f"{where}: expected an object, got {_kind(obj)}"
    too_deep = _too_deep(obj)
    if too_deep is not None:
        return f"{where}.{too_deep}: nested more than {MAX_DEPTH} levels deep"
    for section in _MAPS:
        value = obj.get(section)
        if value is None:
            continue
        if not isinstance(value, dict):
            return f"{where}.{section}: expected an object, got {_kind(value)}"
        for field in _TEXT_FIELDS[section]:
            if not isinstance(value.get(field), _TEXT):
                return f"{where}.{section}.{field}: expected a string, got {_kind(value[field])}"
    for section, field in _STRING_MAPS:
        value = obj.get(section)
        entries = value.get(field) if isinstance(value, dict) else None
        if entries is None:
            continue
        if not isinstance(entries, dict):
            return f"{where}.{section}.{field}: expected an object of strings, got {_kind(entries)}"
        for key, text in entries.items():
            if not isinstance(text, str):
                return f"{where}.{section}.{field}[{_short(key)}]: expected a string, got {_kind(text)}"
    return None


def depth_problem(value: Any, where: str) -> str | None:
    """Why ``value`` is nested too deeply to read, naming where, or None."""
    too_deep = _too_deep(value)
    return None if too_deep is None else f"{where}.{too_deep}: nested more than {MAX_DEPTH} levels deep"


def _too_deep(value: Any) -> str | None:
    """The path (its first levels) to where ``value`` goes past ``MAX_DEPTH``, or None."""
    return _path_past_limit(value) if _past_limit(value, 0) else None


def _past_limit(value: Any, depth: int) -> bool:
    """Whether ``value`` (at ``depth``, the outermost object being at 0) holds lists or objects more than
    ``MAX_DEPTH`` levels deep.
    Level by level: the walk itself never recurses."""
    level: list[Any] = [value] if isinstance(value, dict | list) else []
    while level:
        if depth >= MAX_DEPTH:
            return True
        below: list[Any] = []
        add = below.append
        for node in level:
            for child in node.values() if type(node) is dict else node:
                kind = type(child)
                if kind is dict or kind is list:
                    add(child)
        level = below
        depth += 1
    return False


def _path_past_limit(value: Any) -> str:
    """The first levels of a path that goes past ``MAX_DEPTH`` in ``value`` (which has one)."""
    path: list[str] = []
    node = value
    while len(path) < 6:
        items: Any = (node.items() if isinstance(node, dict)
                      else enumerate(node) if isinstance(node, list) else ())
        for key, child in items:
            if isinstance(child, dict | list) and _past_limit(child, len(path) + 1):
                path.append(_short(key) if isinstance(key, str) else f"[{key}]")
                node = child
                break
        else:
            break
    return ".".join(path).replace(".[", "[") + ("..." if len(path) == 6 else "")


def _kind(value: Any) -> str:
    return {dict: "an object", list: "a list", bool: "a boolean", int: "a number", float: "a number",
            str: "a string", type(None): "null"}.get(type(value), type(value).__name__)


def _short(key: Any, limit: int = 60) -> str:
    text = key if isinstance(key, str) else type(key).__name__
    return text if len(text) <= limit else text[:limit] + "..."
