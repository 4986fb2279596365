"""Kubernetes selectors evaluated against labels: one semantics for the whole project.

Two shapes share one evaluator. A LabelSelector (``matchLabels`` and ``matchExpressions`` with ``In``,
``NotIn``, ``Exists``, ``DoesNotExist``: PodDisruptionBudgets, SchedulingConfigTemplate rules) and a
NodeSelectorRequirement (those four plus ``Gt`` and ``Lt``: node affinity, Karpenter requirements).

One rule for bad input, the API server's validation: an unknown operator, ``In``/``NotIn`` without values,
``Exists``/``DoesNotExist`` with values, ``Gt``/``Lt`` without exactly one integer, an expression without a
key, or a selector that is not a map is a ``SelectorError``. :func:`matches` raises it, for callers that
report it; :func:`selects` and :func:`requirement_selects` read a bad selector as selecting nothing, as
Kubernetes does with a PodDisruptionBudget whose selector does not parse. The whole selector is checked
before anything is evaluated, so a bad part is found whatever the labels are.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

LABEL_OPERATORS = frozenset({"In", "NotIn", "Exists", "DoesNotExist"})
NODE_OPERATORS = LABEL_OPERATORS | {"Gt", "Lt"}


class SelectorError(ValueError):
    """The selector is not a valid LabelSelector or NodeSelectorRequirement."""


def _checked(key: str, operator: object, values: Sequence[str], allowed: frozenset[str]) -> str:
    if not isinstance(operator, str) or operator not in allowed:
        raise SelectorError(f"unknown selector operator {operator!r} for key {key!r}")
    if operator in ("In", "NotIn") and not values:
        raise SelectorError(f"operator {operator} for key {key!r} needs values")
    if operator in ("Exists", "DoesNotExist") and values:
        raise SelectorError(f"operator {operator} for key {key!r} takes no values")
    if operator in ("Gt", "Lt") and (len(values) != 1 or not _is_integer(values[0])):
        raise SelectorError(f"operator {operator} for key {key!r} needs one integer value, "
                            f"got {list(values)}")
    return operator


def _is_integer(text: str) -> bool:
    try:
        int(text)
    except ValueError:
        return False
    return True


def _evaluate(operator: str, values: Sequence[str], value: str | None) -> bool:
    if operator == "In":
        return value is not None and value in values
    if operator == "NotIn":
        return value is None or value not in values
    if operator == "Exists":
        return value is not None
    if operator == "DoesNotExist":
        return value is None
    if value is None or not _is_integer(value):  # Gt, Lt: a label that is no integer does not match
        return False
    return int(value) > int(values[0]) if operator == "Gt" else int(value) < int(values[0])


def _expression(expression: object, allowed: frozenset[str]) -> tuple[str, str, tuple[str, ...]]:
    """(key, operator, values) of a checked expression."""
    if not isinstance(expression, Mapping) or not isinstance(expression.get("key"), str) \
            or not expression["key"]:
        raise SelectorError(f"match expression needs a key: {expression!r}")
    key = str(expression["key"])
    raw_values = expression.get("values") or []
    if not isinstance(raw_values, list | tuple):
        raise SelectorError(f"values of key {key!r} must be a list, got {raw_values!r}")
    values = tuple(str(v) for v in raw_values)
    return key, _checked(key, expression.get("operator"), values, allowed), values


def matches(selector: Mapping[str, Any] | None, labels: Mapping[str, str]) -> bool:
    """True when ``labels`` satisfy the LabelSelector ``selector``.

    As in Kubernetes, an empty selector matches everything and a missing (None) one matches nothing.
    Raises ``SelectorError`` for a bad selector (see the module docstring).
    """
    if selector is None:
        return False
    if not isinstance(selector, Mapping):
        raise SelectorError(f"selector must be a map, got {selector!r}")
    match_labels = selector.get("matchLabels") or {}
    if not isinstance(match_labels, Mapping):
        raise SelectorError(f"matchLabels must be a map, got {match_labels!r}")
    raw_expressions = selector.get("matchExpressions") or []
    if not isinstance(raw_expressions, list | tuple):
        raise SelectorError(f"matchExpressions must be a list, got {raw_expressions!r}")
    expressions = [_expression(e, LABEL_OPERATORS) for e in raw_expressions]
    return (all(labels.get(str(k)) == str(v) for k, v in match_labels.items())
            and all(_evaluate(op, values, labels.get(key)) for key, op, values in expressions))


def selects(selector: Mapping[str, Any] | None, labels: Mapping[str, str]) -> bool:
    """:func:`matches`, with a bad selector selecting nothing."""
    try:
        return matches(selector, labels)
    except SelectorError:
        return False


def requirement_selects(operator: object, values: Sequence[object], value: str | None) -> bool:
    """Whether a label ``value`` (None: the label is absent) meets a NodeSelectorRequirement's
    ``operator`` and ``values``; a bad requirement selects nothing."""
    strings = tuple(str(v) for v in values)
    try:
        checked = _checked("", operator, strings, NODE_OPERATORS)
    except SelectorError:
        return False
    return _evaluate(checked, strings, value)


def expression_selects(expression: Mapping[str, Any], value: str | None) -> bool:
    """:func:`requirement_selects` for a NodeSelectorRequirement as the API writes it."""
    raw_values = expression.get("values") or []
    if not isinstance(raw_values, list | tuple):
        return False
    return requirement_selects(expression.get("operator"), raw_values, value)
