"""The pod contract: parsing with defaults and layers, denials that name key and value, canonical output."""

from __future__ import annotations

from fractions import Fraction

import pytest
from hypothesis import given
from hypothesis import strategies as st

from extender.common import contract as c
from extender.common.contract import (
    AutoscaleTarget,
    ContractError,
    Isolation,
    PoolDefaults,
    QoS,
    RequestContext,
    decode_index,
    index_resource,
    index_resource_names,
    native_gpu_count,
    parse_gpu_ids,
    parse_request,
    render_annotations,
)
from extender.common.profiles import profile_annotations

POOLS = {"pool-a": PoolDefaults("pool-a"), "pool-low": PoolDefaults("pool-low", default_qos=QoS.LOW)}
CTX = RequestContext(pools=POOLS, default_pool="pool-a")


def _req(**annotations: str) -> dict[str, str]:
    return {f"tensor-fusion.ai/{k.replace('_', '-')}": v for k, v in annotations.items()}


@pytest.mark.parametrize(
    ("annotations", "key", "value", "reason"),
    [
        (_req(tflops_request="ten"), c.TFLOPS_REQUEST, "ten", "not a Kubernetes quantity"),
        (_req(tflops_request="-1"), c.TFLOPS_REQUEST, "-1", "must not be negative"),
        (_req(vram_limit="-1Gi"), c.VRAM_LIMIT, "-1Gi", "must not be negative"),
        (_req(vram_request="1.5"), c.VRAM_REQUEST, "1.5", "whole number of bytes"),
        (_req(tflops_request="10", tflops_limit="5"), c.TFLOPS_LIMIT, "5", "below the request 10"),
        (_req(vram_request="8Gi", vram_limit="4Gi"), c.VRAM_LIMIT, "4Gi", "below the request 8Gi"),
        (_req(compute_percent_request="50", compute_percent_limit="20"), c.PERCENT_LIMIT, "20",
         "below the request 50"),
        (_req(compute_percent_request="101"), c.PERCENT_REQUEST, "101", "within 0..100"),
        (_req(compute_percent_limit="-5"), c.PERCENT_LIMIT, "-5", "must not be negative"),
        (_req(tflops_request="1", compute_percent_request="10"), c.TFLOPS_REQUEST, "1", "together"),
        (_req(tflops_limit="1", compute_percent_limit="10"), c.TFLOPS_LIMIT, "1", "together"),
        (_req(tflops_request="1", gpu_count="0"), c.GPU_COUNT, "0", "integer within 1..128"),
        (_req(tflops_request="1", gpu_count="129"), c.GPU_COUNT, "129", "integer within 1..128"),
        (_req(tflops_request="1", gpu_count="1.5"), c.GPU_COUNT, "1.5", "integer within 1..128"),
        (_req(tflops_request="1", gpu_count="two"), c.GPU_COUNT, "two", "integer within 1..128"),
        (_req(tflops_request="1", gpu_indices="0,a"), c.GPU_INDICES, "0,a", "non-negative integers"),
        (_req(tflops_request="1", gpu_indices="-1"), c.GPU_INDICES, "-1", "non-negative integers"),
        (_req(tflops_request="1", gpu_indices="1,1"), c.GPU_INDICES, "1,1", "same GPU index twice"),
        (_req(tflops_request="1", gpu_indices="0,1", gpu_count="3"), c.GPU_COUNT, "3", "does not match"),
        (_req(tflops_request="1", isolation="exclusive"), c.ISOLATION, "exclusive", "allowed: shared, soft"),
        (_req(tflops_request="1", qos="urgent"), c.QOS, "urgent", "allowed: low, medium, high, critical"),
        (_req(tflops_request="1", autoscale_target="gpu"), c.AUTOSCALE_TARGET, "gpu",
         "allowed: all, compute, vram"),
        (_req(tflops_request="1", autoscale="yes"), c.AUTOSCALE, "yes", '"true" or "false"'),
        (_req(tflops_request="1", gpupool="nope"), c.GPU_POOL, "nope", "no such GPUPool"),
        (_req(gpu_count="1"), c.TFLOPS_REQUEST, "", "no TFLOPS, compute percent or VRAM"),
    ],
)
def test_denials_name_key_and_value(annotations: dict[str, str], key: str, value: str, reason: str) -> None:
    with pytest.raises(ContractError) as raised:
        parse_request(annotations, CTX)
    assert raised.value.key == key
    assert str(raised.value).startswith(f'{key}="{value}"')
    assert reason in str(raised.value)


