"""Two replicas' Leaderships against the real API server: wall clocks an hour apart, a leader that loses the
API server, and a leader that exits. At every instant at most one replica leads.

The only stand-in is the partition: a leader "loses the API server" through a store wrapper whose calls
fail (the Lease and the API server stay real, the other replica keeps its real connection)."""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import time
from typing import Any

import pytest

from extender.common.tasks import cancel_and_wait
from extender.controllers import LEADER_LEASE, LEASE_DURATION_SECONDS, LEASE_RENEW_SECONDS, LEGACY_LEASES
from extender.controllers.leadership import Leadership
from extender.kube.lease import KubeLeaseStore, LeaseKeeper
from tests import harness as cpl

pytestmark = pytest.mark.e2e

DURATION, DEADLINE, RETRY = 6.0, 4.0, 0.5  # shorter than the shipped 15 s / 10 s / 2 s, same proportions


class Partitionable:
    """A real Lease store that can be cut off, as a network partition cuts a replica off."""

    def __init__(self, store: KubeLeaseStore) -> None:
        self.store = store
        self.cut = False

    def _check(self) -> None:
        if self.cut:
            raise OSError("partitioned from the API server (the test's stand-in)")

    async def read(self) -> dict[str, Any] | None:
        self._check()
        return await self.store.read()

    async def create(self, body: dict[str, Any]) -> None:
        self._check()
        await self.store.create(body)

    async def replace(self, body: dict[str, Any]) -> None:
        self._check()
        await self.store.replace(body)


def replica(api_client: Any, namespace: str, identity: str,
            skew: dt.timedelta) -> tuple[Leadership, list[Partitionable]]:
    stores = [Partitionable(KubeLeaseStore(api_client, name, namespace))
              for name in (LEADER_LEASE, *LEGACY_LEASES)]
    keepers = [LeaseKeeper(None, name, namespace, identity, duration_seconds=DURATION,
                           renew_deadline_seconds=DEADLINE, store=store,
                           wall=lambda: dt.datetime.now(dt.UTC) + skew)
               for name, store in zip((LEADER_LEASE, *LEGACY_LEASES), stores, strict=True)]
    return Leadership(keepers, renew_seconds=RETRY, renew_deadline=DEADLINE), stores


class Watch:
    """Samples who leads every 20 ms and fails the test if two ever do."""

    def __init__(self, replicas: dict[str, Leadership]) -> None:
        self.replicas = replicas
        self.samples: list[tuple[float, frozenset[str]]] = []

    async def run(self) -> None:
        while True:
            leaders = frozenset(name for name, r in self.replicas.items() if r.is_leader)
            self.samples.append((time.monotonic(), leaders))
            assert len(leaders) <= 1, f"two leaders at once: {sorted(leaders)}"
            await asyncio.sleep(0.02)

    async def until(self, what: str, check: Any, timeout: float) -> float:
        deadline = time.monotonic() + timeout * cpl.TIMEOUT_SCALE
        while time.monotonic() < deadline:
            leaders = frozenset(name for name, r in self.replicas.items() if r.is_leader)
            if check(leaders):
                return time.monotonic()
            await asyncio.sleep(0.02)
        raise AssertionError(f"timed out waiting for {what}; last samples {self.samples[-3:]}")


