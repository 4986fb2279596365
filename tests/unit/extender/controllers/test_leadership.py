"""One leader election for the process: the Leases in a fixed order, so replicas of two versions in a rolling
update never both act, and two new replicas never split the Leases between them."""

from __future__ import annotations

import copy
from typing import Any

import pytest
from kubernetes import client

from extender.controllers import LEADER_LEASE, LEASE_DURATION_SECONDS, LEASE_RENEW_SECONDS, LEGACY_LEASES
from extender.controllers.leadership import Leadership
from extender.kube.lease import LeaseKeeper


class FakeLease:
    """One Lease of a shared API server (``holders``), held the way ``LeaseKeeper`` holds it."""

    def __init__(self, holders: dict[str, str], name: str, identity: str) -> None:
        self.holders = holders
        self.name = name
        self.namespace = "ns"
        self.identity = identity
        self.renewals = 0
        self.reads = 0

    @property
    def is_leader(self) -> bool:
        return self.holders.get(self.name) == self.identity

    async def try_acquire(self) -> bool:
        self.renewals += 1
        if self.holders.get(self.name, self.identity) != self.identity:
            return False
        self.holders[self.name] = self.identity
        return True

    async def observe(self) -> None:
        self.reads += 1

    def expires_in(self) -> float | None:
        return None

    async def release(self) -> None:
        if self.is_leader:
            del self.holders[self.name]


def replica(holders: dict[str, str], identity: str) -> Leadership:
    names = (LEADER_LEASE, *LEGACY_LEASES)
    return Leadership([FakeLease(holders, name, identity) for name in names])


async def test_a_new_replica_leads_only_once_an_old_one_holds_no_lease_of_its_controllers() -> None:
    holders = {LEGACY_LEASES[0]: "old"}  # an old replica runs the capacity controllers on their own Lease
    new = replica(holders, "new")
    assert not await new.step()
    assert not new.is_leader  # it holds the process Lease, yet the old capacity controllers still act
    assert holders[LEADER_LEASE] == "new"
    del holders[LEGACY_LEASES[0]]  # the old replica stopped (and released)
    assert await new.step()
    assert new.is_leader and set(holders.values()) == {"new"}


async def test_two_new_replicas_never_split_the_leases_between_them() -> None:
    holders: dict[str, str] = {}
    first, second = replica(holders, "a"), replica(holders, "b")
    assert await first.step()
    assert not await second.step()
    assert (first.is_leader, second.is_leader) == (True, False)
    # the second replica asked for the process Lease only: the later ones stay with the leader, and it
    # only read them (their expiry clocks run while it waits)
    assert [k.renewals for k in second.keepers] == [1, 0, 0]  # type: ignore[attr-defined]
    assert [k.reads for k in second.keepers] == [0, 1, 1]  # type: ignore[attr-defined]


async def test_losing_the_process_lease_gives_up_the_others_at_once() -> None:
    holders: dict[str, str] = {}
    leader = replica(holders, "a")
    assert await leader.step()
    holders[LEADER_LEASE] = "b"  # another replica took it over (ours expired)
    assert not await leader.step()
    assert holders == {LEADER_LEASE: "b"}


def test_the_lease_namespace_defaults_from_the_environment_and_the_flag_wins() -> None:
    import argparse

    from extender.controllers import leadership

    def parsed(env: dict[str, str], argv: list[str]) -> str:
        parser = argparse.ArgumentParser()
        leadership.add_arguments(parser, env)
        return leadership.from_args(parser.parse_args(argv))

    assert parsed({}, []) == "tensor-fusion-sys"
    assert parsed({"POD_NAMESPACE": "gpu-system"}, []) == "gpu-system"
    assert parsed({"POD_NAMESPACE": "gpu-system", "TF_EXPANSION_LEASE_NAMESPACE": "leases"}, []) == "leases"
    assert parsed({"POD_NAMESPACE": "gpu-system"}, ["--expansion-lease-namespace", "x"]) == "x"


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


class Store:
    """One Lease of the API server, as a dictionary: optimistic concurrency by resourceVersion."""

    def __init__(self, shared: dict[str, dict[str, Any]], name: str, down: list[bool]) -> None:
        self.shared, self.name, self.down = shared, name, down

    async def read(self) -> dict[str, Any] | None:
        if self.down[0]:
            raise OSError("connection refused")
        return copy.deepcopy(self.shared.get(self.name))

    async def create(self, body: dict[str, Any]) -> None:
        await self.replace(body)

    async def replace(self, body: dict[str, Any]) -> None:
        if self.down[0]:
            raise OSError("connection refused")
        current = self.shared.get(self.name)
        version = (current or {}).get("metadata", {}).get("resourceVersion")
        if body["metadata"].get("resourceVersion") != version:
            raise client.ApiException(status=409, reason="Conflict")
        stored = copy.deepcopy(body)
        stored["metadata"]["resourceVersion"] = str(int(version or 0) + 1)
        self.shared[self.name] = stored


