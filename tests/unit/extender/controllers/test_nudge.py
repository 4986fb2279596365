"""Nudging kube-scheduler: which nodes get their annotation updated, when, and how often."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from extender.common.labels import NUDGE_ANNOTATION
from extender.controllers.nudge import Nudges, SchedulerNudger
from extender.controllers.runner import Runner
from extender.kube.client import ApiException
from extender.scheduling.state import ClusterState, FilterOutcome, Kind
from tests.unit.fixtures.scheduling import bound, gpu, make, pod


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def nudges(**kw: Any) -> tuple[Nudges, Clock]:
    clock = Clock()
    return Nudges(clock=clock, **kw), clock


def test_room_with_no_pod_turned_away_nudges_nothing() -> None:
    n, _ = nudges()
    assert n.gained(["a", "b"]) is False
    assert n.take() == ([], None)


def test_room_after_a_rejection_nudges_each_node_once() -> None:
    n, _ = nudges()
    n.rejected()
    assert n.gained(["a", "b"]) is True
    assert n.gained(["a"]) is False  # already due: still one nudge
    assert n.take() == (["a", "b"], None)
    # no pod turned away since those nudges: more room on them asks nothing of the scheduler
    assert n.gained(["a", "b"]) is False
    assert n.take() == ([], None)


def test_a_rejection_after_the_nudge_makes_the_node_due_again_after_its_interval() -> None:
    n, clock = nudges(node_interval=5.0)
    n.rejected()
    n.gained(["a"])
    assert n.take()[0] == ["a"]
    clock.now += 1
    n.rejected()
    assert n.gained(["a"]) is True
    assert n.take() == ([], pytest.approx(4.0))  # rate limit: due in 4 s
    clock.now += 4
    assert n.take() == (["a"], None)


def test_a_round_nudges_at_most_max_per_round_and_says_the_rest_are_due_now() -> None:
    n, _ = nudges(max_per_round=2)
    n.rejected()
    n.gained(["a", "b", "c"])
    assert n.take() == (["a", "b"], 0.0)
    assert n.take() == (["c"], None)


def test_records_stay_as_few_as_the_nodes_nudged_since_the_last_rejection() -> None:
    n, clock = nudges(node_interval=1.0, max_per_round=100)
    n.rejected()
    n.gained([f"node-{i}" for i in range(50)])
    n.take()
    clock.now += 2
    n.rejected()
    n.gained(["x"])
    n.take()
    assert n.records() == {"x"}
    # a node forgotten (deleted) leaves nothing behind
    n.forget("x")
    assert n.records() == set() and len(n) == 0


@pytest.mark.parametrize(
    ("outcome", "counts"),
    [
        (FilterOutcome([], {"n1": "no room"}, {}, None, True), True),
        (FilterOutcome([], {}, {"n1": "no GPUs"}, None, False), True),
        (FilterOutcome(["n2"], {"n1": "no room"}, {}, None, True), False),  # it fits somewhere
        (FilterOutcome([], {}, {}, "bad request", False), False),  # an error: no room would help
        (FilterOutcome([], {}, {}, None, False), False),  # no candidates at all
    ],
)
def test_only_a_pod_turned_away_from_every_candidate_counts(outcome: FilterOutcome, counts: bool) -> None:
    async def patch(node: str, body: dict[str, Any]) -> None:
        raise AssertionError("not in this test")

    nudger = SchedulerNudger(patch, Nudges(clock=Clock()))
    nudger.after_filter({}, outcome)
    assert nudger.nudges.gained(["n1"]) is counts


async def test_the_task_patches_the_annotation_and_reports_each_outcome() -> None:
    sent: list[tuple[str, dict[str, Any]]] = []
    outcomes: list[tuple[str, str]] = []

    async def patch(node: str, body: dict[str, Any]) -> None:
        if node == "gone":
            raise ApiException(status=404, reason="Not Found")
        if node == "broken":
            raise ApiException(status=500, reason="Internal")
        sent.append((node, body))

    nudger = SchedulerNudger(patch, Nudges(), on_nudge=lambda node, outcome: outcomes.append((node, outcome)))
    task = asyncio.create_task(Runner().run(nudger.controller))
    try:
        nudger.after_filter({}, FilterOutcome([], {"a": "full"}, {}, None, True))
        nudger.gained(["a", "gone", "broken"])
        for _ in range(100):
            if len(outcomes) == 3:
                break
            await asyncio.sleep(0.02)
    finally:
        task.cancel()
    assert sorted(outcomes) == [("a", "sent"), ("broken", "error"), ("gone", "gone")]
    (node, body), = sent
    assert node == "a"
    stamp = body["metadata"]["annotations"][NUDGE_ANNOTATION]
    assert stamp.endswith("Z") and "T" in stamp
    assert "gone" not in nudger.nudges.records()  # a deleted node is forgotten


class Rooms:
    def __init__(self) -> None:
        self.nodes: list[str] = []

    def __call__(self, nodes: Any) -> None:
        self.nodes.extend(nodes)


def test_the_state_reports_room_from_new_gpus_finished_pods_and_released_binds() -> None:
    rooms = Rooms()
    state = make(gpu("n1-a", "n1"), bound("x", "n1", "n1-a"), on_room=rooms)
    rooms.nodes.clear()

    state.apply(Kind.GPU, "ADDED", gpu("n2-a", "n2"))
    assert rooms.nodes == ["n2"]
    state.apply(Kind.GPU, "MODIFIED", gpu("n2-a", "n2"))  # the same GPU again: no room appeared
    assert rooms.nodes == ["n2"]
    state.apply(Kind.GPU, "MODIFIED", gpu("n2-a", "n2", tflops="200"))
    assert rooms.nodes == ["n2", "n2"]

    state.apply(Kind.POD, "DELETED", bound("x", "n1", "n1-a"))
    assert rooms.nodes[-1] == "n1"

    rooms.nodes.clear()
    reservation = state.reserve(pod("y"), "n1")
    assert rooms.nodes == []  # taking room is no news
    state.release(reservation)
    assert rooms.nodes == ["n1"]


def test_a_state_without_a_listener_works_as_before() -> None:
    state = ClusterState()
    state.apply(Kind.GPU, "ADDED", gpu("n1-a", "n1"))
    assert state.filter(pod("p"), ["n1"]).fits == ["n1"]
