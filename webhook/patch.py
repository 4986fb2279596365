"""RFC 6902 JSON Patch between two JSON documents.

The patch is computed as a structural diff of the pod before and after mutation, so it always applies
cleanly to the object the API server sent, creates missing parents (a whole new map is one ``add``), and is
empty when the mutation changed nothing.
"""

from __future__ import annotations

from typing import Any

PatchOp = dict[str, Any]


def escape_pointer_token(token: str) -> str:
    """RFC 6901: ``~`` becomes ``~0`` and ``/`` becomes ``~1`` (in that order)."""
    return token.replace("~", "~0").replace("/", "~1")


def diff(before: Any, after: Any, path: str = "") -> list[PatchOp]:
    """Operations that turn ``before`` into ``after``; ``path``: the escaped JSON pointer of both."""
    ops: list[PatchOp] = []
    _diff(before, after, path, ops)
    return ops


def _diff(before: Any, after: Any, path: str, ops: list[PatchOp]) -> None:
    # ``path`` is the escaped JSON pointer so far. Equal containers are skipped with one C-level
    # comparison: a mutation touches a handful of fields of a large pod.
    if isinstance(before, dict) and isinstance(after, dict):
        if before == after:
            return
        for key in before:
            if key not in after:
                ops.append({"op": "remove", "path": f"{path}/{escape_pointer_token(key)}"})
        for key, value in after.items():
            child = f"{path}/{escape_pointer_token(key)}"
            if key not in before:
                ops.append({"op": "add", "path": child, "value": value})
            else:
                _diff(before[key], value, child, ops)
        return
    if isinstance(before, list) and isinstance(after, list) and len(after) >= len(before):
        if before == after:
            return
        for position, value in enumerate(before):
            _diff(value, after[position], f"{path}/{position}", ops)
        for position in range(len(before), len(after)):
            ops.append({"op": "add", "path": f"{path}/{position}", "value": after[position]})
        return
    if before != after or type(before) is not type(after):
        ops.append({"op": "replace", "path": path, "value": after})
