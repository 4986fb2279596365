"""Seeded sample streams for the differential test against TensorFusion's own Go recommender.

``cases()`` is deterministic: the same list on every machine. Each case is one workload (QoS, original
resources, an ``autoSetResources`` block, a history period) and a list of ticks, each tick a batch of
worker samples followed by one recommendation. ``python -m tests.differential.cases`` prints them as the
JSON that ``tfrecommend`` (main.go beside this file) reads.

Two families:

- **exact**: each worker's first VRAM sample in a 24-hour window is that window's peak, so TensorFusion's
  peak-replacement arithmetic never runs; our recommender must agree with TensorFusion on every tick.
- ``vram_peak_replaced_*``: VRAM rises inside a window, the case of TensorFusion's bug (the replaced peak
  is subtracted with the wrong weight). Ours must agree with TensorFusion only in its compatibility mode.
"""

from __future__ import annotations

import json
import random
import sys
from typing import Any

BASE_UNIX_S = 1_790_000_000  # 2026-09-21, a fixed start
GI = 2**30
HOUR_NS = 3600 * 10**9


def _resources(rng: random.Random) -> dict[str, str]:
    req_t = rng.choice([2, 5, 8, 10, 20, 40, 60, 100])
    lim_t = req_t * rng.choice([1, 1, 2])
    req_v = rng.choice([2, 4, 8, 12, 16, 24, 40])
    lim_v = req_v * rng.choice([1, 1, 2])
    return {"requests.tflops": str(req_t), "limits.tflops": str(lim_t),
            "requests.vram": f"{req_v}Gi", "limits.vram": f"{lim_v}Gi"}


def _auto_set(rng: random.Random) -> dict[str, Any]:
    asr: dict[str, Any] = {"enable": True, "targetResource": rng.choice(["all", "compute", "vram"])}
    if rng.random() < 0.5:
        asr["targetComputePercentile"] = str(rng.choice([0.9, 0.95, 0.8]))
        asr["lowerBoundComputePercentile"] = str(rng.choice([0.5, 0.3, 0.6]))
        asr["upperBoundComputePercentile"] = str(rng.choice([0.99, 0.97]))
    if rng.random() < 0.5:
        asr["targetVRAMPercentile"] = str(rng.choice([0.9, 0.98]))
        asr["lowerBoundVRAMPercentile"] = str(rng.choice([0.5, 0.4]))
        asr["upperBoundVRAMPercentile"] = str(rng.choice([0.99, 0.95]))
    if rng.random() < 0.3:
        asr["marginFraction"] = str(rng.choice([0.1, 0.2, 0.05]))
    if rng.random() < 0.3:
        asr["updateThreshold"] = str(rng.choice([0.05, 0.2, 0.0]))
    if rng.random() < 0.2:
        asr["minComputeResourcesRatio"] = "0.5"
        asr["maxVRAMResourcesRatio"] = "2"
    return asr


def _stream(rng: random.Random, workers: int, ticks: int, spacing_s: int, start_s: int,
            rising_vram: bool) -> list[dict[str, Any]]:
    levels = [rng.uniform(0.3, 60.0) for _ in range(workers)]
    trend = rng.choice([0.0, 0.0, 0.02, -0.01, 0.08])
    vram = [rng.randint(600_000_000, 30 * GI) for _ in range(workers)]
    window_end: list[int | None] = [None] * workers
    out = []
    t = start_s * 10**9
    for _ in range(ticks):
        samples = []
        for _ in range(rng.randint(3, 12)):
            t += spacing_s * 10**9 + rng.randint(0, 999_999_999)
            for w in range(workers):
                levels[w] = max(0.0, levels[w] * (1 + trend) + rng.gauss(0, levels[w] * 0.1 + 0.05))
                tflops = round(levels[w], 4) if rng.random() > 0.02 else 0.0
                end = window_end[w]
                if end is None or t >= end:
                    # a new 24-hour window: its first sample is its peak unless VRAM rises
                    window_end[w] = t + 24 * HOUR_NS if end is None else \
                        end + ((t - end) // (24 * HOUR_NS) + 1) * 24 * HOUR_NS
                    vram[w] = max(200_000_000, int(vram[w] * rng.uniform(0.7, 1.4)))
                    used = vram[w]
                elif rising_vram and rng.random() < 0.3:
                    vram[w] = int(vram[w] * rng.uniform(1.0, 1.25))
                    used = vram[w]
                else:
                    used = int(vram[w] * rng.uniform(0.5, 1.0))
                samples.append({"worker": f"w{w}", "tflops": tflops, "vram": used, "unix_ns": t})
        out.append({"samples": samples})
    return out


def cases() -> list[dict[str, Any]]:
    out = []
    for seed in range(40):
        rng = random.Random(seed)
        rising = seed >= 32
        spacing = rng.choice([15, 30, 60, 600, 3600])  # the last ones span days and many half-lives
        case = {
            "name": f"{'vram_peak_replaced' if rising else 'exact'}_{seed}",
            "qos": rng.choice(["low", "medium", "high", "critical", ""]),
            "creation_age_ns": 10 * HOUR_NS,
            "history_period": rng.choice(["", "2h", "1h", "90m", "45m", "24h"]),
            "resources": _resources(rng),
            "auto_set_resources": _auto_set(rng),
            "ticks": _stream(rng, rng.randint(1, 3) if not rising else rng.randint(2, 3),
                             rng.randint(4, 10), spacing, BASE_UNIX_S + seed * 7919, rising),
        }
        out.append(case)
    young = dict(out[0], name="exact_initial_delay", creation_age_ns=0)
    out.append(young)
    return out


if __name__ == "__main__":
    json.dump(cases(), sys.stdout)
