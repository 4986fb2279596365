"""A GPUPool's capacity settings: its targets and mode, and the problems of bad ones."""

from __future__ import annotations

from extender.planning.pool import ProvisioningMode, pool_config
from tests.unit.fixtures.planning import amount, pool


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

