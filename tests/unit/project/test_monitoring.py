"""The shipped alerts and dashboard: every expression parses as PromQL (promql-parser, the Rust parser
GreptimeDB maintains) and uses only metrics the project exports, plus Prometheus's own ``up``.

"Exports" here means the metric families registered by the extender's and the webhook's code (every
collector the services create); tests/e2e/test_operating_e2e.py checks that each of those families is on
``/metrics`` of a running tf-extender and tf-webhook, so together the two prove the rules' names against
the live pages. The chart ships byte-identical copies (checked here too).
"""

from __future__ import annotations

import datetime as dt
import json
from pathlib import Path
from typing import Any

import promql_parser
import pytest
import yaml
from prometheus_client import CollectorRegistry

from certs import authority
from extender.controllers.capacity.compactor import CompactorMetrics
from extender.controllers.capacity.launcher import LauncherMetrics
from extender.controllers.defrag.metrics import DefragMetrics
from extender.controllers.expansion.metrics import ExpansionMetrics
from extender.controllers.gpustatus import StatusMetrics
from extender.controllers.quota.controller import QuotaMetrics
from extender.controllers.runner import ControllerMetrics
from extender.server.metrics import Metrics
from extender.server.stranded import StrandedCollector, count_stranded
from tests.harness.promql import DASHBOARD, PROMETHEUS_OWN, ROOT, RULES, dashboard_queries, rules, selectors
from tests.unit.fixtures.markdown import anchors
from webhook.metrics import WebhookMetrics, certificate_not_after

CHART_FILES = ROOT / "charts" / "tensor-fusion-extender" / "files"

REQUIRED_ALERTS = {
    "TensorFusionIdleGPU", "TensorFusionEmptyGPUNode", "TensorFusionPoolNearlyFull",
    "TensorFusionBindFailures",
    "TensorFusionExtenderDown", "TensorFusionWebhookDown", "TensorFusionWebhookCertificateExpiring",
    "TensorFusionAllocatedGPUIdle", "TensorFusionWorkloadNearLimit", "TensorFusionGPUQuotaNearlyFull",
}


class _Empty:
    def get(self, name: str, namespace: str | None = None) -> None:
        return None

    def list(self) -> list[dict[str, Any]]:
        return []


_SUFFIXES = {"counter": ["_total"], "histogram": ["_bucket", "_sum", "_count"]}


def exported_names() -> set[str]:
    """Every sample name the project's registries can expose (a counter ``x`` as ``x_total``, a histogram
    as ``x_bucket``/``_sum``/``_count``), whether or not a labelled series exists yet."""
    registry = CollectorRegistry()
    metrics = Metrics()
    ExpansionMetrics(metrics.registry)
    StatusMetrics(metrics.registry)
    metrics.registry.register(StrandedCollector(_Empty(), _Empty()))
    CompactorMetrics(metrics.registry)
    LauncherMetrics(metrics.registry)
    DefragMetrics(metrics.registry)
    ControllerMetrics(metrics.registry)
    QuotaMetrics(metrics.registry)
    webhook = WebhookMetrics(registry)
    webhook.track_certificate(Path("/nonexistent/tls.crt"))
    names: set[str] = set()
    for reg in (metrics.registry, registry):
        for collector in list(reg._collector_to_names):
            # the row families (per node, GPU and pod) describe themselves; Metrics renders their samples
            described = collector.describe() if hasattr(collector, "describe") else []
            for family in described or collector.collect():
                suffixes = _SUFFIXES.get(family.type, [""])
                names |= {family.name + s for s in suffixes}
    return names


def test_exported_names_cover_both_services():
    names = exported_names()
    for name in ("tf_extender_binds_total", "tf_extender_request_duration_seconds_bucket",
                 "tf_extender_stranded_allocations", "tf_extender_status_writes_total",
                 "tf_extender_nodeclaims_created_total", "tf_webhook_decisions_total",
                 "tf_webhook_certificate_expiry_timestamp_seconds"):
        assert name in names


@pytest.mark.parametrize("rule", rules(), ids=lambda r: f"{r['alert']}-{r['labels']['severity']}")
def test_alert_expression_parses_and_uses_exported_metrics(rule: dict[str, Any]):
    expr = promql_parser.parse(rule["expr"])
    used = set(selectors(expr))
    assert used, "an alert must read at least one metric"
    unknown = used - exported_names() - PROMETHEUS_OWN
    assert not unknown, f"{rule['alert']}: metrics nobody exports: {sorted(unknown)}"
    assert rule["labels"]["severity"] in ("info", "warning", "critical")
    assert rule["annotations"]["summary"] and rule["annotations"]["description"]
    assert rule["for"].endswith(("m", "h"))


@pytest.mark.parametrize("rule", rules(), ids=lambda r: f"{r['alert']}-{r['labels']['severity']}")
def test_every_alert_has_a_runbook_section_in_the_docs(rule: dict[str, Any]):
    target = rule["annotations"]["runbook_url"]
    path, _, anchor = target.partition("#")
    assert path == "docs/operations.md" and anchor == rule["alert"].lower(), target
    assert anchor in anchors(ROOT / path), f"{target}: no heading #{anchor} in {path}"


