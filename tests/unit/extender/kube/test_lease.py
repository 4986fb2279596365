"""Leases as client-go holds them: expiry timed on this replica's monotonic clock from the last change of the
record it saw, never from the holder's renewTime, and a leader that stops before its Lease can be taken."""

from __future__ import annotations

import asyncio
import contextlib
import copy
import datetime as dt
from typing import Any

import pytest
from kubernetes import client

from extender.controllers.leadership import Leadership
from extender.kube.lease import (
    LeaseAction,
    LeaseKeeper,
    Observation,
    format_time,
    lease_action,
    lease_body,
    observe,
    record_of,
    released_body,
)

WALL = dt.datetime(2026, 12, 2, 12, 0, 0, tzinfo=dt.UTC)


def lease(holder: str | None, renew_time: dt.datetime | None = WALL, duration: int = 15,
          transitions: int = 0) -> dict[str, Any]:
    spec: dict[str, Any] = {"holderIdentity": holder, "leaseDurationSeconds": duration,
                            "leaseTransitions": transitions}
    if renew_time is not None:
        spec["renewTime"] = format_time(renew_time)
    return {"metadata": {"name": "tensor-fusion-expander", "resourceVersion": "7"}, "spec": spec}


def action_after(reads: list[tuple[float, dict[str, Any]]], identity: str = "me") -> LeaseAction:
    """The action after reading each (monotonic time, lease) in turn, as one replica does."""
    seen: Observation | None = None
    action = LeaseAction.WAIT
    for at, current in reads:
        seen = observe(seen, current, at)
        action = lease_action(current, identity, seen, at, 15.0)
    return action


@pytest.mark.parametrize(("case", "reads", "expected"), [
    ("no lease yet", [(0, None)], LeaseAction.CREATE),
    ("held by me", [(0, lease("me"))], LeaseAction.RENEW),
    ("released", [(0, lease(None))], LeaseAction.TAKE),
    ("held by another, first seen now", [(0, lease("other"))], LeaseAction.WAIT),
    ("unchanged for less than its duration", [(0, lease("other")), (14.9, lease("other"))], LeaseAction.WAIT),
    ("unchanged for its duration", [(0, lease("other")), (15, lease("other"))], LeaseAction.TAKE),
    ("renewed meanwhile: the duration starts again",
     [(0, lease("other")), (10, lease("other", WALL + dt.timedelta(seconds=10))),
      (20, lease("other", WALL + dt.timedelta(seconds=10)))], LeaseAction.WAIT),
    ("its own (short) duration counts", [(0, lease("other", duration=5)), (5, lease("other", duration=5))],
     LeaseAction.TAKE),
    ("renewTime far in the past, first seen now", [(0, lease("other", WALL - dt.timedelta(days=400)))],
     LeaseAction.WAIT),
    ("renewTime far in the future, unchanged for its duration",
     [(0, lease("other", WALL + dt.timedelta(days=400))),
      (15, lease("other", WALL + dt.timedelta(days=400)))],
     LeaseAction.TAKE),
    ("never renewed, first seen now", [(0, lease("other", None))], LeaseAction.WAIT),
    ("a new holder is a change", [(0, lease("other")), (15, lease("third"))], LeaseAction.WAIT),
    ("a transition is a change", [(0, lease("other")), (15, lease("other", transitions=1))],
     LeaseAction.WAIT),
])
def test_lease_action(case: str, reads: list[tuple[float, dict[str, Any]]], expected: LeaseAction) -> None:
    assert action_after(reads) is expected, case


def test_a_bad_duration_counts_as_ours_and_bad_fields_do_not_raise() -> None:
    odd = {"spec": {"holderIdentity": "other", "leaseDurationSeconds": "soon", "leaseTransitions": [1]}}
    assert record_of(odd)[3:] == (0, 0)
    assert action_after([(0, odd), (14, odd)]) is LeaseAction.WAIT
    assert action_after([(0, odd), (15, odd)]) is LeaseAction.TAKE


def test_taking_over_counts_a_transition_and_keeps_the_version() -> None:
    body = lease_body("tensor-fusion-expander", "ns", "me", WALL, 15, lease("other"), LeaseAction.TAKE)
    assert body["spec"]["holderIdentity"] == "me" and body["spec"]["leaseTransitions"] == 1
    assert body["metadata"]["resourceVersion"] == "7"  # a concurrent writer gets a conflict
    assert action_after([(0, body)], "other") is LeaseAction.WAIT
    assert action_after([(0, released_body(body, WALL))], "other") is LeaseAction.TAKE