def test_no_default_pool_is_denied() -> None:
    with pytest.raises(ContractError, match="no GPUPool is annotated as the default pool"):
        parse_request(_req(tflops_request="1"), RequestContext(pools=POOLS))


def test_unknown_default_pool_is_denied_with_its_name() -> None:
    with pytest.raises(ContractError, match='gpupool="gone": no such GPUPool'):
        parse_request(_req(tflops_request="1"), RequestContext(pools=POOLS, default_pool="gone"))


def test_pool_lookup_replaces_the_pool_map() -> None:
    lookup = RequestContext(pool_lookup=lambda name: POOLS.get(name), default_pool="pool-low")
    assert parse_request(_req(tflops_request="1", tflops_limit="2"), lookup).qos is QoS.LOW
    with pytest.raises(ContractError, match="no such GPUPool"):
        parse_request(_req(tflops_request="1", gpupool="nope"), lookup)


@pytest.mark.parametrize(
    ("annotations", "expected"),
    [
        (_req(tflops_limit="10"), {"tflops_request": Fraction(10), "tflops_limit": Fraction(10)}),
        (_req(tflops_request="2"), {"tflops_request": Fraction(2), "tflops_limit": Fraction(2)}),
        (_req(vram_limit="8Gi"), {"vram_request": 8 * 2**30, "vram_limit": 8 * 2**30}),
        (_req(compute_percent_request="25"),
         {"percent_request": Fraction(25), "percent_limit": Fraction(25)}),
        (_req(tflops_request="1"), {"pool": "pool-a", "gpu_count": 1, "isolation": Isolation.SOFT,
                                    "qos": QoS.HIGH, "autoscale": False,
                                    "autoscale_target": AutoscaleTarget.ALL}),
        (_req(tflops_request="1", tflops_limit="2"), {"qos": QoS.MEDIUM}),
        (_req(tflops_request="1", tflops_limit="2", gpupool="pool-low"), {"qos": QoS.LOW}),
        (_req(tflops_request="1", tflops_limit="2", gpupool="pool-low", qos="critical"),
         {"qos": QoS.CRITICAL}),
        (_req(tflops_request="1", gpu_indices="3, 1"), {"gpu_indices": (3, 1), "gpu_count": 2}),
        (_req(isolation="shared"), {"isolation": Isolation.SHARED, "gpu_count": 1}),
        (_req(tflops_request="1", autoscale="TRUE", autoscale_target="vram"),
         {"autoscale": True, "autoscale_target": AutoscaleTarget.VRAM}),
        (_req(tflops_request="1", gpu_model="H100", vendor="NVIDIA"),
         {"gpu_model": "H100", "vendor": "NVIDIA"}),
    ],
)
def test_defaults_and_values(annotations: dict[str, str], expected: dict[str, object]) -> None:
    request = parse_request(annotations, CTX)
    assert {k: getattr(request, k) for k in expected} == expected


def test_native_gpu_limit_alone_means_whole_shared_gpus() -> None:
    request = parse_request({}, RequestContext(pools=POOLS, default_pool="pool-a", native_gpu_count=2))
    assert (request.isolation, request.gpu_count, request.takes_whole_gpu) == (Isolation.SHARED, 2, True)


