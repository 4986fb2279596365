"""Kubernetes label selectors (``matchLabels`` and ``matchExpressions``) evaluated against a label map."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any


class SelectorError(ValueError):
    """The selector is not a valid LabelSelector."""


def matches(selector: Mapping[str, Any] | None, labels: Mapping[str, str]) -> bool:
    """True when ``labels`` satisfy ``selector``.

    As in Kubernetes, an empty selector matches everything and a missing (None) selector matches nothing.
    Raises ``SelectorError`` for an unknown operator or a malformed expression.
    """
    if selector is None:
        return False
    if not isinstance(selector, Mapping):
        raise SelectorError(f"selector must be a map, got {selector!r}")
    for key, value in (selector.get("matchLabels") or {}).items():
        if labels.get(key) != str(value):
            return False
    return all(_expression(expression, labels) for expression in selector.get("matchExpressions") or [])


def _expression(expression: Any, labels: Mapping[str, str]) -> bool:
    if not isinstance(expression, Mapping) or not isinstance(expression.get("key"), str):
        raise SelectorError(f"match expression needs a key: {expression!r}")
    key = expression["key"]
    operator = expression.get("operator")
    values = [str(v) for v in expression.get("values") or []]
    if operator == "In":
        return key in labels and labels[key] in values
    if operator == "NotIn":
        return key not in labels or labels[key] not in values
    if operator == "Exists":
        return key in labels
    if operator == "DoesNotExist":
        return key not in labels
    raise SelectorError(f"unknown selector operator {operator!r} for key {key!r}")