async def test_two_replicas_with_skewed_clocks_lead_one_at_a_time(api_client, namespace):
    # b's wall clock runs an hour ahead of a's: the old rule (now > renewTime + duration) let b take a's
    # live Lease at once
    a, a_stores = replica(api_client, namespace, "replica-a", dt.timedelta(0))
    b, _ = replica(api_client, namespace, "replica-b", dt.timedelta(hours=1))
    watch = Watch({"a": a, "b": b})
    a_task = asyncio.create_task(a.run())
    watching = asyncio.create_task(watch.run())
    b_task: asyncio.Task[None] | None = None
    try:
        await watch.until("a to lead", lambda leaders: leaders == {"a"}, 30)
        b_task = asyncio.create_task(b.run())
        await asyncio.sleep(3 * DURATION)  # b reads a's renewals, an hour "old" by its clock, many times
        assert watch.samples[-1][1] == {"a"}
        assert not any("b" in leaders for _, leaders in watch.samples)

        # a loses the API server: it stops within the deadline, b takes over only after the duration
        for store in a_stores:
            store.cut = True
        cut_at = time.monotonic()
        a_stopped = await watch.until("a to step down", lambda leaders: "a" not in leaders, 30)
        b_started = await watch.until("b to take over", lambda leaders: leaders == {"b"}, 60)
        assert a_stopped - cut_at <= DEADLINE + 0.5
        assert b_started - a_stopped >= DURATION - DEADLINE - RETRY - 0.5
        assert b_started - cut_at >= DURATION - RETRY

        # a comes back: it finds b's Lease and follows
        for store in a_stores:
            store.cut = False
        await asyncio.sleep(2 * DURATION)
        assert watch.samples[-1][1] == {"b"}

        # b exits (releases its Leases): a leads again within a few rounds, not after a duration
        await cancel_and_wait([b_task])
        released_at = time.monotonic()
        a_again = await watch.until("a to lead again", lambda leaders: leaders == {"a"}, 30)
        assert a_again - released_at < DURATION
        if watching.done():
            watching.result()  # raises what the watch found
        assert not watching.done()
    finally:
        watching.cancel()
        with contextlib.suppress(asyncio.CancelledError, AssertionError):
            await watching
        await cancel_and_wait([t for t in (a_task, b_task) if t is not None])


async def test_a_restarted_or_standby_replica_leads_within_one_duration_and_a_retry(api_client, namespace):
    """With the shipped timings and all three Leases: a replica restarted after a SIGKILL, and a standby after
    the leader's SIGKILL, each lead within 15 s + 2 s (it was 48 s: one duration per Lease, in turn)."""
    budget = LEASE_DURATION_SECONDS + LEASE_RENEW_SECONDS + 0.5 * cpl.TIMEOUT_SCALE  # the API's latency

    async def renew_until_killed(leadership: Leadership) -> None:
        while True:  # step() without run(): cancelling it releases nothing, as a SIGKILL
            await leadership.step()
            await asyncio.sleep(leadership.pause())

    async def leads(leadership: Leadership) -> float:
        while not leadership.is_leader:
            await asyncio.sleep(0.02)
        return time.monotonic()

    crashed = Leadership.of(api_client, namespace, "crashed")
    assert await crashed.step()
    restarted = Leadership.of(api_client, namespace, "restarted")
    started = time.monotonic()
    task = asyncio.create_task(restarted.run())
    standby_task: asyncio.Task[None] | None = None
    leader_task: asyncio.Task[None] | None = None
    try:
        took = await asyncio.wait_for(leads(restarted), 60) - started
        assert LEASE_DURATION_SECONDS - 0.5 <= took <= budget, f"restart: led after {took:.1f} s"

        # now a standby beside the leader, then the leader is killed
        await cancel_and_wait([task])  # released: whoever comes next leads at once
        leader = Leadership.of(api_client, namespace, "leader")
        leader_task = asyncio.create_task(renew_until_killed(leader))
        await asyncio.wait_for(leads(leader), 30)
        standby = Leadership.of(api_client, namespace, "standby")
        standby_task = asyncio.create_task(standby.run())
        await asyncio.sleep(2 * LEASE_RENEW_SECONDS + 0.3)
        assert leader.is_leader and not standby.is_leader
        await cancel_and_wait([leader_task])
        killed = time.monotonic()
        failover = await asyncio.wait_for(leads(standby), 60) - killed
        assert failover <= budget, f"failover: led after {failover:.1f} s"
        leases = 1 + len(LEGACY_LEASES)
        print(f"restart led after {took:.2f} s, failover after {failover:.2f} s (Lease "
              f"{LEASE_DURATION_SECONDS:g} s, retry {LEASE_RENEW_SECONDS:g} s, {leases} Leases)")
    finally:
        await cancel_and_wait([t for t in (task, standby_task, leader_task) if t is not None])
