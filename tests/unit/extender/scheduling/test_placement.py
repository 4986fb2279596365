"""Placement math: load formula, fit checks and their messages, GPU order per mode, score mapping."""

from __future__ import annotations

from fractions import Fraction
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from extender.common.contract import GPURequest, Isolation
from extender.scheduling.inventory import NANO, GPUDevice
from extender.scheduling.placement import (
    Demand,
    Fit,
    Mode,
    Slot,
    _fits_now,
    _mismatch,
    choose_gpus,
    evaluate,
    fitting_slots,
    load,
    mean_load,
)

GIB = 1 << 30


def device(name: str, tflops: int = 100, vram_gib: int = 40, **fields: Any) -> GPUDevice:
    base: dict[str, Any] = {
        "node": "n1",
        "pool": "p",
        "model": "A100",
        "vendor": "NVIDIA",
        "index": 0,
        "phase": "Running",
        "used_by": "tensor-fusion",
        "isolation_mode": "soft",
    }
    base.update(fields)
    return GPUDevice(name=name, capacity_tflops=tflops * NANO, capacity_vram=vram_gib * GIB, **base)


def slot(name: str, used_tflops: int = 0, used_vram_gib: int = 0, whole: int = 0, **fields: Any) -> Slot:
    return Slot(device(name, **fields), used_tflops * NANO, used_vram_gib * GIB, whole)


def req(tflops: str | None = "10", vram_gib: int = 4, count: int = 1, **fields: Any) -> GPURequest:
    return GPURequest(
        pool=fields.pop("pool", "p"),
        tflops_request=Fraction(tflops) if tflops else None,
        vram_request=vram_gib * GIB,
        gpu_count=count,
        **fields,
    )


@pytest.mark.parametrize(
    ("used_t", "used_v", "expected"),
    [
        (0, 0, 0.0),
        (100, 40, 100.0),
        (50, 8, 29.0),  # 0.7*20 + 0.3*50
        (10, 4, 10.0),
        (100, 0, 30.0),
        (0, 40, 70.0),
    ],
)
def test_load_is_seventy_percent_vram_and_thirty_percent_tflops(
    used_t: int, used_v: int, expected: float
) -> None:
    assert load(100 * NANO, 40 * GIB, used_t * NANO, used_v * GIB) == pytest.approx(expected)


def test_node_load_is_the_mean_over_its_gpus() -> None:
    assert mean_load([slot("a", 50, 8), slot("b")]) == pytest.approx(14.5)


@pytest.mark.parametrize(
    ("request_", "capacity", "expected"),
    [
        (req("10", 4), 100, (10 * NANO, 4 * GIB)),
        (GPURequest(pool="p", percent_request=Fraction(50), vram_request=GIB), 989, (494_500_000_000, GIB)),
        (GPURequest(pool="p", percent_request=Fraction(1, 3)), 1, (3_333_334, 0)),  # rounds up
        (GPURequest(pool="p", isolation=Isolation.SHARED), 100, (100 * NANO, 40 * GIB)),
    ],
)
def test_demand_per_gpu_converts_percent_with_that_gpus_capacity(
    request_: GPURequest, capacity: int, expected: tuple[int, int]
) -> None:
    assert Demand.of(request_).need(capacity * NANO, 40 * GIB) == expected


BUSY, HALF, IDLE = slot("g-busy", 50, 8), slot("g-half", 10, 4), slot("g-idle")


@pytest.mark.parametrize(
    ("mode", "expected"),
    [
        (Mode.COMPACT_FIRST, ("g-busy", "g-half")),
        (Mode.LOW_LOAD_FIRST, ("g-idle", "g-half")),
        (Mode.NODE_COMPACT_GPU_LOW_LOAD, ("g-idle", "g-half")),
    ],
)
def test_gpu_choice_inside_the_node_follows_the_mode(mode: Mode, expected: tuple[str, ...]) -> None:
    assert choose_gpus([IDLE, HALF, BUSY], req(count=2), mode) == expected


def test_gpu_ties_break_by_name() -> None:
    assert choose_gpus([slot("b"), slot("a"), slot("c")], req(count=2), Mode.LOW_LOAD_FIRST) == ("a", "b")


def verdict_of(slots: list[Slot], request: GPURequest, pods: int = 0, max_pods: int = 256) -> tuple[Fit, str]:
    verdict = evaluate(slots, request, pods, max_pods)
    return verdict.fit, verdict.message


