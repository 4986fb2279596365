"""Bounded memory for any input: a flood of distinct invalid pods (as pods that skip the webhook reach the
filter) must not grow the extender's memory with their size.

The figure: 2,000 distinct pods, each with a 512 KB annotation that does not parse, filtered once each, grow
the process's resident set by less than ``RSS_BOUND`` (before the parse cache kept each error with its
traceback, and the traceback kept the pod: about 1 GB for the same flood).
"""

from __future__ import annotations

import gc
from pathlib import Path
from typing import Any

import pytest

from extender.scheduling.state import ClusterState, Kind
from tests.unit.fixtures.fakes import POOL, gpu

PODS = 2000
POD_SIZE = 512 * 1024
RSS_BOUND = 48 * 1024 * 1024


def _rss() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS in /proc/self/status")


def _invalid_pod(i: int) -> dict[str, Any]:
    junk = f"{i:07d}" + "x" * (POD_SIZE - 7)  # distinct, and not a quantity
    return {"metadata": {"name": f"bad-{i}", "namespace": "ml", "uid": f"uid-{i}", "resourceVersion": str(i),
                         "annotations": {"tensor-fusion.ai/tflops-request": junk,
                                         "tensor-fusion.ai/vram-request": "1Gi",
                                         "tensor-fusion.ai/gpupool": POOL}},
            "spec": {"containers": [{"name": "main"}]}}


@pytest.mark.skipif(not Path("/proc/self/status").exists(), reason="needs Linux /proc")
def test_a_flood_of_distinct_invalid_pods_keeps_memory_bounded() -> None:
    state = ClusterState()
    state.apply(Kind.POOL, "ADDED", {"metadata": {"name": POOL}, "spec": {}})
    state.apply(Kind.GPU, "ADDED", gpu("g1", "n1"))
    state.filter(_invalid_pod(-1), ["n1"])  # warm up: first-use allocations are not growth
    gc.collect()
    before = _rss()
    longest = 0
    for i in range(PODS):
        outcome = state.filter(_invalid_pod(i), ["n1"])
        assert outcome.error and "tensor-fusion.ai/tflops-request" in outcome.error
        longest = max(longest, len(outcome.error))
        # the same pod again (the scheduler retries): answered alike, from the cache or not
        assert state.filter(_invalid_pod(i), ["n1"]).error == outcome.error
    gc.collect()
    grown = _rss() - before
    assert grown < RSS_BOUND, f"RSS grew by {grown / 2**20:.1f} MiB for {PODS} invalid pods"
    assert longest < 2048, "the error quotes the whole 512 KB value"
