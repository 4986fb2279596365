"""A GPUPool's capacity settings: its targets and mode, and the problems of bad ones."""

from __future__ import annotations

from typing import Any

import pytest

from extender.planning.pool import PoolConfig, ProvisioningMode, pool_config
from tests.unit.fixtures.planning import amount, pool
from tests.unit.fixtures.sweep import field_name, sweep


def test_pool_config_parses_targets_and_reports_problems() -> None:
    config = pool_config(
        pool(
            minResources={"tflops": "200", "vram": "48Gi"},
            warmResources={"tflops": 100},
            maxResources={"tflops": "1k"},
        )
    )
    assert config.mode is ProvisioningMode.KARPENTER and not config.problems
    assert config.min == amount(200, 48) and config.warm == amount(100, 0)
    assert config.max is not None and config.max.tflops == 1000 and config.max.vram > 10**20  # no VRAM cap
    bad = pool_config(
        {
            "metadata": {"name": "q"},
            "spec": {
                "capacityConfig": {"minResources": {"vram": "x"}},
                "nodeManagerConfig": {
                    "provisioningMode": "Karpenter",
                    "nodeProvisioner": {"karpenterNodeClassRef": {"name": "n"}},
                },
            },
        }
    )
    assert any("minResources.vram='x'" in p for p in bad.problems)
    assert any("missing group, kind, version" in p for p in bad.problems)
    assert pool_config({"metadata": {"name": "r"}}).mode is ProvisioningMode.AUTO_SELECT



# --- total: every field, every wrong type --------------------------------------------------------------

_KARPENTER_POOL = {
    "metadata": {"name": "p", "uid": "u1", "annotations": {"tensor-fusion.ai/manual-compaction":
                                                           "2026-01-01T00:00:00Z"}},
    "spec": {
        "capacityConfig": {"minResources": {"tflops": "100", "vram": "10Gi"},
                           "warmResources": {"tflops": "10", "vram": "1Gi"},
                           "maxResources": {"tflops": "1000", "vram": "100Gi"}},
        "nodeManagerConfig": {
            "provisioningMode": "Karpenter",
            "nodeCompaction": {"period": "5m"},
            "nodeProvisioner": {
                "gpuRequirements": [{"key": "k", "operator": "In", "values": ["a"]}],
                "karpenterNodeClassRef": {"group": "karpenter.k8s.aws", "kind": "EC2NodeClass",
                                          "version": "v1", "name": "gpu"},
                "gpuNodeLabels": {"a": "b"}, "gpuNodeAnnotations": {"c": "d"},
                "gpuTaints": [{"key": "gpu", "value": "true", "effect": "NoSchedule"}]}}}}
_PROVISIONED_POOL = {"metadata": {"name": "q"}, "spec": {"nodeManagerConfig": {
    "provisioningMode": "Provisioned", "nodeProvisioner": {"nodeClass": "gpu-class"}}}}


@pytest.mark.parametrize("pool", [_KARPENTER_POOL, _PROVISIONED_POOL], ids=["karpenter", "provisioned"])
def test_every_field_of_the_wrong_type_is_a_named_problem_never_an_exception(pool: dict[str, Any]) -> None:
    def parse(obj: Any) -> list[str]:
        config = pool_config(obj)
        assert isinstance(config, PoolConfig)
        return list(config.problems)

    # metadata is the API server's (strings), read leniently: it only has to not raise
    failures = sweep(pool, parse, named=lambda path: None if path[0] == "metadata" else field_name(path))
    assert not failures, "\n".join(failures)


@pytest.mark.parametrize(("manager", "needle"), [
    ({"nodeCompaction": "10m"}, "nodeManagerConfig.nodeCompaction='10m': expected an object"),
    ({"nodeCompaction": {"period": "99999999999999h"}}, "nodeCompaction.period: '99999999999999h' is longer"),
    ({"nodeProvisioner": {"gpuTaints": 5}}, "nodeProvisioner.gpuTaints=5: expected a list"),
])
def test_the_shapes_that_stopped_every_pool_are_named_problems(manager: dict[str, Any], needle: str) -> None:
    config = pool_config({"metadata": {"name": "bad"}, "spec": {"nodeManagerConfig": manager}})
    assert any(needle in p for p in config.problems), config.problems