class Conflict(client.ApiException):
    def __init__(self) -> None:
        super().__init__(status=409, reason="Conflict")


class SharedLease:
    """One Lease of an API server: optimistic concurrency by resourceVersion, as the real one."""

    def __init__(self) -> None:
        self.body: dict[str, Any] | None = None
        self.version = 0
        self.writes: list[str] = []


class FakeStore:
    """A replica's way to that Lease; ``down`` makes every call fail, as a partition would."""

    def __init__(self, shared: SharedLease) -> None:
        self.shared = shared
        self.down = False

    def _check(self) -> None:
        if self.down:
            raise OSError("connection refused")

    async def read(self) -> dict[str, Any] | None:
        self._check()
        return copy.deepcopy(self.shared.body)

    async def create(self, body: dict[str, Any]) -> None:
        self._check()
        if self.shared.body is not None:
            raise Conflict()
        self._write(body)

    async def replace(self, body: dict[str, Any]) -> None:
        self._check()
        current = self.shared.body
        version = body["metadata"].get("resourceVersion")
        if current is None or version != current["metadata"]["resourceVersion"]:
            raise Conflict()
        self._write(body)

    def _write(self, body: dict[str, Any]) -> None:
        self.shared.version += 1
        stored = copy.deepcopy(body)
        stored["metadata"]["resourceVersion"] = str(self.shared.version)
        self.shared.body = stored
        self.shared.writes.append(str(stored["spec"].get("holderIdentity")))


class World:
    """True time; each replica sees it through a monotonic clock with its own origin and a wall clock with
    its own skew."""

    def __init__(self) -> None:
        self.now = 0.0
        self.lease = SharedLease()

    def replica(self, identity: str, *, mono_origin: float, wall_skew: dt.timedelta) -> tuple[LeaseKeeper,
                                                                                               FakeStore]:
        store = FakeStore(self.lease)
        keeper = LeaseKeeper(None, "tensor-fusion-expander", "ns", identity, store=store,
                             clock=lambda: mono_origin + self.now,
                             wall=lambda: WALL + wall_skew + dt.timedelta(seconds=self.now))
        return keeper, store


async def attempt(keeper: LeaseKeeper) -> None:
    with contextlib.suppress(OSError):  # kept while fresh, as Leadership.step does
        await keeper.try_acquire()


async def run(world: World, replicas: list[tuple[LeaseKeeper, float]], until: float,
              step: float = 0.25, on_tick: Any = None) -> list[tuple[float, set[str]]]:
    """Advance time to ``until``; each replica tries every 2 s from its own offset. Returns who led when."""
    timeline: list[tuple[float, set[str]]] = []
    next_try = {id(k): offset for k, offset in replicas}
    while world.now <= until:
        if on_tick is not None:
            on_tick(world.now)
        for keeper, _ in replicas:
            if world.now >= next_try[id(keeper)]:
                next_try[id(keeper)] += 2.0
                await attempt(keeper)
        timeline.append((world.now, {k.identity for k, _ in replicas if k.is_leader}))
        world.now = round(world.now + step, 6)
    return timeline


@pytest.mark.parametrize("skew", [dt.timedelta(seconds=30), dt.timedelta(hours=-1), dt.timedelta(days=365)])
async def test_two_replicas_with_skewed_clocks_never_both_lead(skew: dt.timedelta) -> None:
    world = World()
    a, _ = world.replica("a", mono_origin=1000.0, wall_skew=dt.timedelta(0))
    b, _ = world.replica("b", mono_origin=7.0, wall_skew=skew)  # its wall clock far from a's
    timeline = await run(world, [(a, 0.0), (b, 1.0)], until=120.0)
    assert all(len(leaders) <= 1 for _, leaders in timeline)
    assert {"a"} == timeline[-1][1]  # a took it first and kept it: b's clock never expired it
    assert set(world.lease.writes) == {"a"}


