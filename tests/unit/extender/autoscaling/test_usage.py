"""A workload's usage: TFLOPS samples weighted a tenth, one VRAM peak per worker per 24-hour window."""

from __future__ import annotations

import pytest

from extender.autoscaling.usage import TFLOPS_OPTIONS, VramPeakWeight, WorkerUsage, WorkloadUsage

GI = 2**30
HOUR = 3600 * 10**9
T0 = 1_790_000_000 * 10**9


def test_tflops_samples_weigh_a_tenth_and_out_of_order_ones_are_dropped() -> None:
    u = WorkloadUsage(HOUR)
    u.add(WorkerUsage("a", 5.0, GI, T0))
    u.add(WorkerUsage("a", 9.0, GI, T0 - 1))
    assert u.samples == 1
    assert u.tflops.total == pytest.approx(0.1 * u.tflops.weights[TFLOPS_OPTIONS.find_bucket(5.0)] / 0.1)


def test_a_higher_peak_in_the_window_replaces_the_old_one_and_keeps_other_workers() -> None:
    ours = WorkloadUsage(HOUR, VramPeakWeight.ADDED)
    theirs = WorkloadUsage(HOUR, VramPeakWeight.WINDOW_END)
    for u in (ours, theirs):
        u.add(WorkerUsage("a", 1.0, 20 * GI, T0))
        u.add(WorkerUsage("b", 1.0, 4 * GI, T0))
        u.add(WorkerUsage("b", 1.0, 6 * GI, T0 + HOUR))  # replaces b's 4 GiB peak
    # ours: a's 20 GiB and b's 6 GiB remain; the top percentile is a's peak
    assert ours.vram.percentile(0.99) >= 20 * GI
    assert ours.latest_vram_peak() == 20 * GI
    # TensorFusion's: subtracting b's old peak with the window end's (larger) weight drains the total, so a's
    # 20 GiB no longer counts for the 99th percentile
    assert theirs.vram.percentile(0.99) < 20 * GI


def test_a_new_window_starts_every_24_hours() -> None:
    u = WorkloadUsage(HOUR)
    u.add(WorkerUsage("a", 1.0, 8 * GI, T0))
    u.add(WorkerUsage("a", 1.0, 2 * GI, T0 + 25 * HOUR))
    assert u.samplers["a"].peak == 2 * GI
    assert u.samplers["a"].window_end_ns == T0 + 48 * HOUR
    u.forget_workers([])
    assert u.samplers == {}

