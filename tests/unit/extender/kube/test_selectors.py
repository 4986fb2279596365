"""One selector evaluator, on exactly the inputs its former copies disagreed on (or all got wrong).

The copies were: the webhook's LabelSelector (webhook/selector.py, later kube/selectors.py: "webhook"),
defrag's PDB selector (controllers/defrag/plan.py selector_matches, also used by scheduling/pdb.py:
"defrag"), defrag's node-affinity expression (controllers/defrag/plan.py _expression_matches: "node") and
the Karpenter-mode instance requirements (planning/offerings.py _matches: "offerings"). The one rule now:
what the API server's validation refuses is a SelectorError from ``matches`` and selects nothing in
``selects`` / ``requirement_selects``.
"""

from __future__ import annotations

from typing import Any

import pytest

from extender.kube.selectors import SelectorError, expression_selects, matches, requirement_selects, selects


def _expressions(*expressions: dict[str, Any]) -> dict[str, Any]:
    return {"matchExpressions": list(expressions)}


BAD_SELECTORS = [
    pytest.param(_expressions({"key": "app", "operator": "Bogus"}), {"app": "a"},
                 id="unknown operator: webhook raised, defrag said False"),
    pytest.param({"matchLabels": {"app": "b"}, **_expressions({"key": "app", "operator": "Bogus"})},
                 {"app": "a"},
                 id="unknown operator behind a failing matchLabels: webhook said False without looking"),
    pytest.param(_expressions({"operator": "NotIn", "values": ["a"]}), {"app": "a"},
                 id="expression without a key: webhook raised, defrag said True"),
    pytest.param(_expressions("app"), {"app": "a"},
                 id="expression not a map: webhook raised, defrag crashed"),
    pytest.param(["app"], {"app": "a"}, id="selector not a map: webhook raised, defrag crashed"),
    pytest.param(_expressions({"key": "app", "operator": "NotIn"}), {"app": "a"},
                 id="NotIn without values: both said True"),
    pytest.param(_expressions({"key": "app", "operator": "In", "values": []}), {"app": "a"},
                 id="In without values: both said False"),
    pytest.param(_expressions({"key": "app", "operator": "Exists", "values": ["a"]}), {"app": "a"},
                 id="Exists with values: both ignored the values and said True"),
    pytest.param(_expressions({"key": "gen", "operator": "Gt", "values": ["3"]}), {"gen": "5"},
                 id="Gt in a LabelSelector: webhook raised, defrag said False"),
]


@pytest.mark.parametrize(("selector", "labels"), BAD_SELECTORS)
def test_a_bad_label_selector_is_an_error_and_selects_nothing(selector: Any, labels: dict[str, str]) -> None:
    with pytest.raises(SelectorError):
        matches(selector, labels)
    assert selects(selector, labels) is False


@pytest.mark.parametrize(("selector", "labels"), [
    pytest.param({"matchLabels": {"gen": 5}}, {"gen": "5"},
                 id="matchLabels number: webhook True, defrag False"),
    pytest.param(_expressions({"key": "gen", "operator": "In", "values": [5]}), {"gen": "5"},
                 id="In number values: webhook True, defrag False"),
])
def test_values_compare_as_the_strings_labels_are(selector: dict[str, Any], labels: dict[str, str]) -> None:
    assert matches(selector, labels) is True


@pytest.mark.parametrize(("operator", "values", "value", "expected"), [
    pytest.param("Gt", ["1", "5"], "3", False, id="Gt with two values: node said False, offerings True"),
    pytest.param("NotIn", [], "a", False, id="NotIn without values: node and offerings said True"),
    pytest.param("Gt", ["x"], "3", False, id="Gt with no integer: both said False"),
    pytest.param("Lt", ["5"], "3", True, id="Lt"),
    pytest.param("Gt", ["5"], None, False, id="Gt on an absent label"),
])
def test_node_requirements(operator: str, values: list[str], value: str | None, expected: bool) -> None:
    assert requirement_selects(operator, values, value) is expected
    assert expression_selects({"key": "k", "operator": operator, "values": values}, value) is expected


# --- LabelSelector as the webhook reads it (SchedulingConfigTemplate rules) -----------------------------


@pytest.mark.parametrize(
    ("selector", "labels", "expected"),
    [
        (None, {"a": "1"}, False),
        ({}, {"a": "1"}, True),
        ({"matchLabels": {"a": "1"}}, {"a": "1", "b": "2"}, True),
        ({"matchLabels": {"a": "1"}}, {"a": "2"}, False),
        ({"matchExpressions": [{"key": "a", "operator": "In", "values": ["1", "2"]}]}, {"a": "2"}, True),
        ({"matchExpressions": [{"key": "a", "operator": "In", "values": ["1"]}]}, {}, False),
        ({"matchExpressions": [{"key": "a", "operator": "NotIn", "values": ["1"]}]}, {}, True),
        ({"matchExpressions": [{"key": "a", "operator": "NotIn", "values": ["1"]}]}, {"a": "1"}, False),
        ({"matchExpressions": [{"key": "a", "operator": "Exists"}]}, {"a": ""}, True),
        ({"matchExpressions": [{"key": "a", "operator": "DoesNotExist"}]}, {"a": ""}, False),
        ({"matchLabels": {"a": "1"}, "matchExpressions": [{"key": "b", "operator": "Exists"}]}, {"a": "1"},
         False),
    ],
)
def test_label_selector(selector: dict[str, Any] | None, labels: dict[str, str], expected: bool) -> None:
    assert matches(selector, labels) is expected


def test_unknown_selector_operator_is_an_error() -> None:
    with pytest.raises(SelectorError, match="Gt"):
        matches({"matchExpressions": [{"key": "a", "operator": "Gt", "values": ["1"]}]}, {"a": "2"})

