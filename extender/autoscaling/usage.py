"""Usage samples, per worker, and what the recommender aggregates from them.

A ``UsageSource`` is the seam the autoscaling loop reads samples from (Prometheus with dcgm-exporter, or
TensorFusion's hypervisor metrics, or the ``StaticUsageSource`` tests and ``tf-extender plan --autoscale``
use). ``WorkloadUsage`` keeps TensorFusion's two histograms for one workload: every TFLOPS sample with weight
0.1, and for VRAM one peak per worker per 24-hour window with weight 1.

One deliberate difference from TensorFusion: when a higher VRAM peak replaces a window's earlier one,
TensorFusion subtracts the old peak with the decay weight of the window's end, larger than the weight it was
added with, so the histogram's total collapses to the newest peak and other workers' peaks drop out. Here the
old peak is subtracted with the weight it was added with (``VramPeakWeight.ADDED``); ``WINDOW_END`` keeps
TensorFusion's arithmetic for the differential test.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from extender.autoscaling.histogram import DecayingHistogram, ExponentialOptions

MIN_SAMPLE_WEIGHT = 0.1
EPSILON = 0.001 * MIN_SAMPLE_WEIGHT
BUCKET_GROWTH = 0.05
VRAM_WINDOW_NS = 24 * 3600 * 10**9
TFLOPS_OPTIONS = ExponentialOptions(10000.0, 0.1, 1.0 + BUCKET_GROWTH, EPSILON)
VRAM_OPTIONS = ExponentialOptions(1e12, 1e7, 1.0 + BUCKET_GROWTH, EPSILON)


@dataclass(frozen=True)
class WorkerUsage:
    """One reading of one worker pod: TFLOPS in use and VRAM bytes in use at ``unix_ns``."""

    worker: str
    tflops: float
    vram: int
    unix_ns: int


class UsageSource(Protocol):
    """Where the autoscaling loop reads a workload's samples from, oldest first."""

    async def workload_usage(self, namespace: str, workload: str, start_ns: int,
                             end_ns: int) -> Sequence[WorkerUsage]: ...


@dataclass
class StaticUsageSource:
    """Samples held in memory, keyed by ``(namespace, workload)``: for tests and offline plans."""

    samples: dict[tuple[str, str], list[WorkerUsage]] = field(default_factory=dict)

    def add(self, namespace: str, workload: str, items: Iterable[WorkerUsage]) -> None:
        self.samples.setdefault((namespace, workload), []).extend(items)

    async def workload_usage(self, namespace: str, workload: str, start_ns: int,
                             end_ns: int) -> Sequence[WorkerUsage]:
        found = [s for s in self.samples.get((namespace, workload), []) if start_ns < s.unix_ns <= end_ns]
        return sorted(found, key=lambda s: s.unix_ns)


class VramPeakWeight(enum.Enum):
    ADDED = "added"  # subtract a replaced peak with the weight it was added with (ours)
    WINDOW_END = "window-end"  # TensorFusion's: with the weight of the window's end


@dataclass
class _WorkerSampler:
    last_tflops_ns: int | None = None
    last_vram_ns: int | None = None
    window_end_ns: int | None = None
    peak: int = 0
    peak_ns: int = 0


@dataclass
class WorkloadUsage:
    """The two decaying histograms of one workload, fed per worker; half-life = history period / 2."""

    half_life_ns: int
    peak_weight: VramPeakWeight = VramPeakWeight.ADDED
    tflops: DecayingHistogram = field(init=False)
    vram: DecayingHistogram = field(init=False)
    samplers: dict[str, _WorkerSampler] = field(init=False, default_factory=dict)
    samples: int = field(init=False, default=0)

    def __post_init__(self) -> None:
        self.tflops = DecayingHistogram(TFLOPS_OPTIONS, self.half_life_ns)
        self.vram = DecayingHistogram(VRAM_OPTIONS, self.half_life_ns)

    def is_empty(self) -> bool:
        return self.tflops.is_empty() and self.vram.is_empty()

    def add(self, sample: WorkerUsage) -> None:
        sampler = self.samplers.setdefault(sample.worker, _WorkerSampler())
        self._add_tflops(sampler, sample)
        self._add_vram(sampler, sample)

    def forget_workers(self, keep: Iterable[str]) -> None:
        """Drop the window state of workers that are gone (their samples stay in the histograms)."""
        alive = set(keep)
        for name in [n for n in self.samplers if n not in alive]:
            del self.samplers[name]

    def _add_tflops(self, sampler: _WorkerSampler, sample: WorkerUsage) -> None:
        last = sampler.last_tflops_ns
        if sample.tflops < 0 or (last is not None and sample.unix_ns < last):
            return
        self.tflops.add_sample(float(sample.tflops), MIN_SAMPLE_WEIGHT, sample.unix_ns)
        self.samples += 1
        sampler.last_tflops_ns = sample.unix_ns

    def _add_vram(self, sampler: _WorkerSampler, sample: WorkerUsage) -> None:
        ts = sample.unix_ns
        if sampler.last_vram_ns is not None and ts < sampler.last_vram_ns:
            return
        sampler.last_vram_ns = ts
        if sampler.window_end_ns is None:
            sampler.window_end_ns = ts
        new_peak = False
        if ts < sampler.window_end_ns:
            if sample.vram > sampler.peak:
                window_end = self.peak_weight is VramPeakWeight.WINDOW_END
                at = sampler.window_end_ns if window_end else sampler.peak_ns
                self.vram.subtract_sample(float(sampler.peak), 1.0, at)
                new_peak = True
        else:
            shift = (ts - sampler.window_end_ns) // VRAM_WINDOW_NS * VRAM_WINDOW_NS + VRAM_WINDOW_NS
            sampler.window_end_ns += shift
            sampler.peak = 0
            new_peak = True
        if new_peak:
            self.vram.add_sample(float(sample.vram), 1.0, ts)
            sampler.peak = sample.vram
            sampler.peak_ns = ts

    def latest_vram_peak(self) -> int:
        """The highest peak of the current windows of the workers still sampled."""
        return max((s.peak for s in self.samplers.values()), default=0)
