"""One leader election for the process: the Leases in a fixed order, so replicas of two versions in a rolling
update never both act, and two new replicas never split the Leases between them."""

from __future__ import annotations

from extender.controllers import LEADER_LEASE, LEGACY_LEASES
from extender.controllers.leadership import Leadership


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