@pytest.mark.parametrize(
    ("slots", "request_", "expected"),
    [
        ([slot("a")], req(), (Fit.FITS, "")),
        ([], req(), (Fit.UNRESOLVABLE, "node has no GPUs known to the extender")),
        ([slot("a", pool="other")], req(), (Fit.UNRESOLVABLE, "no GPU in pool p on this node")),
        (
            [slot("a")],
            req(gpu_model="H100"),
            (Fit.UNRESOLVABLE, "no GPU of model H100 in pool p on this node"),
        ),
        ([slot("a")], req(vendor="AMD"), (Fit.UNRESOLVABLE, "no GPU of vendor AMD in pool p on this node")),
        (
            [slot("a", index=0)],
            req(gpu_indices=(2,)),
            (Fit.UNRESOLVABLE, "no GPU with index 2 in pool p on this node"),
        ),
        (
            [slot("a", phase="Pending")],
            req(),
            (Fit.UNRESOLVABLE, "no Running GPU free for tensor-fusion in pool p on this node"),
        ),
        (
            [slot("a", used_by="nvidia-device-plugin")],
            req(),
            (Fit.UNRESOLVABLE, "no Running GPU free for tensor-fusion in pool p on this node"),
        ),
        (
            [slot("a")],
            req(count=2),
            (Fit.UNRESOLVABLE, "need 2 matching GPUs in pool p on one node; this node has 1"),
        ),
        (
            [slot("a", tflops=989)],
            req("2000"),
            (Fit.UNRESOLVABLE, "request 2k TFLOPS exceeds the largest GPU here (989 TFLOPS)"),
        ),
        (
            [slot("a")],
            req("10", 80),
            (Fit.UNRESOLVABLE, "request 80Gi VRAM exceeds the largest GPU here (40Gi)"),
        ),
        (
            [slot("a", vram_gib=80), slot("b")],
            req("10", 60, count=2),
            (Fit.UNRESOLVABLE, "need 2 GPUs large enough for 10 TFLOPS and 60Gi VRAM; this node has 1"),
        ),
        (
            [slot("a", 95, 0), slot("b", 90, 0)],
            req("20", 8, count=2),
            (
                Fit.FAILED,
                "need 2 GPUs with 20 TFLOPS and 8Gi VRAM free in pool p; 0 fit, "
                "best other GPU has 10 TFLOPS and 40Gi free",
            ),
        ),
        (
            [slot("a", 50, 0), slot("b", 90, 0)],
            req("20", 8, count=2),
            (
                Fit.FAILED,
                "need 2 GPUs with 20 TFLOPS and 8Gi VRAM free in pool p; 1 fits, "
                "best other GPU has 10 TFLOPS and 40Gi free",
            ),
        ),
        (
            [slot("a", 1, 1)],
            req(None, 0, isolation=Isolation.SHARED),
            (Fit.FAILED, "need 1 idle GPU in pool p; 0 idle, best other GPU has 99 TFLOPS and 39Gi free"),
        ),
        (
            [slot("a", 100, 40, whole=1)],
            req("0", 0),
            (
                Fit.FAILED,
                "need 1 GPU with 0 TFLOPS and 0 VRAM free in pool p; 0 fit, "
                "best other GPU is held whole by a shared pod",
            ),
        ),
    ],
)
def test_filter_classes_and_messages(
    slots: list[Slot], request_: GPURequest, expected: tuple[Fit, str]
) -> None:
    assert verdict_of(slots, request_) == expected


def test_pod_cap_is_a_resolvable_failure() -> None:
    assert verdict_of([slot("a")], req(), pods=2, max_pods=2) == (
        Fit.FAILED,
        "node already runs 2 GPU pods (limit 2)",
    )


def test_percent_request_fits_on_big_gpu_but_not_small_busy_one() -> None:
    percent = GPURequest(pool="p", percent_request=Fraction(50), vram_request=GIB)
    assert verdict_of([slot("big", 400, 0, tflops=1000)], percent)[0] is Fit.FITS
    assert verdict_of([slot("small", 60, 0, tflops=100)], percent)[0] is Fit.FAILED


def test_indices_select_exactly_the_listed_gpus() -> None:
    slots = [slot("a", index=0), slot("b", index=1), slot("c", index=2)]
    verdict = evaluate(slots, req(gpu_indices=(0, 2), count=2), 0, 256)
    assert sorted(s.name for s in verdict.fitting) == ["a", "c"]


@settings(max_examples=300, deadline=None)
@given(slots=st.lists(st.builds(
    lambda i, used_t, used_v, whole, pool, model, phase, index: slot(
        f"g{i}", used_t, used_v, whole, pool=pool, model=model, phase=phase, index=index),
    st.integers(0, 7), st.integers(0, 100), st.integers(0, 40), st.integers(0, 1),
    st.sampled_from(["p", "q"]), st.sampled_from(["A100", "H100"]), st.sampled_from(["Running", "Pending"]),
    st.integers(0, 3)),
    max_size=8),
    tflops=st.sampled_from([None, "0", "10", "99.5", "100", "150"]), vram=st.integers(0, 48),
    whole=st.booleans(), model=st.sampled_from([None, "A100"]), indices=st.sampled_from([(), (1, 2)]),
    percent=st.sampled_from([None, Fraction(25), Fraction(100, 3)]))
def test_fitting_slots_agrees_with_the_per_gpu_checks(slots: list[Slot], tflops: str | None, vram: int,
                                                     whole: bool, model: str | None,
                                                     indices: tuple[int, ...],
                                                     percent: Fraction | None) -> None:
    request = req(None if percent is not None else tflops, vram, gpu_model=model, gpu_indices=indices,
                  percent_request=percent, isolation=Isolation.SHARED if whole else Isolation.SOFT)
    demand = Demand.of(request)

    def fits(s: Slot) -> bool:
        need = demand.need(s.device.capacity_tflops, s.device.capacity_vram)
        return not _mismatch(s.device, request) and _fits_now(s, *need, demand.whole)

    expected = [s for s in slots if s.device.pool == request.pool and fits(s)]
    assert fitting_slots(slots, request) == expected
    assert Demand.of(request) is demand  # remembered for this request object
