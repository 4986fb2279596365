"""The webhook and the three GPU topology overrides of a pod: good values pass untouched, bad ones are
denied naming the key and the value."""

from __future__ import annotations

import pytest

from extender.common import contract as c
from extender.common.contract import parse_request
from tests.unit.fixtures.webhook import SCHEDULER, pod, tf, view
from webhook.mutation import mutate


@pytest.mark.parametrize(("key", "value"), [
    (c.REQUIRE_GPU_TOPOLOGY, "true"), (c.REQUIRE_GPU_TOPOLOGY, "false"),
    (c.GPU_TOPOLOGY_MAX_TIER, "0"), (c.GPU_TOPOLOGY_MAX_TIER, "3"),
    (c.GPU_TOPOLOGY_SOURCE, "auto"), (c.GPU_TOPOLOGY_SOURCE, "numa"), (c.GPU_TOPOLOGY_SOURCE, "vendor"),
])
def test_good_overrides_pass_and_stay_on_the_pod(key: str, value: str) -> None:
    result = mutate(pod({**tf(tflops_request="1", gpu_count="4"), key: value}), view(),
                    scheduler_name=SCHEDULER, index=1)
    assert result.denial is None
    assert result.pod["metadata"]["annotations"][key] == value


@pytest.mark.parametrize(("key", "value", "needle"), [
    (c.REQUIRE_GPU_TOPOLOGY, "yes", '"true" (hard) or "false" (soft)'),
    (c.REQUIRE_GPU_TOPOLOGY, "True", '"true" (hard) or "false" (soft)'),
    (c.GPU_TOPOLOGY_MAX_TIER, "4", "tier 0..3"),
    (c.GPU_TOPOLOGY_MAX_TIER, "-1", "tier 0..3"),
    (c.GPU_TOPOLOGY_MAX_TIER, "one", "tier 0..3"),
    (c.GPU_TOPOLOGY_SOURCE, "nvlink", "allowed: auto, numa, vendor"),
])
def test_bad_overrides_are_denied_naming_key_and_value(key: str, value: str, needle: str) -> None:
    result = mutate(pod({**tf(tflops_request="1"), key: value}), view(), scheduler_name=SCHEDULER, index=1)
    assert result.denial is not None and result.patch == []
    assert result.denial.reason == key
    assert f'{key}="{value}"' in result.denial.message and needle in result.denial.message


def test_the_request_carries_the_overrides() -> None:
    request = parse_request({c.GPU_POOL: "p", c.TFLOPS_REQUEST: "1", c.REQUIRE_GPU_TOPOLOGY: "true",
                             c.GPU_TOPOLOGY_MAX_TIER: "0", c.GPU_TOPOLOGY_SOURCE: "vendor"})
    overrides = (request.topology_required, request.topology_max_tier, request.topology_source)
    assert overrides == (True, 0, "vendor")
    plain = parse_request({c.GPU_POOL: "p", c.TFLOPS_REQUEST: "1"})
    assert (plain.topology_required, plain.topology_max_tier, plain.topology_source) == (None, None, None)
