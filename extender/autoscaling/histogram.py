"""The VPA's exponential, decaying histogram (``k8s.io/autoscaler/vertical-pod-autoscaler`` v1.6.0,
``pkg/recommender/util``), which TensorFusion's recommender is built on.

Written for the same floating-point results in the same order of operations: bucket ``i`` starts at
``first * (ratio**i - 1) / (ratio - 1)``; a sample of weight ``w`` at time ``t`` adds
``w * 2**((t - ref) / halfLife)``; the reference time moves (scaling every bucket by a power of two) once a
sample lies more than 100 half-lives past it, rounded to a whole half-life counted from Go's zero time
(January 1 of year 1, UTC), as ``time.Time.Round`` does. A percentile walks the buckets to the first whose
cumulative weight reaches ``p * total`` and answers the start of the next bucket (the bucket's end).

Times are integer nanoseconds since the Unix epoch, as Go's ``time.Time`` and ``time.Duration`` count them.
``Exp2``, ``Log`` and ``Pow`` are Go's own (``gomath``), not the C library's, to the last bit.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass, field

from extender.autoscaling.gomath import go_exp2, go_log, go_pow_int

# Nanoseconds from Go's zero time (0001-01-01T00:00:00Z) to the Unix epoch.
GO_ZERO_TO_UNIX_NS = 62_135_596_800 * 1_000_000_000
_INT64_MAX = 2**63 - 1
_INT64_MIN = -(2**63)
MAX_DECAY_EXPONENT = 100


@dataclass(frozen=True)
class ExponentialOptions:
    """Buckets growing by ``ratio``: ``first_bucket_size`` wide at the bottom, up to ``max_value``."""

    max_value: float
    first_bucket_size: float
    ratio: float
    epsilon: float

    def __post_init__(self) -> None:
        if self.max_value <= 0 or self.first_bucket_size <= 0 or self.ratio <= 1 or self.epsilon <= 0:
            raise ValueError("maxValue, firstBucketSize and epsilon must be > 0.0, ratio must be > 1.0")

    @functools.cached_property
    def num_buckets(self) -> int:
        ratio = self.ratio
        return math.ceil(_log(ratio, self.max_value * (ratio - 1) / self.first_bucket_size + 1)) + 1

    def find_bucket(self, value: float) -> int:
        if value < self.first_bucket_size:
            return 0
        bucket = int(_log(self.ratio, value * (self.ratio - 1) / self.first_bucket_size + 1))
        return min(bucket, self.num_buckets - 1)

    def bucket_start(self, bucket: int) -> float:
        if not 0 <= bucket < self.num_buckets:
            raise IndexError(f"index {bucket} out of range [0..{self.num_buckets - 1}]")
        if bucket == 0:
            return 0.0
        return self.first_bucket_size * (go_pow_int(self.ratio, bucket) - 1) / (self.ratio - 1)


def _log(base: float, x: float) -> float:
    return go_log(x) / go_log(base)


def _safe_subtract(value: float, sub: float, epsilon: float) -> float:
    value -= sub
    return 0.0 if value < epsilon else value


def _go_round(x: float) -> int:
    return math.floor(x + 0.5)


def _saturate(ns: int) -> int:
    """A ``time.Time.Sub`` result: a Duration saturates at the int64 bounds."""
    return max(_INT64_MIN, min(_INT64_MAX, ns))


@dataclass
class DecayingHistogram:
    options: ExponentialOptions
    half_life_ns: int
    weights: list[float] = field(init=False)
    total: float = field(init=False, default=0.0)
    min_bucket: int = field(init=False)
    max_bucket: int = field(init=False, default=0)
    # since Go's zero time, so that rounding to a half-life is Go's
    reference_ns: int = field(init=False, default=0)

    def __post_init__(self) -> None:
        if self.half_life_ns <= 0:
            raise ValueError("the half-life must be positive")
        n = self.options.num_buckets
        self.weights = [0.0] * n
        self.min_bucket = n - 1

    # -- the plain histogram ------------------------------------------------------------------------------
    def _add(self, value: float, weight: float) -> None:
        if weight < 0:
            raise ValueError("sample weight must be non-negative")
        bucket = self.options.find_bucket(value)
        self.weights[bucket] += weight
        self.total += weight
        eps = self.options.epsilon
        if bucket < self.min_bucket and self.weights[bucket] >= eps:
            self.min_bucket = bucket
        if bucket > self.max_bucket and self.weights[bucket] >= eps:
            self.max_bucket = bucket

    def _subtract(self, value: float, weight: float) -> None:
        if weight < 0:
            raise ValueError("sample weight must be non-negative")
        bucket = self.options.find_bucket(value)
        eps = self.options.epsilon
        self.total = _safe_subtract(self.total, weight, eps)
        self.weights[bucket] = _safe_subtract(self.weights[bucket], weight, eps)
        self._update_min_max()

    def _update_min_max(self) -> None:
        eps = self.options.epsilon
        last = self.options.num_buckets - 1
        while self.weights[self.min_bucket] < eps and self.min_bucket < last:
            self.min_bucket += 1
        while self.weights[self.max_bucket] < eps and self.max_bucket > 0:
            self.max_bucket -= 1

    def _scale(self, factor: float) -> None:
        if factor < 0:
            raise ValueError("scale factor must be non-negative")
        for bucket in range(self.min_bucket, self.max_bucket + 1):
            self.weights[bucket] *= factor
        self.total *= factor
        self._update_min_max()

    def is_empty(self) -> bool:
        return self.weights[self.min_bucket] < self.options.epsilon

    def percentile(self, p: float) -> float:
        if self.is_empty():
            return 0.0
        partial = 0.0
        threshold = p * self.total
        bucket = self.min_bucket
        while bucket < self.max_bucket:
            partial += self.weights[bucket]
            if partial >= threshold:
                break
            bucket += 1
        if bucket < self.options.num_buckets - 1:
            return self.options.bucket_start(bucket + 1)
        return self.options.bucket_start(bucket)

    # -- decay ----------------------------------------------------------------------------------------------
    def add_sample(self, value: float, weight: float, unix_ns: int) -> None:
        self._add(value, weight * self._decay_factor(unix_ns + GO_ZERO_TO_UNIX_NS))

    def subtract_sample(self, value: float, weight: float, unix_ns: int) -> None:
        self._subtract(value, weight * self._decay_factor(unix_ns + GO_ZERO_TO_UNIX_NS))

    def _decay_factor(self, go_ns: int) -> float:
        max_allowed = self.reference_ns + _saturate(self.half_life_ns * MAX_DECAY_EXPONENT)
        if go_ns > max_allowed:
            self._shift_reference(go_ns)
        return go_exp2(float(_saturate(go_ns - self.reference_ns)) / float(self.half_life_ns))

    def _shift_reference(self, go_ns: int) -> None:
        new_reference = _round_to(go_ns, self.half_life_ns)
        exponent = _go_round(float(_saturate(self.reference_ns - new_reference)) / float(self.half_life_ns))
        self._scale(math.ldexp(1.0, exponent))
        self.reference_ns = new_reference


def _round_to(go_ns: int, step: int) -> int:
    """``time.Time.Round(step)`` for a time after Go's zero time: halfway rounds up."""
    remainder = go_ns % step
    return go_ns - remainder + step if remainder + remainder >= step else go_ns - remainder
