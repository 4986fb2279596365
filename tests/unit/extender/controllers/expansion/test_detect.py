"""Which rejections start node expansion, and that a pod is flagged once, not on every retry."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pytest

from extender.controllers.expansion.detect import CapacityFailureLog, expands_pool, is_capacity_only
from extender.scheduling.state import FilterOutcome


def outcome(fits: list[str] | None = None, failed: dict[str, str] | None = None,
            unresolvable: dict[str, str] | None = None, error: str | None = None) -> FilterOutcome:
    fits, failed = fits or [], failed or {}
    return FilterOutcome(fits, failed, unresolvable or {}, error, not fits and bool(failed) and not error)


@pytest.mark.parametrize(("case", "result", "candidates", "expected"), [
    ("busy GPUs on every candidate", outcome(failed={"a": "busy", "b": "busy"}), ["a", "b"], True),
    ("busy on one, wrong model on the other", outcome(failed={"a": "busy"}, unresolvable={"b": "model"}),
     ["a", "b"], True),
    ("a node fits", outcome(fits=["a"], failed={"b": "busy"}), ["a", "b"], False),
    ("only model / vendor / pool mismatches", outcome(unresolvable={"a": "no GPU of model H100"}),
     ["a"], False),
    ("bad request", outcome(error="tensor-fusion.ai/gpu-count: bad"), ["a"], False),
    ("no candidates (CPU, memory, taints or affinity excluded every node)", outcome(), [], False),
])
def test_capacity_only(case: str, result: FilterOutcome, candidates: list[str], expected: bool) -> None:
    assert is_capacity_only(result, candidates) is expected, case


@dataclass(frozen=True)
class _Outcome:
    capacity_only: bool
    error: str | None = None


def test_any_outcome_with_the_two_fields_will_do() -> None:
    assert is_capacity_only(_Outcome(True), ["a"])
    assert not is_capacity_only(_Outcome(True, "bad"), ["a"])


def pool(mode: str | None) -> dict[str, Any]:
    spec: dict[str, Any] = {}
    if mode is not None:
        spec["nodeManagerConfig"] = {"provisioningMode": mode}
    return {"metadata": {"name": "p"}, "spec": spec}


@pytest.mark.parametrize(("gpupool", "expected"), [
    (pool("AutoSelect"), True),
    (pool(None), True),
    ({"metadata": {"name": "p"}, "spec": {"nodeManagerConfig": {}}}, True),
    (None, True),  # unknown pool: the default mode
    (pool("Karpenter"), False),
    (pool("Provisioned"), False),
])
def test_only_autoselect_pools_expand(gpupool: dict[str, Any] | None, expected: bool) -> None:
    assert expands_pool(gpupool) is expected


def test_a_pod_is_flagged_once_until_forgotten() -> None:
    log = CapacityFailureLog()
    assert [log.first_time("u1") for _ in range(3)] == [True, False, False]
    assert log.first_time("u2")
    log.forget("u1")
    assert log.first_time("u1")
    assert not log.first_time("")  # a pod without uid is never flagged


def test_the_log_is_bounded_and_drops_the_oldest() -> None:
    log = CapacityFailureLog(limit=3)
    for uid in ("a", "b", "c", "d"):
        log.first_time(uid)
    assert len(log) == 3 and "a" not in log and "d" in log