async def test_a_leader_that_cannot_renew_stops_before_another_takes_over() -> None:
    world = World()
    a, a_store = world.replica("a", mono_origin=50.0, wall_skew=dt.timedelta(seconds=-20))
    b, _ = world.replica("b", mono_origin=9000.0, wall_skew=dt.timedelta(seconds=40))

    def partition(now: float) -> None:
        a_store.down = now >= 20.0

    timeline = await run(world, [(a, 0.0), (b, 1.0)], until=80.0, on_tick=partition)
    assert all(len(leaders) <= 1 for _, leaders in timeline)
    a_stopped = next(t for t, leaders in timeline if t >= 20.0 and "a" not in leaders)
    b_started = next(t for t, leaders in timeline if "b" in leaders)
    # a's last renewal was sent at 18 s: it stops 10 s later (the renew deadline); b saw that renewal at
    # 19 s and waits the full 15 s duration from then, then up to one 2 s retry.
    assert a_stopped == pytest.approx(28.0)
    assert 34.0 <= b_started <= 37.0
    assert b_started - a_stopped >= 5.0
    assert world.lease.writes[-1] == "b" and world.lease.body is not None
    assert world.lease.body["spec"]["leaseTransitions"] == 1


async def test_a_lease_last_renewed_an_hour_ago_by_our_clock_is_still_waited_for() -> None:
    """The defect: a replica whose clock runs ahead took a live Lease at once."""
    world = World()
    world.lease.body = lease("old", WALL - dt.timedelta(hours=1))
    world.lease.body["metadata"]["resourceVersion"] = "1"
    b, _ = world.replica("b", mono_origin=0.0, wall_skew=dt.timedelta(0))
    assert not await b.try_acquire()
    world.now = 14.0
    assert not await b.try_acquire()
    world.now = 15.0
    assert await b.try_acquire() and b.is_leader


async def test_a_holder_renewing_with_a_far_future_renew_time_is_taken_once_it_stops() -> None:
    world = World()
    a, a_store = world.replica("a", mono_origin=0.0, wall_skew=dt.timedelta(days=3650))
    b, _ = world.replica("b", mono_origin=0.0, wall_skew=dt.timedelta(0))
    assert await a.try_acquire()
    for second in range(2, 30, 2):
        world.now = float(second)
        await a.try_acquire()
        assert not await b.try_acquire()
    a_store.down = True
    taken_at = None
    for second in range(30, 60):
        world.now = float(second)
        await attempt(a)
        if await b.try_acquire():
            taken_at = second
            break
    assert not a.is_leader
    assert taken_at == 43  # a's last write (28 s) was seen at 28 s; 15 s later


async def test_a_released_lease_is_taken_at_once_and_a_conflict_is_not_leadership() -> None:
    world = World()
    a, _ = world.replica("a", mono_origin=0.0, wall_skew=dt.timedelta(0))
    b, _ = world.replica("b", mono_origin=0.0, wall_skew=dt.timedelta(0))
    assert await a.try_acquire()
    await a.release()
    assert not a.is_leader
    assert await b.try_acquire()
    assert world.lease.body is not None and world.lease.body["spec"]["leaseTransitions"] == 1

    class Racing(FakeStore):
        async def replace(self, body: dict[str, Any]) -> None:
            raise Conflict()

    c = LeaseKeeper(None, "tensor-fusion-expander", "ns", "c", store=Racing(world.lease),
                    clock=lambda: world.now)
    world.now = 100.0
    await c.try_acquire()  # first sight
    world.now = 200.0
    assert not await c.try_acquire() and not c.is_leader


def test_a_renew_deadline_must_be_shorter_than_the_duration() -> None:
    store = FakeStore(SharedLease())
    with pytest.raises(ValueError, match="renew deadline"):
        LeaseKeeper(None, "l", "ns", "me", store=store, duration_seconds=15, renew_deadline_seconds=15)
    with pytest.raises(ValueError, match="API client or a store"):
        LeaseKeeper(None, "l", "ns", "me")


async def test_a_hung_renewal_ends_the_round_within_the_renew_deadline() -> None:
    class Hung(FakeStore):
        async def read(self) -> dict[str, Any] | None:
            await asyncio.sleep(3600)
            return None

    keeper = LeaseKeeper(None, "l", "ns", "me", store=Hung(SharedLease()))
    leadership = Leadership([keeper], renew_seconds=0.01, renew_deadline=0.05)
    assert not await asyncio.wait_for(leadership.step(), 5)
