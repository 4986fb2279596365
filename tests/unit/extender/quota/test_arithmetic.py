"""The quota arithmetic as tables: parsing (0 semantics, defaults, malformed fields), demands (GPU count,
percent and whole-GPU requests), the checks and the status."""

from __future__ import annotations

from fractions import Fraction
from typing import Any

import pytest

from extender.common.contract import GPURequest, Isolation
from extender.quota import (
    Amounts,
    Demand,
    Dimension,
    Usage,
    by_namespace,
    check,
    demand_of,
    parse_quota,
    room,
)
from extender.quota.model import DEFAULT_ALERT_THRESHOLD, DEFAULT_MAX_WORKERS
from extender.quota.status import quota_status

GI = 1 << 30


def quota(spec: dict[str, Any], namespace: str = "team-a", name: str = "q",
          created: str = "2026-01-01T00:00:00Z") -> dict[str, Any]:
    return {"apiVersion": "tensor-fusion.ai/v1", "kind": "GPUResourceQuota",
            "metadata": {"name": name, "namespace": namespace, "creationTimestamp": created}, "spec": spec}


def req(tflops: str | None = "10", vram: int = 4 * GI, *, count: int = 1, percent: str | None = None,
        tflops_limit: str | None = None, vram_limit: int = 0, whole: bool = False) -> GPURequest:
    return GPURequest(pool="p", tflops_request=Fraction(tflops) if tflops else None,
                      tflops_limit=Fraction(tflops_limit) if tflops_limit else None,
                      percent_request=Fraction(percent) if percent else None, vram_request=vram,
                      vram_limit=vram_limit, gpu_count=count,
                      isolation=Isolation.SHARED if whole else Isolation.SOFT)


# --- parsing ------------------------------------------------------------------------------------------

@pytest.mark.parametrize(("spec", "field", "expected"), [
    ({}, "total_requests", None),  # no total: no cap
    ({"total": {"requests": {"tflops": "0", "vram": "0"}}}, "total_requests", Amounts(Fraction(0), 0)),
    ({"total": {"requests": {"tflops": "100", "vram": "40Gi"}}}, "total_requests",
     Amounts(Fraction(100), 40 * GI)),
    ({"total": {"limits": {"tflops": "1.5k"}}}, "total_limits", Amounts(Fraction(1500), 0)),
    ({}, "max_workers", DEFAULT_MAX_WORKERS),
    ({"total": {"maxWorkers": 0}}, "max_workers", 0),
    ({}, "alert_threshold", DEFAULT_ALERT_THRESHOLD),
    ({"total": {"alertThresholdPercent": 80}}, "alert_threshold", 80),
    ({"single": {"maxGPUCount": 2}}, "max_gpu_count", 2),
    ({"single": {"maxRequests": {"tflops": "0", "vram": "8Gi"}}}, "max_requests",
     Amounts(Fraction(0), 8 * GI)),
])
def test_parse_reads_tensorfusion_fields(spec, field, expected):
    parsed = parse_quota(quota(spec))
    assert getattr(parsed, field) == expected
    assert parsed.problems == ()


@pytest.mark.parametrize(("spec", "named"), [
    ({"total": {"requests": {"tflops": "lots", "vram": "1Gi"}}}, "spec.total.requests.tflops='lots'"),
    ({"total": {"requests": {"tflops": "-5", "vram": "1Gi"}}}, "spec.total.requests.tflops='-5': must not"),
    ({"total": {"maxWorkers": "ten"}}, "spec.total.maxWorkers='ten'"),
    ({"total": {"alertThresholdPercent": 120}}, "spec.total.alertThresholdPercent=120"),
    ({"single": {"defaultRequests": {"compute": "150"}}}, "spec.single.defaultRequests.compute='150'"),
    ({"single": "x"}, "spec.single='x': not an object"),
])
def test_a_malformed_field_is_named_and_caps_nothing(spec, named):
    parsed = parse_quota(quota(spec))
    assert any(p.startswith(named) for p in parsed.problems), parsed.problems


def test_several_quotas_of_a_namespace_oldest_first():
    grouped = by_namespace([quota({}, name="b", created="2026-02-01T00:00:00Z"),
                            quota({}, name="a", created="2026-03-01T00:00:00Z"),
                            quota({}, namespace="other", name="c")])
    assert [q.name for q in grouped["team-a"]] == ["b", "a"]
    assert [q.name for q in grouped["other"]] == ["c"]


# --- demands ------------------------------------------------------------------------------------------

A100 = (Fraction(312), 80 * GI)
T4 = (Fraction(65), 16 * GI)