def test_the_build_info_gauges_carry_the_installed_version():
    from extender.common.version import version

    version = version()
    assert version != "unknown"  # the suite runs from an installed (editable) distribution
    assert f'tf_extender_build_info{{version="{version}"}} 1.0'.encode() in Metrics().render()
    assert f'tf_webhook_build_info{{version="{version}"}} 1.0'.encode() in WebhookMetrics().exposition()


def test_the_allocation_gauges_are_ratios_and_capacities_base_units():
    from extender.server.metrics import NodeUse, PoolUse

    metrics = Metrics()
    pool = PoolUse("p", 25.0, 0.0, capacity_tflops=312.5, capacity_vram_bytes=80 * 2**30)
    metrics.set_utilisation([NodeUse("n1", "p", 50.0, 100.0)], [pool], 0)
    from prometheus_client.parser import text_string_to_metric_families

    # read as numbers: how a float is written differs between prometheus-client releases
    families = text_string_to_metric_families(metrics.render().decode())
    page = {(sample.name, tuple(sorted(sample.labels.items()))): sample.value
            for family in families for sample in family.samples}
    assert page["tf_extender_pool_capacity_tflops", (("pool", "p"),)] == 312.5
    assert page["tf_extender_pool_capacity_vram_bytes", (("pool", "p"),)] == 80 * 2**30
    node = (("node", "n1"), ("pool", "p"))
    assert page["tf_extender_node_allocated_ratio", (*node, ("resource", "tflops"))] == 0.5
    assert page["tf_extender_node_allocated_ratio", (*node, ("resource", "vram"))] == 1.0
    assert page["tf_extender_pool_allocated_ratio", (("pool", "p"), ("resource", "tflops"))] == 0.25


def test_every_required_alert_is_shipped():
    assert {rule["alert"] for rule in rules()} >= REQUIRED_ALERTS


@pytest.mark.parametrize(("title", "query"), dashboard_queries())
def test_dashboard_query_parses_and_uses_exported_metrics(title: str, query: str):
    used = set(selectors(promql_parser.parse(query)))
    unknown = used - exported_names() - PROMETHEUS_OWN
    assert used and not unknown, f"{title}: {sorted(unknown)}"


def test_dashboard_covers_what_operators_ask_about():
    dash = json.loads(DASHBOARD.read_text())
    queries = " ".join(q for _, q in dashboard_queries())
    for name in ("tf_extender_pool_allocated_ratio", "tf_extender_node_allocated_ratio",
                 "tf_extender_partially_used_gpus", "tf_extender_request_duration_seconds_bucket",
                 "tf_extender_requests_total", "tf_extender_binds_total",
                 "tf_extender_capacity_only_failures_total",
                 "tf_extender_nodeclaims_created_total", "tf_extender_preemptions_total",
                 "tf_webhook_decisions_total", "tf_webhook_denials_total"):
        assert name in queries
    ids = [p["id"] for p in dash["panels"]]
    assert len(ids) == len(set(ids))
    variable = next(v for v in dash["templating"]["list"] if v["name"] == "pool")
    assert variable["definition"] == "label_values(tf_extender_pool_allocated_ratio, pool)"


def test_the_chart_ships_the_same_rules_and_dashboard():
    chart_rules = yaml.safe_load((CHART_FILES / "prometheus-rules.yaml").read_text())
    assert chart_rules == yaml.safe_load(RULES.read_text())["spec"], "copy the rules into the chart's files/"
    assert (CHART_FILES / "grafana-dashboard.json").read_text() == DASHBOARD.read_text()


def test_certificate_expiry_metric(tmp_path: Path):
    ca = authority.generate_ca()
    pair = authority.issue_serving_cert(ca, dns_names=["localhost"], ip_addresses=[], days=30)
    cert = tmp_path / "tls.crt"
    cert.write_bytes(pair.cert)
    expected = dt.datetime.now(dt.UTC) + dt.timedelta(days=30)
    assert abs(certificate_not_after(cert) - expected.timestamp()) < 120
    metrics = WebhookMetrics()
    metrics.track_certificate(cert)
    assert b"tf_webhook_certificate_expiry_timestamp_seconds " in metrics.exposition()
    assert certificate_not_after(tmp_path / "missing.crt") == 0.0


NOW = dt.datetime(2026, 1, 1, 12, 0, tzinfo=dt.UTC)


def _held(name: str, **extra: Any) -> dict[str, Any]:
    meta = {"name": name, "namespace": "ml", "annotations": {"tensor-fusion.ai/gpu-ids": "g0",
                                                            "tensor-fusion.ai/gpupool": "p"}}
    meta.update(extra.pop("meta", {}))
    return {"metadata": meta, "spec": {"nodeName": extra.pop("node", "n1")},
            "status": {"phase": extra.pop("phase", "Running")}}


def test_stranded_allocations_by_reason():
    pods = [
        _held("fine"),
        _held("stuck", meta={"deletionTimestamp": "2026-01-01T11:58:00Z"}),
        _held("closing", meta={"deletionTimestamp": "2026-01-01T11:59:30Z"}),  # within the grace minute
        _held("orphan", node="gone"),
        _held("lost", phase="Unknown"),
        _held("done", phase="Succeeded", node="gone"),
        {"metadata": {"name": "unbound", "annotations": {}}, "spec": {}, "status": {}},
    ]
    counts = count_stranded(pods, lambda node: node == "n1", NOW)
    assert dict(counts) == {("p", "terminating"): 1, ("p", "node_gone"): 1, ("p", "phase_unknown"): 1}