def test_native_gpu_limit_with_fractions_keeps_soft_isolation() -> None:
    ctx = RequestContext(pools=POOLS, default_pool="pool-a", native_gpu_count=2)
    request = parse_request(_req(tflops_request="5"), ctx)
    assert (request.isolation, request.gpu_count) == (Isolation.SOFT, 2)


def test_gpu_count_must_match_native_limit() -> None:
    ctx = RequestContext(pools=POOLS, default_pool="pool-a", native_gpu_count=2)
    with pytest.raises(ContractError, match=r'gpu-count="3".*native GPU limit of 2'):
        parse_request(_req(tflops_request="5", gpu_count="3"), ctx)


def test_profile_values_are_overridden_by_pod_annotations() -> None:
    profile = profile_annotations({
        "resources": {"requests": {"tflops": "5", "vram": "2Gi"}, "limits": {"tflops": "10", "vram": "4Gi"}},
        "qos": "low", "gpuCount": 2, "poolName": "pool-low",
        "autoScalingConfig": {"autoSetResources": {"enable": True, "targetResource": "compute"}},
    })
    ctx = RequestContext(profile_annotations=profile, profile_source="WorkloadProfile ns/p", pools=POOLS,
                         default_pool="pool-a")
    request = parse_request(_req(tflops_limit="20"), ctx)
    assert (request.tflops_request, request.tflops_limit) == (Fraction(5), Fraction(20))
    assert (request.vram_request, request.qos, request.gpu_count, request.pool) == (2 * 2**30, QoS.LOW, 2,
                                                                                      "pool-low")
    assert (request.autoscale, request.autoscale_target) == (True, AutoscaleTarget.COMPUTE)


def test_pod_percent_replaces_profile_tflops() -> None:
    profile = profile_annotations({"resources": {"requests": {"tflops": "5"}, "limits": {"tflops": "10"}}})
    ctx = RequestContext(profile_annotations=profile, pools=POOLS, default_pool="pool-a")
    request = parse_request(_req(compute_percent_request="30"), ctx)
    assert (request.tflops_request, request.percent_request) == (None, Fraction(30))


def test_profile_errors_name_the_profile() -> None:
    ctx = RequestContext(profile_annotations={c.QOS: "bogus", c.TFLOPS_REQUEST: "1"},
                         profile_source="WorkloadProfile ns/p", pools=POOLS, default_pool="pool-a")
    with pytest.raises(ContractError, match=r'qos="bogus" \(from WorkloadProfile ns/p\)'):
        parse_request({}, ctx)


def test_render_is_canonical_and_complete() -> None:
    request = parse_request(_req(tflops_request="1.5", vram_limit="16384Mi", gpu_indices="0,1"), CTX)
    assert render_annotations(request) == {
        c.GPU_POOL: "pool-a", c.TFLOPS_REQUEST: "1500m", c.TFLOPS_LIMIT: "1500m",
        c.VRAM_REQUEST: "16Gi", c.VRAM_LIMIT: "16Gi", c.GPU_COUNT: "2", c.GPU_INDICES: "0,1",
        c.ISOLATION: "soft", c.QOS: "high", c.AUTOSCALE: "false", c.AUTOSCALE_TARGET: "all",
    }


def test_zero_vram_request_survives_rendering() -> None:
    request = parse_request(_req(vram_request="0"), CTX)
    assert parse_request(render_annotations(request), CTX) == request


@pytest.mark.parametrize(("index", "resource"), [(1, ("tensor-fusion.ai/index_0", 1)),
                                                 (8, ("tensor-fusion.ai/index_0", 8)),
                                                 (9, ("tensor-fusion.ai/index_1", 1)),
                                                 (128, ("tensor-fusion.ai/index_f", 8))])
def test_index_encoding(index: int, resource: tuple[str, int]) -> None:
    assert index_resource(index) == resource
    assert decode_index({resource[0]: str(resource[1])}) == index


@pytest.mark.parametrize("index", [0, 129, -1])
def test_index_out_of_range(index: int) -> None:
    with pytest.raises(ValueError, match=r"outside 1\.\.128"):
        index_resource(index)