@pytest.mark.parametrize(("request_", "capacities", "requests", "limits", "per_gpu"), [
    (req("10", 4 * GI), None, Amounts(Fraction(10), 4 * GI), Amounts(Fraction(10), 4 * GI),
     Amounts(Fraction(10), 4 * GI)),
    # request x GPU count; the limit defaults to the request
    (req("10", 4 * GI, count=3), None, Amounts(Fraction(30), 12 * GI), Amounts(Fraction(30), 12 * GI),
     Amounts(Fraction(10), 4 * GI)),
    (req("10", 4 * GI, tflops_limit="20", vram_limit=8 * GI, count=2), None, Amounts(Fraction(20), 8 * GI),
     Amounts(Fraction(40), 16 * GI), Amounts(Fraction(10), 4 * GI)),
    # a percent counts in the TFLOPS of the GPUs it lands on (each its own)
    (req(None, 2 * GI, percent="50", count=2), [A100, T4], Amounts(Fraction(156) + Fraction(65, 2), 4 * GI),
     Amounts(Fraction(377, 2), 4 * GI), Amounts(Fraction(156), 2 * GI)),
    # a whole GPU counts all of it
    (req(None, 0, whole=True), [T4], Amounts(*T4), Amounts(*T4), Amounts(*T4)),
])
def test_demand_of(request_, capacities, requests, limits, per_gpu):
    demand = demand_of(request_, capacities)
    assert demand is not None
    assert (demand.requests, demand.limits, demand.per_gpu_requests, demand.workers) == (
        requests, limits, per_gpu, 1)


@pytest.mark.parametrize("request_", [req(None, 0, percent="25"), req(None, 0, whole=True)])
def test_a_demand_that_depends_on_the_gpus_is_unknown_without_them(request_):
    assert demand_of(request_) is None


# --- checks -------------------------------------------------------------------------------------------

TOTAL = {"total": {"requests": {"tflops": "100", "vram": "40Gi"}, "maxWorkers": 5}}


def used(tflops: int = 0, vram: int = 0, workers: int = 0) -> Usage:
    return Usage(Amounts(Fraction(tflops), vram * GI), Amounts(Fraction(tflops), vram * GI), workers)


@pytest.mark.parametrize(("spec", "usage", "asked", "dimension", "unresolvable"), [
    (TOTAL, used(90, 10, 1), req("10"), None, False),  # exactly at the total: admitted
    (TOTAL, used(91, 10, 1), req("10"), Dimension.TOTAL_TFLOPS_REQUEST, False),
    (TOTAL, used(0, 37, 1), req("1", 4 * GI), Dimension.TOTAL_VRAM_REQUEST, False),
    (TOTAL, used(0, 0, 5), req("1"), Dimension.TOTAL_WORKERS, False),
    (TOTAL, used(50, 0, 1), req("20", count=3), Dimension.TOTAL_TFLOPS_REQUEST, False),  # x GPU count
    # a total of 0 allows nothing
    ({"total": {"requests": {"tflops": "0", "vram": "0"}}}, used(), req("1"), Dimension.TOTAL_TFLOPS_REQUEST,
     False),
    # a dimension the pod adds nothing to is not checked
    ({"total": {"requests": {"tflops": "100", "vram": "0"}}}, used(), req("1", 0), None, False),
    ({"total": {"limits": {"tflops": "15", "vram": "40Gi"}}}, used(),
     req("10", tflops_limit="20"), Dimension.TOTAL_TFLOPS_LIMIT, False),
    # single caps: 0 is no cap; per GPU; unresolvable
    ({"single": {"maxRequests": {"tflops": "0", "vram": "0"}}}, used(), req("500", 500 * GI), None, False),
    ({"single": {"maxRequests": {"tflops": "20", "vram": "0"}}}, used(), req("20", count=4), None, False),
    ({"single": {"maxRequests": {"tflops": "20", "vram": "0"}}}, used(), req("21"),
     Dimension.SINGLE_TFLOPS_REQUEST, True),
    ({"single": {"maxLimits": {"tflops": "0", "vram": "8Gi"}}}, used(), req("1", 4 * GI, vram_limit=9 * GI),
     Dimension.SINGLE_VRAM_LIMIT, True),
    ({"single": {"maxGPUCount": 2}}, used(), req("1", count=3), Dimension.SINGLE_GPU_COUNT, True),
    # single caps are judged before totals
    ({**TOTAL, "single": {"maxGPUCount": 1}}, used(100, 40, 5), req("1", count=2), Dimension.SINGLE_GPU_COUNT,
     True),
])
def test_check(spec, usage, asked, dimension, unresolvable):
    demand = demand_of(asked)
    assert demand is not None
    refusal = check([parse_quota(quota(spec))], usage, "team-a", [demand])
    assert (refusal.dimension if refusal else None) == dimension
    if refusal is not None:
        assert refusal.unresolvable is unresolvable
        assert "team-a" in refusal.message and dimension.value in refusal.message


