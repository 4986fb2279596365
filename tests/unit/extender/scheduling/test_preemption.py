"""Preemption: the fewest lower-priority GPU pods (lowest priority first) whose release fits the pod."""

from __future__ import annotations

from typing import Any

import pytest

from extender.scheduling.state import ClusterState, Kind, Victim


def gpu(name: str, node: str) -> dict[str, Any]:
    return {
        "metadata": {"name": name, "labels": {"tensor-fusion.ai/gpupool": "p"}},
        "status": {
            "nodeSelector": {"kubernetes.io/hostname": node},
            "capacity": {"tflops": "100", "vram": "40Gi"},
            "gpuModel": "A100",
            "vendor": "NVIDIA",
            "phase": "Running",
        },
    }


def pod(
    name: str, tflops: str, priority: int, node: str | None = None, gpu_ids: str | None = None, count: int = 1
) -> dict[str, Any]:
    annotations = {
        "tensor-fusion.ai/gpupool": "p",
        "tensor-fusion.ai/tflops-request": tflops,
        "tensor-fusion.ai/vram-request": "1Gi",
        "tensor-fusion.ai/gpu-count": str(count),
    }
    spec: dict[str, Any] = {"priority": priority}
    if node:
        annotations["tensor-fusion.ai/gpu-ids"] = gpu_ids or ""
        spec["nodeName"] = node
    return {
        "metadata": {
            "name": name,
            "namespace": "ml",
            "uid": f"uid-{name}",
            "resourceVersion": "1",
            "annotations": annotations,
        },
        "spec": spec,
        "status": {"phase": "Running"},
    }


def make(*pods: dict[str, Any], gpus: tuple[tuple[str, str], ...] = (("g", "n"),)) -> ClusterState:
    state = ClusterState()
    for name, node in gpus:
        state.apply(Kind.GPU, "ADDED", gpu(name, node))
    for p in pods:
        state.apply(Kind.POD, "ADDED", p)
    return state


def names(victims: list[Victim]) -> list[str]:
    return [v.name for v in victims]


@pytest.mark.parametrize(
    ("bound", "preemptor", "expected"),
    [
        # one big low-priority pod frees enough: one victim beats two small ones
        ([("small1", "20", 1), ("small2", "20", 1), ("big", "50", 5)], ("new", "60", 10), ["big"]),
        # equal shares: the lowest priorities go
        ([("a", "40", 3), ("b", "40", 1), ("c", "20", 2)], ("new", "60", 10), ["b", "c"]),
        # higher or equal priority pods are never victims
        ([("high", "90", 20), ("same", "10", 10)], ("new", "20", 10), None),
        # no need to evict when the pod already fits
        ([("a", "30", 0)], ("new", "20", 10), []),
    ],
)
def test_victims_per_node(
    bound: list[tuple[str, str, int]], preemptor: tuple[str, str, int], expected: list[str] | None
) -> None:
    state = make(*(pod(n, t, p, "n", "g") for n, t, p in bound))
    result = state.preempt(pod(*preemptor), ["n"])
    assert (names(result["n"]) if "n" in result else None) == expected


def test_greedy_release_then_prune_drops_victims_that_are_not_needed() -> None:
    # Lowest priority first releases a (10) and b (10) and c (70): a and b turn out unnecessary.
    state = make(pod("a", "10", 1, "n", "g"), pod("b", "10", 2, "n", "g"), pod("c", "70", 3, "n", "g"))
    assert names(state.preempt(pod("new", "75", 10), ["n"])["n"]) == ["c"]
    # and when two are needed, the higher-priority unnecessary one is dropped first
    assert names(state.preempt(pod("new2", "85", 10), ["n"])["n"]) == ["a", "c"]


def test_victims_carry_identity_and_priority() -> None:
    state = make(pod("a", "90", 3, "n", "g"))
    assert state.preempt(pod("new", "50", 10), ["n"]) == {"n": [Victim("uid-a", "ml", "a", 3)]}


def test_nodes_where_nothing_helps_are_omitted() -> None:
    state = make(pod("a", "90", 3, "n", "g"), gpus=(("g", "n"), ("h", "small")))
    result = state.preempt(pod("new", "200", 10), ["n", "small", "unknown"])
    assert result == {}


def test_multi_gpu_preemption_frees_every_needed_gpu() -> None:
    state = make(pod("a", "90", 1, "n", "g0"), pod("b", "90", 2, "n", "g1"), gpus=(("g0", "n"), ("g1", "n")))
    assert names(state.preempt(pod("new", "50", 10, count=2), ["n"])["n"]) == ["a", "b"]


def test_find_preemption_picks_fewest_victims_then_lowest_priority_then_name() -> None:
    state = make(
        pod("two1", "50", 1, "n1", "g1"),
        pod("two2", "50", 1, "n1", "g1"),
        pod("one-high", "90", 5, "n2", "g2"),
        pod("one-low", "90", 4, "n3", "g3"),
        gpus=(("g1", "n1"), ("g2", "n2"), ("g3", "n3")),
    )
    assert state.find_preemption(pod("new", "60", 10)) == ("n3", [Victim("uid-one-low", "ml", "one-low", 4)])
    assert state.find_preemption(pod("low", "60", 0)) is None


def test_pods_this_extender_bound_are_victims_too() -> None:
    # The usual life of a victim: reserved by this extender's bind, then seen bound through the watch.
    state = make()
    for name in ("a", "b"):
        unbound = pod(name, "45", 0)
        state.reserve(unbound, "n")
        state.apply(Kind.POD, "MODIFIED", pod(name, "45", 0, "n", "g"))
    assert names(state.find_preemption(pod("new", "50", 10))[1]) == ["a"]
