"""The ``tf-extender`` command line: its commands, ``serve``'s flags and defaults, and usage errors."""

from __future__ import annotations

import sys
import types
from typing import Any

import pytest

from extender import cli


def test_serve_flags_and_defaults() -> None:
    args = cli.build_parser().parse_args(["serve"])
    assert (args.port, args.bind_address, args.prefix, args.kubeconfig, args.cert_dir) == (
        8080, "127.0.0.1", "/scheduler", None, None)
    assert (args.inventory_source, args.max_pods_per_node, args.preemptor, args.log_level) == (
        "auto", 256, True, "info")
    args = cli.build_parser().parse_args([
        "serve", "--port", "9443", "--bind-address", "0.0.0.0", "--prefix", "/x", "--kubeconfig", "k",
        "--cert-dir", "/certs", "--inventory-source", "node-labels", "--max-pods-per-node", "8",
        "--no-preemptor", "--log-level", "debug"])
    assert (args.port, args.inventory_source, args.max_pods_per_node, args.preemptor) == (
        9443, "node-labels", 8, False)


@pytest.mark.parametrize("bad", [["serve", "--inventory-source", "magic"],
                                 ["serve", "--max-pods-per-node", "0"], ["bogus"], []])
def test_bad_usage_exits_with_a_message(bad: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        cli.main(bad)
    assert exc.value.code == 2
    assert capsys.readouterr().err


def test_unreadable_kubeconfig_is_reported(tmp_path: Any, capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["serve", "--kubeconfig", str(tmp_path / "missing")]) == 2
    assert "cannot load Kubernetes configuration" in capsys.readouterr().err


def test_simulate_is_dispatched_to_the_simulator(monkeypatch: pytest.MonkeyPatch) -> None:
    seen: list[Any] = []
    fake = types.ModuleType("extender.simulate_cmd")
    fake.add_simulate_arguments = lambda parser: parser.add_argument("--cluster")  # type: ignore[attr-defined]
    fake.main_simulate = lambda args: seen.append(args.cluster) or 0  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "extender.simulate_cmd", fake)
    assert cli.main(["simulate", "--cluster", "c.yaml"]) == 0
    assert seen == ["c.yaml"]


