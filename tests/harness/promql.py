"""PromQL in the shipped alerts and dashboard: the expressions, and the metric names they read.
Shared by tests/unit/project/test_monitoring.py and tests/e2e/test_operating_e2e.py."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import promql_parser
import yaml

ROOT = Path(__file__).resolve().parents[2]
MONITORING = ROOT / "manifests" / "optional" / "monitoring"
RULES = MONITORING / "prometheus-rules.yaml"
DASHBOARD = MONITORING / "grafana-dashboard.json"
# made by Prometheus itself (up) or by NVIDIA dcgm-exporter on the GPU nodes, not by the project
PROMETHEUS_OWN = {"up", "DCGM_FI_DEV_GPU_UTIL", "DCGM_FI_DEV_FB_USED"}


def selectors(expr: Any) -> Iterator[str]:
    """Metric names of every vector and matrix selector in a parsed PromQL expression."""
    if isinstance(expr, promql_parser.VectorSelector):
        if expr.name:
            yield expr.name
        for matcher in expr.matchers.matchers:
            if matcher.name == "__name__":
                yield matcher.value
        return
    if isinstance(expr, promql_parser.MatrixSelector):
        yield from selectors(expr.vector_selector)
        return
    children: list[Any] = []
    if isinstance(expr, promql_parser.BinaryExpr):
        children = [expr.lhs, expr.rhs]
    elif isinstance(expr, promql_parser.AggregateExpr):
        children = [expr.expr, expr.param]
    elif isinstance(expr, promql_parser.Call):
        children = list(expr.args)
    elif isinstance(expr, promql_parser.UnaryExpr | promql_parser.ParenExpr | promql_parser.SubqueryExpr):
        children = [expr.expr]
    for child in children:
        if child is not None:
            yield from selectors(child)


def rules() -> list[dict[str, Any]]:
    doc = yaml.safe_load(RULES.read_text())
    return [rule for group in doc["spec"]["groups"] for rule in group["rules"]]


def dashboard_queries() -> list[tuple[str, str]]:
    dash = json.loads(DASHBOARD.read_text())
    out = []
    for panel in dash["panels"]:
        for target in panel.get("targets", []):
            out.append((panel["title"], target["expr"]))
    return out




def names_in(expr: str) -> set[str]:
    return set(selectors(promql_parser.parse(expr)))
