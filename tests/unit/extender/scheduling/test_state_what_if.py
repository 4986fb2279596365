"""ClusterState over its parts: a bind's reservation forgotten once the watch shows the pod, and what-if
copies that planners try placements on without touching the live state or telling anyone. What
Cluster.apply itself reports: test_cluster.py."""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterable
from typing import Any

import numpy as np
import pytest

from extender.controllers.capacity.launch_plan import pending_demand
from extender.controllers.defrag.config import parse_config
from extender.controllers.defrag.plan import Snapshot, plan_pool
from extender.planning.inputs import Inputs
from extender.planning.pool import pool_config
from extender.scheduling.assume import AssumeCache
from extender.scheduling.cluster import Kind
from extender.scheduling.ledger import Distrust
from extender.scheduling.state import ClusterState
from extender.simulate_cmd import load_cluster
from tests.unit.fixtures.defrag import NOW_TEXT, four_nodes
from tests.unit.fixtures.fakes import POOL, bound, gpu, pod


class Rooms:
    """The room callback (the scheduler nudger in ``serve``): which nodes it was told about."""

    def __init__(self) -> None:
        self.told: list[str] = []

    def __call__(self, nodes: Iterable[str]) -> None:
        self.told.extend(nodes)


def live(*objects: dict[str, Any], **kwargs: Any) -> ClusterState:
    state = ClusterState(**kwargs)
    state.apply(Kind.POOL, "ADDED", {"metadata": {"name": POOL}, "spec": {}})
    for obj in objects:
        state.apply(Kind.POD if obj["kind"] == "Pod" else Kind.GPU, "ADDED", obj)
    rooms = kwargs.get("on_room")
    if isinstance(rooms, Rooms):
        rooms.told.clear()  # GPUs arriving are room too: only what the test does counts
    return state


def picture(state: ClusterState) -> tuple[object, ...]:
    """What a user of the live state can see of it."""
    return (state.gpu_usage(), state.allocations(), state.version, state.held_gpus())


# --- the facade forgets ------------------------------------------------------------------------------


def test_a_refused_bound_record_keeps_the_reservation_of_the_bind_in_flight() -> None:
    refused: list[Distrust] = []
    state = live(gpu("g1", "n1"), on_refused=lambda _a, reason, _m: refused.append(reason))
    reservation = state.reserve(pod("a", "u1", "60"), "n1")
    # the pod claims another GPU than its bind reserved, one of another node: not believed
    state.apply(Kind.GPU, "ADDED", gpu("g9", "n9"))
    state.apply(Kind.POD, "MODIFIED", bound("a", "u1", "n1", "g9"))
    assert refused == [Distrust.NODE_MISMATCH]
    assert state.reservation("u1") == reservation  # still in flight: it still counts
    assert state.gpu_usage()["g1"][0] == 60


def test_the_facade_forgets_the_reservation_once_the_watch_shows_the_pod_bound() -> None:
    state = live(gpu("g1", "n1"))
    reservation = state.reserve(pod("a", "u1", "60"), "n1")
    state.apply(Kind.POD, "MODIFIED", bound("a", "u1", "n1", ",".join(reservation.gpu_ids)))
    assert state.reservation("u1") is None
    assert [a.uid for a in state.allocations()] == ["u1"]  # counted once, as bound
    assert state.gpu_usage()["g1"][0] == 60


def test_the_facade_forgets_a_filters_hold_when_the_pod_is_gone() -> None:
    state = live(gpu("g1", "n1"))
    asked = pod("a", "u1", "60")
    state.first_choice(asked, state.filter(asked, ["n1"]))
    assert state.gpu_usage()["g1"][0] == 60  # held for the bind
    state.apply(Kind.POD, "DELETED", asked)
    assert state.gpu_usage()["g1"][0] == 0
    assert state.filter(pod("b", "u2", "60"), ["n1"]).fits == ["n1"]


# --- what_if ----------------------------------------------------------------------------------------


def test_what_if_reservations_stay_in_the_copy() -> None:
    rooms = Rooms()
    state = live(gpu("g1", "n1"), gpu("g2", "n2"), bound("x", "ux", "n1", "g1"), on_room=rooms)
    before = picture(state)
    with state.what_if() as sim:
        reservation = sim.reserve(pod("a", "u1", "30"), "n1")
        assert sim.gpu_usage()["g1"][0] == 90
        assert sim.filter(pod("b", "u2", "30"), ["n1"]).fits == []  # the copy sees its own reservation
        sim.release(reservation)
        sim.reserve(pod("c", "u3", "60"), "n2")
    assert picture(state) == before
    assert state.reservation("u3") is None
    assert state.filter(pod("b", "u2", "30"), ["n1"]).fits == ["n1"]
    assert rooms.told == []


def test_what_if_fires_no_room_callback_where_the_live_state_would() -> None:
    rooms = Rooms()
    state = live(gpu("g1", "n1"), on_room=rooms)
    with state.what_if() as sim:
        sim.release(sim.reserve(pod("a", "u1"), "n1"))
        sim.apply(Kind.POD, "DELETED", bound("x", "ux", "n1", "g1"))
        sim.apply(Kind.GPU, "ADDED", gpu("g2", "n2"))
    assert rooms.told == []
    state.release(state.reserve(pod("a", "u1"), "n1"))  # the same on the live state tells
    assert rooms.told == ["n1"]