def test_simulate_without_the_simulator_says_so(monkeypatch: pytest.MonkeyPatch,
                                                capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setitem(sys.modules, "extender.simulate_cmd", None)
    assert cli.main(["simulate"]) == 2
    assert "simulator" in capsys.readouterr().err


# ``tf-extender serve``'s flags (option strings -> dest, default, choices) as they were when the flags were
# declared in four places, before each controller package declared its own: the chart and the manifests
# pass these, so the gathered parser must keep every one with its default. Since one convention holds for
# every option the forms changed deliberately, the values did not: each switch is --x/--no-x
# (--no-preemptor is now the off form of --preemptor, --write-gpu-status gained --no-write-gpu-status),
# times take Go durations (the defaults stay these seconds), and --config FILE reads any of them.
SERVE_FLAGS_BEFORE_THE_REGISTRY: dict[str, tuple[str, Any, list[str] | None]] = {
    "--autoscale --no-autoscale": ("autoscale", False, None),
    "--autoscale-cron-time-zone": ("autoscale_cron_time_zone", "UTC", None),
    "--autoscale-interval": ("autoscale_interval", 30.0, None),
    "--autoscale-usage-file": ("autoscale_usage_file", None, None),
    "--autoscale-prometheus-url": ("autoscale_prometheus_url", None, None),
    "--autoscale-usage-metrics": ("autoscale_usage_metrics", "dcgm", ["dcgm", "hypervisor"]),
    "--autoscale-tflops-query": ("autoscale_tflops_query", None, None),
    "--autoscale-vram-query": ("autoscale_vram_query", None, None),
    "--autoscale-prometheus-step": ("autoscale_prometheus_step", "30s", None),
    "--autoscale-prometheus-max-points": ("autoscale_prometheus_max_points", 1000, None),
    "--bind-address": ("bind_address", "127.0.0.1", None),
    "--bind-deadline": ("bind_deadline", 55.0, None),
    "--capacity-controllers --no-capacity-controllers": ("capacity_enabled", True, None),
    "--capacity-interval": ("capacity_interval", 10.0, None),
    "--catalog": ("catalog_file", None, None),
    "--catalog-configmap": ("catalog_configmap", None, None),
    "--computing-vendor": ("computing_vendor_file", None, None),
    "--cloud-key-dir": ("cloud_key_dir", "/tmp", None),
    "--cloud-endpoint-allow": ("cloud_endpoint_allow", "", None),  # new: no endpoint from cluster objects
    "--cluster-name": ("cluster_name", "tensor-fusion", None),
    "--node-join-timeout": ("node_join_timeout", 900.0, None),
    "--orphan-grace": ("orphan_grace", 600.0, None),
    "--capacity-error-backoff": ("capacity_error_backoff", 300.0, None),
    "--cert-dir": ("cert_dir", None, None),
    "--defrag --no-defrag": ("defrag", True, None),
    "--defrag-replacement-timeout": ("defrag_replacement_timeout", 300.0, None),
    "--expansion --no-expansion": ("expansion_enabled", True, None),
    "--expansion-claim-timeout": ("expansion_claim_timeout", 900.0, None),
    "--expansion-delay": ("expansion_delay", 10.0, None),
    "--expansion-lease-namespace": ("expansion_lease_namespace", "tensor-fusion-sys", None),
    "--expansion-scheduler-name": ("expansion_scheduler_name", "tensor-fusion-scheduler", None),
    "--filter-first-choice --no-filter-first-choice": ("filter_first_choice", True, None),
    "--gpu-reservations --no-gpu-reservations": ("gpu_reservations", True, None),
    "--gpu-status-interval": ("gpu_status_interval", 1.0, None),
    "--instance-topology-configmap": ("instance_topology_configmap", "", None),
    "--inventory-source": ("inventory_source", "auto", ["gpu-objects", "node-labels", "auto"]),
    "--kubeconfig": ("kubeconfig", None, None),
    "--log-level": ("log_level", "info", ["debug", "info", "warning", "error"]),
    "--max-inflight-nodes": ("max_inflight_nodes", 15, None),
    "--max-pods-per-node": ("max_pods_per_node", 256, None),
    "--metrics-bind-address": ("metrics_bind_address", "0.0.0.0", None),
    "--metrics-port": ("metrics_port", 0, None),
    "--preemptor --no-preemptor": ("preemptor", True, None),
    "--node-protection-time": ("node_protection_time", 300.0, None),
    "--node-provisioner": ("node_provisioner", "auto", ["auto", "karpenter", "cluster-autoscaler"]),
    "--nudge-scheduler --no-nudge-scheduler": ("nudge_scheduler", True, None),
    "--placeholder-image": ("placeholder_image", "registry.k8s.io/pause:3.10", None),
    "--placeholder-namespace": ("placeholder_namespace", "tensor-fusion-sys", None),
    "--placeholder-scheduler-name": ("placeholder_scheduler_name", "default-scheduler", None),
    "--port": ("port", 8080, None),
    "--prefix": ("prefix", "/scheduler", None),
    "--write-gpu-status --no-write-gpu-status": ("write_gpu_status", False, None),
    "--config": ("config", None, None),
}
# flags added since, each with its default
SERVE_FLAGS_ADDED_SINCE: dict[str, tuple[str, Any, list[str] | None]] = {
    "--tensorfusion-clusters --no-tensorfusion-clusters": ("tfcluster_enabled", True, None),
    "--tensorfusion-cluster-interval": ("tensorfusion_cluster_interval", 30.0, None),
    "--gpu-nodes --no-gpu-nodes": ("gpu_nodes_enabled", True, None),
    "--gpu-node-interval": ("gpu_node_interval", 5.0, None),
    "--gpu-quotas --no-gpu-quotas": ("gpu_quotas_enabled", True, None),
    "--gpu-quota-status-interval": ("gpu_quota_status_interval", 5.0, None),
    "--gang-scheduling --no-gang-scheduling": ("gang_scheduling", True, None),
    "--gang-reserve-timeout": ("gang_reserve_timeout", 60.0, None),
}


def test_serve_keeps_every_flag_and_default_it_had_before_the_options_were_gathered(
        monkeypatch: pytest.MonkeyPatch) -> None:
    import argparse
    import os

    for name in [n for n in os.environ if n.startswith("TF_") or n == "POD_NAMESPACE"]:
        monkeypatch.delenv(name)
    (commands,) = [a for a in cli.build_parser()._actions if isinstance(a, argparse._SubParsersAction)]
    serve = commands.choices["serve"]
    flags = {" ".join(a.option_strings): (a.dest, a.default, list(a.choices) if a.choices else None)
             for a in serve._actions if not isinstance(a, argparse._HelpAction)}
    assert flags == {**SERVE_FLAGS_BEFORE_THE_REGISTRY, **SERVE_FLAGS_ADDED_SINCE}


def test_serve_flags_reach_each_controllers_settings() -> None:
    args = cli.build_parser().parse_args([
        "serve", "--no-preemptor", "--no-nudge-scheduler", "--write-gpu-status", "--gpu-status-interval", "2",
        "--no-defrag", "--defrag-replacement-timeout", "30", "--expansion-delay", "3",
        "--node-provisioner", "karpenter", "--no-capacity-controllers", "--capacity-interval", "4"])
    settings = cli.settings_from_args(args).controllers
    assert (settings["preemptor"], settings["nudge"]) == (False, False)
    assert settings["gpustatus"] is not None and settings["gpustatus"].interval == 2.0
    assert (settings["defrag"].enabled, settings["defrag"].replacement_timeout) == (False, 30.0)
    assert settings["expansion"].expansion.delay_seconds == 3.0
    assert settings["expansion"].autoscaler.provisioner.value == "karpenter"
    assert (settings["capacity"].enabled, settings["capacity"].interval_seconds) == (False, 4.0)
    assert cli.settings_from_args(cli.build_parser().parse_args(["serve"])).controllers["gpustatus"] is None