def test_the_message_names_namespace_dimension_used_requested_and_cap():
    refusal = check([parse_quota(quota(TOTAL))], used(95, 0, 1), "team-a", [demand_of(req("10"))])
    assert refusal is not None
    assert refusal.message == (
        "GPU quota exceeded in namespace team-a (GPUResourceQuota q) for "
        "total.max.tflops.request: used 95 TFLOPS, requested 10 TFLOPS, cap 100 TFLOPS")


def test_a_gang_is_judged_whole():
    """Several pods of one namespace at once: their sum must fit, each must pass the single caps."""
    quotas = [parse_quota(quota(TOTAL))]
    five = [demand_of(req("20")) for _ in range(5)]
    assert check(quotas, used(), "team-a", five) is None  # type: ignore[arg-type]
    refusal = check(quotas, used(1), "team-a", five)  # type: ignore[arg-type]
    assert refusal is not None and refusal.dimension is Dimension.TOTAL_TFLOPS_REQUEST
    assert refusal.requested == "100 TFLOPS"


def test_every_quota_of_the_namespace_applies_and_other_namespaces_none():
    quotas = [parse_quota(quota(TOTAL, name="loose")),
              parse_quota(quota({"total": {"requests": {"tflops": "10", "vram": "40Gi"}}}, name="tight")),
              parse_quota(quota({"total": {"requests": {"tflops": "0", "vram": "0"}}}, namespace="other"))]
    refusal = check(quotas, used(5), "team-a", [demand_of(req("10"))])  # type: ignore[list-item]
    assert refusal is not None and refusal.quota == "tight"
    assert check(quotas, used(), "no-quota", [demand_of(req("1000"))]) is None  # type: ignore[list-item]


def test_a_resize_is_judged_by_its_delta():
    quotas = [parse_quota(quota(TOTAL))]
    before, after = demand_of(req("30")), demand_of(req("40"))
    assert before is not None and after is not None
    delta = after.minus(before)
    assert delta.workers == 0 and delta.requests.tflops == 10
    assert check(quotas, used(90, 0, 5), "team-a", [delta]) is None  # workers full: a resize adds none
    assert check(quotas, used(91, 0, 5), "team-a", [delta]) is not None
    assert check(quotas, used(100, 0, 5), "team-a", [before.minus(after)]) is None  # shrinking always passes


def test_room_is_the_least_any_quota_leaves():
    quotas = [parse_quota(quota(TOTAL)),
              parse_quota(quota({"total": {"requests": {"tflops": "50", "vram": "100Gi"}}}, name="b"))]
    requests, limits = room(quotas, used(45, 10), "team-a")
    assert requests == Amounts(Fraction(5), 30 * GI) and limits is None
    assert room(quotas, used(200, 200), "team-a")[0] == Amounts(Fraction(0), 0)


# --- status -------------------------------------------------------------------------------------------

def test_status_as_tensorfusion_writes_it():
    q = parse_quota(quota({"total": {"requests": {"tflops": "80", "vram": "40Gi"}, "maxWorkers": 8,
                                     "alertThresholdPercent": 90}}))
    status = quota_status(q, used(70, 10, 2), None, "2026-01-01T00:00:00Z")
    assert status["used"] == {"requests": {"tflops": "70", "vram": "10Gi"},
                              "limits": {"tflops": "70", "vram": "10Gi"}, "workers": 2}
    assert status["availablePercent"] == {"requests.tflops": "12.50", "requests.vram": "75.00",
                                          "limits.tflops": "100", "limits.vram": "100", "workers": "75.00"}
    (ready,) = status["conditions"]
    assert (ready["type"], ready["status"], ready["reason"]) == ("Ready", "True", "CapacitySufficient")
    crossed = quota_status(q, used(73, 10, 2), status, "2026-01-01T00:01:00Z")
    (ready,) = crossed["conditions"]
    assert (ready["status"], ready["reason"]) == ("False", "AlertThresholdReached")
    assert "requests.tflops" in ready["message"] and crossed["lastUpdateTime"] == "2026-01-01T00:01:00Z"
    again = quota_status(q, used(73, 10, 2), crossed, "2026-01-01T00:02:00Z")
    assert again == crossed  # nothing moved: nothing to write, not even the time


def test_status_of_a_quota_with_a_malformed_field_says_so():
    q = parse_quota(quota({"total": {"requests": {"tflops": "many", "vram": "1Gi"}}}))
    (ready,) = quota_status(q, used(), None, "t")["conditions"]
    assert (ready["status"], ready["reason"]) == ("False", "InvalidFields")
    assert "spec.total.requests.tflops='many'" in ready["message"]


def test_demand_delta_keeps_per_gpu_figures():
    a = Demand(Amounts(Fraction(1), 1), Amounts(Fraction(1), 1), Amounts(Fraction(5), 5))
    assert a.minus(a).per_gpu_requests == Amounts(Fraction(5), 5)