def real_replica(shared: dict[str, dict[str, Any]], identity: str, clock: Clock,
                 down: list[bool] | None = None) -> Leadership:
    cut = down if down is not None else [False]
    return Leadership([LeaseKeeper(None, name, "ns", identity, clock=clock, store=Store(shared, name, cut))
                       for name in (LEADER_LEASE, *LEGACY_LEASES)])


async def lead_time(leadership: Leadership, clock: Clock, *, until: float = 120.0) -> float:
    """Run ``leadership``'s rounds on the fake clock (sleeping what ``pause`` says) until it leads."""
    while clock.now <= until:
        if await leadership.step():
            return clock.now
        clock.now = round(clock.now + leadership.pause(), 6)
    raise AssertionError(f"not leading after {until} s")


@pytest.mark.parametrize("leases", [1, 3, 6])
async def test_a_restarted_replica_leads_one_duration_after_it_first_read_however_many_leases(
        leases: int) -> None:
    """The 48 s restart: each Lease's expiry used to start only once the one before was taken."""
    shared: dict[str, dict[str, Any]] = {}
    clock = Clock()
    names = [f"lease-{i}" for i in range(leases)]
    dead = Leadership([LeaseKeeper(None, name, "ns", "crashed", clock=clock,
                                   store=Store(shared, name, [False])) for name in names])
    assert await dead.step()  # it held them all, then was SIGKILLed (no release)
    clock.now = 1.0
    restarted = Leadership([LeaseKeeper(None, name, "ns", "restarted", clock=clock,
                                        store=Store(shared, name, [False])) for name in names])
    started = clock.now
    led = await lead_time(restarted, clock)
    assert led - started <= LEASE_DURATION_SECONDS + LEASE_RENEW_SECONDS
    assert led - started >= LEASE_DURATION_SECONDS  # never before the dead holder's Lease expired
    assert {body["spec"]["holderIdentity"] for body in shared.values()} == {"restarted"}


async def test_a_standby_takes_over_one_duration_after_the_last_renewal_it_saw() -> None:
    shared: dict[str, dict[str, Any]] = {}
    clock = Clock()
    leader_down = [False]
    leader = real_replica(shared, "leader", clock, leader_down)
    standby = real_replica(shared, "standby", clock)
    assert await leader.step()
    last_renewal = 0.0
    for tick in range(1, 11):  # both run their rounds every 2 s, the standby 1 s after the leader
        clock.now = 2.0 * tick
        assert await leader.step()
        last_renewal = clock.now
        clock.now += 1.0
        assert not await standby.step()
    leader_down[0] = True  # the leader's node dies just after renewing
    killed = last_renewal + 0.5
    led = await lead_time(standby, clock)
    # the standby saw the last renewal 1 s after it was written, and takes over one duration after that:
    # within a duration plus one retry of the crash, and after the old leader's renew deadline
    assert led - killed <= LEASE_DURATION_SECONDS + LEASE_RENEW_SECONDS
    assert led - last_renewal >= LEASE_DURATION_SECONDS
    assert not leader.is_leader
    assert {body["spec"]["holderIdentity"] for body in shared.values()} == {"standby"}


async def test_a_round_waits_no_longer_than_the_next_expiry_and_never_spins() -> None:
    shared: dict[str, dict[str, Any]] = {}
    clock = Clock()
    old = real_replica(shared, "old", clock)
    assert await old.step()  # held all three, then crashed
    shared.pop(LEADER_LEASE)
    live = Leadership([LeaseKeeper(None, LEADER_LEASE, "ns", "live", clock=clock,
                                   store=Store(shared, LEADER_LEASE, [False]))])
    assert await live.step()  # another replica holds the first Lease and keeps renewing it
    me = real_replica(shared, "me", clock)
    assert not await me.step()
    assert me.pause() == LEASE_RENEW_SECONDS  # 15 s to go: the usual retry
    clock.now = 14.5
    assert me.pause() == pytest.approx(0.5)  # wakes when the crashed holder's Leases expire, not 1.5 s later
    for now in (13.0, 16.0):
        clock.now = now
        assert await live.step()
        assert not await me.step()
    # the crashed holder's Leases expired on my clock but the first is held: no busy loop
    assert [k.expires_in() for k in me.keepers[1:]] == [0.0, 0.0]
    assert me.pause() == LEASE_RENEW_SECONDS