def test_index_names_and_undecodable_values() -> None:
    assert len(index_resource_names()) == 16
    assert decode_index({"tensor-fusion.ai/index_0": "9"}) is None
    assert decode_index({"cpu": "1"}) is None


@pytest.mark.parametrize(
    ("limits", "count"),
    [([{}], None), ([{"nvidia.com/gpu": "2"}], 2), ([{"nvidia.com/gpu": 1}, {"amd.com/gpu": "1"}], 2)],
)
def test_native_gpu_count(limits: list[dict[str, object]], count: int | None) -> None:
    assert native_gpu_count(limits) == count


@pytest.mark.parametrize("value", ["1.5", "x", "-1"])
def test_native_gpu_count_rejects_fractions(value: str) -> None:
    with pytest.raises(ContractError, match=f'nvidia.com/gpu="{value}"'):
        native_gpu_count([{"nvidia.com/gpu": value}])


def test_parse_gpu_ids() -> None:
    assert parse_gpu_ids(" gpu-a, ,gpu-b") == ("gpu-a", "gpu-b")
    assert parse_gpu_ids(None) == ()


_KEYS = [c.TFLOPS_REQUEST, c.TFLOPS_LIMIT, c.VRAM_REQUEST, c.VRAM_LIMIT, c.PERCENT_REQUEST, c.PERCENT_LIMIT,
         c.GPU_COUNT, c.GPU_POOL, c.GPU_INDICES, c.ISOLATION, c.QOS, c.AUTOSCALE, c.AUTOSCALE_TARGET]
_VALUES = st.sampled_from(["1", "0", "10", "1.5", "500m", "16Gi", "-1", "x", "150", "0,1", "shared", "soft",
                           "high", "true", "vram", "pool-a", "pool-low", ""]) | st.text(max_size=6)


@given(st.dictionaries(st.sampled_from(_KEYS), _VALUES, max_size=8))
def test_any_annotations_parse_or_raise_and_rerender_stably(annotations: dict[str, str]) -> None:
    try:
        request = parse_request(annotations, CTX)
    except ContractError as exc:
        assert exc.key in str(exc)
        return
    rendered = render_annotations(request)
    assert parse_request(rendered, CTX) == request
    assert render_annotations(parse_request(rendered, CTX)) == rendered


@given(st.sampled_from(["soft", "shared"]), st.fractions(min_value=0, max_value=1000, max_denominator=1000),
       st.booleans(), st.integers(min_value=0, max_value=2**45))
def test_the_allocation_record_reads_back_the_share_it_was_written_from(
        isolation: str, amount: Fraction, percent: bool, vram: int) -> None:
    request = c.GPURequest(pool="p", isolation=c.Isolation(isolation), vram_request=vram,
                           **({"percent_request": min(amount, Fraction(100))} if percent
                              else {"tflops_request": amount}))
    read = c.parse_allocated(c.format_allocated(request), 2)
    assert read.gpu_count == 2 and read.takes_whole_gpu == request.takes_whole_gpu
    for capacity in (Fraction(100), Fraction(312)):
        assert read.tflops_on(capacity) >= request.tflops_on(capacity)  # rounded up, never down
        assert read.tflops_on(capacity) - request.tflops_on(capacity) < Fraction(1, 10**6)
        assert read.vram_on(80 << 30) == request.vram_on(80 << 30)


@pytest.mark.parametrize("record", ["", "tflops=1", "vram=1Gi", "tflops=1,percent=2,vram=1",
                                    "tflops=-1,vram=1", "percent=101,vram=1", "tflops=x,vram=1",
                                    "tflops=1,vram=0.5", "tflops=1,tflops=2,vram=1", "all"])
def test_a_broken_allocation_record_is_a_contract_error(record: str) -> None:
    with pytest.raises(c.ContractError) as err:
        c.parse_allocated(record, 1)
    assert err.value.key == c.ALLOCATED
