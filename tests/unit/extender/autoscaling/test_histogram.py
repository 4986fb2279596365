"""The VPA's decaying histogram: its buckets, percentiles at the end of a bucket, half-life weighting, the
reference time moving, subtraction."""

from __future__ import annotations

import pytest

from extender.autoscaling.histogram import DecayingHistogram, ExponentialOptions
from extender.autoscaling.usage import TFLOPS_OPTIONS, VRAM_OPTIONS

HOUR = 3600 * 10**9
T0 = 1_790_000_000 * 10**9


def test_the_buckets_are_the_vpas() -> None:
    # VPA's own numbers: 0.1 TFLOPS first bucket, 5 % growth up to 10,000 -> 176 buckets
    assert TFLOPS_OPTIONS.num_buckets == 176
    assert VRAM_OPTIONS.num_buckets == 176
    assert TFLOPS_OPTIONS.bucket_start(0) == 0.0
    assert TFLOPS_OPTIONS.bucket_start(1) == pytest.approx(0.1)
    assert TFLOPS_OPTIONS.find_bucket(0.05) == 0
    assert TFLOPS_OPTIONS.find_bucket(1e9) == 175
    with pytest.raises(ValueError, match="ratio"):
        ExponentialOptions(10.0, 1.0, 1.0, 0.1)


def test_a_percentile_answers_the_end_of_the_bucket_that_reaches_it() -> None:
    h = DecayingHistogram(TFLOPS_OPTIONS, HOUR)
    assert h.is_empty() and h.percentile(0.5) == 0.0
    for value in (1.0, 2.0, 3.0, 4.0):
        h.add_sample(value, 1.0, T0)
    b = TFLOPS_OPTIONS.find_bucket(2.0)
    assert h.percentile(0.5) == TFLOPS_OPTIONS.bucket_start(b + 1)
    assert h.percentile(1.0) == TFLOPS_OPTIONS.bucket_start(TFLOPS_OPTIONS.find_bucket(4.0) + 1)


def test_a_sample_one_half_life_later_weighs_twice_as_much() -> None:
    h = DecayingHistogram(TFLOPS_OPTIONS, HOUR)
    h.add_sample(1.0, 1.0, T0)
    h.add_sample(100.0, 1.0, T0 + HOUR)
    # weights 1 and 2: the median is the newer, larger value
    assert h.percentile(0.4) > 50
    assert h.total == pytest.approx(3.0 * h.weights[TFLOPS_OPTIONS.find_bucket(1.0)])


def test_the_reference_moves_after_a_hundred_half_lives_without_losing_the_ratio() -> None:
    h = DecayingHistogram(TFLOPS_OPTIONS, HOUR)
    h.add_sample(1.0, 1.0, T0)
    first_reference = h.reference_ns
    h.add_sample(100.0, 1.0, T0 + 150 * HOUR)
    assert h.reference_ns > first_reference
    assert h.percentile(0.99) > 50  # the old sample weighs 2**-150 of the new one


def test_subtracting_clamps_at_zero_and_empties() -> None:
    h = DecayingHistogram(VRAM_OPTIONS, HOUR)
    h.add_sample(5e9, 1.0, T0)
    h.subtract_sample(5e9, 2.0, T0)
    assert h.is_empty() and h.total == 0.0

