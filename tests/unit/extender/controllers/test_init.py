"""The controller registry of ``tf-extender serve``: one list of named loops, one NodeClaim watch, one
leader for every controller that acts on the whole cluster."""

from __future__ import annotations

import asyncio
import datetime as dt
from typing import Any

import pytest
from kubernetes import client

from extender.controllers import LEADER_LEASE, LEGACY_LEASES, Loop, leader_gated_loop, start, stop
from extender.controllers.capacity.config import CapacityConfig
from extender.controllers.gpunode.config import GPUNodeConfig
from extender.controllers.leadership import Leadership
from extender.controllers.tfcluster.config import TFClusterConfig
from extender.service import ExtenderService, Settings


class FakeLease:
    """One Lease of a shared API server (``holders``), held the way ``LeaseKeeper`` holds it."""

    def __init__(self, holders: dict[str, str], name: str, identity: str) -> None:
        self.holders = holders
        self.name = name
        self.namespace = "ns"
        self.identity = identity
        self.renewals = 0

    @property
    def is_leader(self) -> bool:
        return self.holders.get(self.name) == self.identity

    async def try_acquire(self) -> bool:
        self.renewals += 1
        if self.holders.get(self.name, self.identity) != self.identity:
            return False
        self.holders[self.name] = self.identity
        return True

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
    # the second replica asked for the process Lease only: the later ones stay with the leader
    assert [k.renewals for k in second.keepers] == [1, 0, 0]  # type: ignore[attr-defined]


async def test_losing_the_process_lease_gives_up_the_others_at_once() -> None:
    holders: dict[str, str] = {}
    leader = replica(holders, "a")
    assert await leader.step()
    holders[LEADER_LEASE] = "b"  # another replica took it over (ours expired)
    assert not await leader.step()
    assert holders == {LEADER_LEASE: "b"}


async def test_the_leader_gated_loop_reconciles_only_while_leading_and_survives_a_failure() -> None:
    class Flag:
        is_leader = False

    leader, calls = Flag(), []

    async def reconcile(now: dt.datetime) -> None:
        calls.append(now)
        if len(calls) == 1:
            raise RuntimeError("the API server said no")

    task = asyncio.create_task(leader_gated_loop("test", leader, reconcile, interval=0.01))
    await asyncio.sleep(0.05)
    assert calls == []
    leader.is_leader = True
    for _ in range(500):  # a loaded machine may need more than a few rounds' time
        if len(calls) >= 2:
            break
        await asyncio.sleep(0.01)
    await stop([task])
    assert len(calls) >= 2  # the failed reconcile was logged and the next round ran


async def test_controllers_start_as_named_tasks_and_a_crash_ends_only_its_own() -> None:
    async def crash() -> None:
        raise RuntimeError("bug")

    async def forever() -> None:
        await asyncio.Event().wait()

    tasks = start([Loop("crash", crash), Loop("forever", forever)])
    await asyncio.sleep(0)
    await asyncio.sleep(0)
    assert [t.get_name() for t in tasks] == ["crash", "forever"]
    assert tasks[0].done() and not tasks[1].done()
    await stop(tasks)
    assert tasks[1].cancelled()


def _service(settings: Settings) -> ExtenderService:
    configuration = client.Configuration()
    configuration.host = "http://127.0.0.1:1"
    return ExtenderService(client.ApiClient(configuration), settings)


def test_serve_runs_every_enabled_loop_once_with_one_nodeclaim_watch() -> None:
    service = _service(Settings(capacity=CapacityConfig(enabled=True), tfcluster=TFClusterConfig(),
                                gpu_nodes=GPUNodeConfig()))
    names = [c.name for c in service.controllers()]
    assert names == [
        "watch-nodes", "watch-pods", "watch-gpupools", "watch-schedulingconfigtemplates", "watch-gpus",
        "watch-poddisruptionbudgets", "watch-nodeclaims", "watch-tensorfusionclusters", "watch-gpunodes",
        "leader", "preemptor", "expander",
        "defrag", "gpu-reservations", "capacity", "tensorfusioncluster", "gpunodes", "scheduler-nudge",
        "gc-freeze"]
    # compaction reads the GPUNodes the writer keeps: one cache
    assert service.capacity is not None and service.gpunode_writer is not None
    assert service.capacity.view.gpunodes is service.controller_caches["gpunodes"]
    assert service.gpunode_writer.gpunodes is service.controller_caches["gpunodes"]
    assert service.expander is not None and service.capacity is not None
    claims = service.controller_caches["nodeclaims"]
    # the expander and the capacity controllers read the one NodeClaim cache and run neither copy
    assert service.expander.port.claims is claims  # type: ignore[attr-defined]
    assert service.capacity.view.nodeclaims is claims
    assert claims not in service.expander.port.caches  # type: ignore[attr-defined]
    assert claims not in service.capacity.view.owned_caches
    # the TensorFusionCluster controller and the Provisioned launcher (its vendor) read one cluster cache
    clusters = service.controller_caches["tensorfusionclusters"]
    assert service.tfclusters is not None and service.tfclusters.clusters is clusters
    assert service.capacity.clusters is clusters and service.capacity.provisioned.clusters is clusters


def test_without_cluster_wide_controllers_no_leader_is_elected() -> None:
    from extender.controllers.defrag.config import DefragOptions
    from extender.controllers.expansion.config import ExpansionConfig

    service = _service(Settings(expansion=ExpansionConfig(enabled=False), defrag=DefragOptions(enabled=False),
                                preemptor=False, nudge_scheduler=False))
    assert service.leadership is None
    assert "nodeclaims" not in service.controller_caches
    assert [c.name for c in service.controllers()] == [
        "watch-nodes", "watch-pods", "watch-gpupools", "watch-schedulingconfigtemplates", "watch-gpus",
        "gpu-reservations", "gc-freeze"]


@pytest.mark.parametrize("enabled", ["expansion", "capacity", "defrag"])
def test_every_cluster_wide_controller_acts_through_the_one_leadership(enabled: str) -> None:
    from extender.controllers.defrag.config import DefragOptions
    from extender.controllers.expansion.config import ExpansionConfig

    settings = Settings(expansion=ExpansionConfig(enabled=enabled == "expansion"),
                        defrag=DefragOptions(enabled=enabled == "defrag"),
                        capacity=CapacityConfig(enabled=enabled == "capacity"))
    service = _service(settings)
    assert service.leadership is not None
    leaders: dict[str, Any] = {
        "expansion": lambda: service.expander.leader,  # type: ignore[union-attr]
        "capacity": lambda: service.capacity.leader,  # type: ignore[union-attr]
        "defrag": lambda: service.defragmenter.leader,  # type: ignore[union-attr]
    }
    seen = leaders[enabled]()
    assert seen is service.leadership or seen._leadership is service.leadership
    assert [k.name for k in service.leadership.keepers] == [LEADER_LEASE, *LEGACY_LEASES]