def test_what_if_reports_no_refusal() -> None:
    refused: list[str] = []
    state = live(gpu("g1", "n1"), on_refused=lambda a, _r, _m: refused.append(a.pod_key))
    with state.what_if() as sim:
        sim.apply(Kind.POD, "ADDED", bound("greedy", "ug", "n1", "g1", tflops="500"))
    assert refused == []
    state.apply(Kind.POD, "ADDED", bound("greedy", "ug", "n1", "g1", tflops="500"))
    assert refused == ["ml/greedy"]


def test_what_if_leaves_live_holds_and_lapses_none() -> None:
    now = [0.0]
    rooms = Rooms()
    state = live(gpu("g1", "n1"), on_room=rooms, clock=lambda: now[0], hold_seconds=10)
    asked = pod("a", "u1", "60")
    state.first_choice(asked, state.filter(asked, ["n1"]))
    now[0] = 11  # the hold is due to lapse: a filter on the copy lapses the copy's only
    with state.what_if() as sim:
        assert sim.filter(pod("b", "u2", "60"), ["n1"]).fits == ["n1"]
        sim.reserve(asked, "n1")  # takes the copy's hold over
    assert state.gpu_usage()["g1"][0] == 60  # the live hold stands until a live filter lapses it
    assert rooms.told == []
    assert state.filter(pod("b", "u2", "60"), ["n1"]).fits == ["n1"]
    assert rooms.told == ["n1"]


def test_what_if_of_a_subclass_keeps_its_overrides() -> None:
    class Reversed(ClusterState):
        def rank(self, pod: dict[str, Any], node_names: Any) -> list[str]:
            return list(reversed(super().rank(pod, node_names)))

    state = Reversed()
    state.apply(Kind.POOL, "ADDED", {"metadata": {"name": POOL}, "spec": {}})
    for name in ("n1", "n2"):
        state.apply(Kind.GPU, "ADDED", gpu(f"{name}-g", name))
    with state.what_if() as sim:
        assert isinstance(sim, Reversed)
        assert sim.rank(pod("a", "u1"), ["n1", "n2"]) == state.rank(pod("a", "u1"), ["n1", "n2"])


def _mutable(value: object) -> bool:
    return isinstance(value, dict | list | set | np.ndarray) or type(value).__name__ == "deque"


@pytest.mark.parametrize("part", ["cluster", "ledger", "columns", "assume"])
def test_a_what_if_copy_shares_no_table_with_the_live_state(part: str) -> None:
    state = live(gpu("g1", "n1"), bound("x", "ux", "n1", "g1"))
    asked = pod("a", "u1", "30")
    state.first_choice(asked, state.filter(asked, ["n1"]))
    state.reserve(pod("b", "u2", "10"), "n1")
    with state.what_if() as sim:
        pairs = {
            "cluster": (state._cluster, sim._cluster),
            "ledger": (state._cluster.ledger, sim._cluster.ledger),
            "columns": (state._cluster.columns, sim._cluster.columns),
            "assume": (state._assume, sim._assume),
        }
        original, copy = pairs[part]
        shared = [name for name, value in vars(copy).items()
                  if _mutable(value) and value is vars(original).get(name)]
        assert shared == []
    assert isinstance(state._assume, AssumeCache)


def test_a_defrag_plan_on_the_live_state_tells_no_one() -> None:
    """A dry plan places workers and takes the room back; on the live state that release used to reach the
    scheduler nudger, which patches Nodes."""
    rooms = Rooms()
    objects = four_nodes()
    state = ClusterState(on_room=rooms)
    load_cluster(state, objects)
    rooms.told.clear()
    before = picture(state)
    from extender.controllers.defrag.plan import snapshot_of
    from extender.plan_cmd import snapshot_inputs

    now = dt.datetime.fromisoformat(NOW_TEXT)
    snapshot: Snapshot = snapshot_of(snapshot_inputs(objects, now=now))
    plan = plan_pool(state, "p", parse_config(objects[0]), snapshot, now)
    assert plan.moves  # the simulation placed workers
    assert picture(state) == before
    assert rooms.told == []


def test_the_launch_planners_filter_lapses_no_live_hold() -> None:
    now = [0.0]
    rooms = Rooms()
    state = live(gpu("g1", "n1"), on_room=rooms, clock=lambda: now[0], hold_seconds=10)
    asked = pod("a", "u1", "60")
    state.first_choice(asked, state.filter(asked, ["n1"]))
    now[0] = 11
    before = picture(state)
    config = pool_config({"metadata": {"name": POOL}, "spec": {}})
    pending_demand(Inputs(now=dt.datetime.now(dt.UTC), state=state, pods=[pod("b", "u2", "60")]), config,
                   ["n1"], [])
    assert picture(state) == before
    assert rooms.told == []
