"""GPU topology: tiers and the best GPU set within a node, against tiers worked out by hand."""

from __future__ import annotations

import itertools
from dataclasses import dataclass

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from extender.scheduling.topology import Link, Source, Tier, choose, nvlink_groups, pair_tiers, set_tier


@dataclass(frozen=True)
class G:
    name: str
    uuid: str = ""
    numa_node: int | None = None
    links: tuple[Link, ...] = ()


def nvlink_node(groups: list[list[int]], numa: list[int] | None = None,
                pcie_tier: int | None = None) -> list[G]:
    """GPUs g0..gN; every pair inside a group is NVLinked (tier 0). ``pcie_tier`` reports the other pairs
    with that tier instead of leaving them to NUMA."""
    total = sum(len(g) for g in groups)
    group_of = {i: k for k, g in enumerate(groups) for i in g}
    out = []
    for i in range(total):
        links = [Link(f"u{j}", 0, 300_000_000_000) for j in groups[group_of[i]] if j != i]
        if pcie_tier is not None:
            links += [Link(f"u{j}", pcie_tier) for j in range(total) if group_of[j] != group_of[i]]
        out.append(G(f"g{i}", f"u{i}", numa[i] if numa else None, tuple(links)))
    return out


def numa_node(numa: list[int | None]) -> list[G]:
    return [G(f"g{i}", f"u{i}", n) for i, n in enumerate(numa)]


def names(*indices: int) -> tuple[str, ...]:
    return tuple(f"g{i}" for i in indices)


# p4d-like: 8 GPUs, one NVSwitch fabric (all pairs NVLink), GPUs 0-3 on NUMA 0 and 4-7 on NUMA 1
NVSWITCH_8 = nvlink_node([list(range(8))], numa=[0, 0, 0, 0, 1, 1, 1, 1])
# two 4-GPU NVLink islands (hybrid cube-mesh halves), PCIe between them, one island per NUMA node
ISLANDS_2x4 = nvlink_node([[0, 1, 2, 3], [4, 5, 6, 7]], numa=[0, 0, 0, 0, 1, 1, 1, 1])
# 4 PCIe GPUs in NUMA pairs (g5.12xlarge-like): no links
PCIE_PAIRS_4 = numa_node([0, 0, 1, 1])
# mixed: an NVLink pair on NUMA 0, a lone GPU on NUMA 0, two PCIe GPUs on NUMA 1
MIXED = nvlink_node([[0, 1], [2], [3], [4]], numa=[0, 0, 0, 1, 1])


@pytest.mark.parametrize(("gpus", "subset", "tier"), [
    (NVSWITCH_8, [0, 7], Tier.NVLINK),
    (NVSWITCH_8, list(range(8)), Tier.NVLINK),
    (ISLANDS_2x4, [0, 1, 2, 3], Tier.NVLINK),
    (ISLANDS_2x4, [0, 1], Tier.NVLINK),
    (ISLANDS_2x4, [3, 4], Tier.CROSS_NUMA),  # no link, different NUMA nodes
    (ISLANDS_2x4, [0, 1, 2, 4], Tier.CROSS_NUMA),  # the set is as good as its worst pair
    (PCIE_PAIRS_4, [0, 1], Tier.NUMA),
    (PCIE_PAIRS_4, [2, 3], Tier.NUMA),
    (PCIE_PAIRS_4, [1, 2], Tier.CROSS_NUMA),
    (PCIE_PAIRS_4, [0, 1, 2, 3], Tier.CROSS_NUMA),
    (MIXED, [0, 1], Tier.NVLINK),
    (MIXED, [0, 2], Tier.NUMA),  # no link, same NUMA node
    (MIXED, [3, 4], Tier.NUMA),
    (MIXED, [1, 3], Tier.CROSS_NUMA),
    (numa_node([None, None]), [0, 1], Tier.UNKNOWN),
    (numa_node([0, None]), [0, 1], Tier.CROSS_NUMA),  # TensorFusion: a known and an unknown NUMA node
])
def test_set_tier_by_hand(gpus: list[G], subset: list[int], tier: Tier) -> None:
    assert set_tier([gpus[i] for i in subset]) is tier


def test_reported_pcie_tier_beats_the_numa_guess_and_the_better_direction_wins() -> None:
    gpus = nvlink_node([[0, 1], [2, 3]], numa=[0, 0, 1, 1], pcie_tier=1)
    assert set_tier([gpus[0], gpus[2]]) is Tier.NUMA  # reported tier 1, though NUMA nodes differ
    one_way = [G("g0", "u0", 0, (Link("u1", 0),)), G("g1", "u1", 1, (Link("u0", 2),))]
    assert pair_tiers(one_way)[0][0][1] == 0


def test_nvlink_groups_largest_first() -> None:
    tiers, _ = pair_tiers(MIXED)
    assert nvlink_groups(tiers) == [[0, 1], [2], [3], [4]]


@pytest.mark.parametrize(("gpus", "count", "chosen", "tier"), [
    # 8-GPU NVSwitch: any 4 are one NVLink group; the placement order (names here) decides
    (NVSWITCH_8, 4, names(0, 1, 2, 3), Tier.NVLINK),
    (NVSWITCH_8, 8, names(*range(8)), Tier.NVLINK),
    # two islands: 4 GPUs take one whole island, never 2+2
    (ISLANDS_2x4, 4, names(0, 1, 2, 3), Tier.NVLINK),
    (ISLANDS_2x4[2:], 4, names(4, 5, 6, 7), Tier.NVLINK),  # g2,g3 left of island 0: take island 1
    # 3 free in island 0 and 4 in island 1: the tighter island that holds 2 is island 0
    (ISLANDS_2x4[1:], 2, names(1, 2), Tier.NVLINK),
    # 4-GPU PCIe in NUMA pairs: 2 GPUs stay on one NUMA node, 4 must cross
    (PCIE_PAIRS_4, 2, names(0, 1), Tier.NUMA),
    (PCIE_PAIRS_4[1:], 2, names(2, 3), Tier.NUMA),  # g1 alone on NUMA 0: the pair on NUMA 1
    (PCIE_PAIRS_4, 3, names(0, 1, 2), Tier.CROSS_NUMA),
    (PCIE_PAIRS_4, 4, names(0, 1, 2, 3), Tier.CROSS_NUMA),
    # mixed: the NVLink pair for 2; for 3, NUMA 0 (g0,g1,g2) is one NUMA node
    (MIXED, 2, names(0, 1), Tier.NVLINK),
    (MIXED, 3, names(0, 1, 2), Tier.NUMA),
    (MIXED, 4, names(0, 1, 2, 3), Tier.CROSS_NUMA),
])
def test_best_set_by_hand(gpus: list[G], count: int, chosen: tuple[str, ...], tier: Tier) -> None:
    plan = choose(gpus, count)
    assert (plan.gpus, plan.tier) == (chosen, tier)
    assert set_tier([g for g in gpus if g.name in chosen]) is tier


@pytest.mark.parametrize(("gpus", "chosen"), [
    # least damage: a 1-GPU pod takes the GPU from the smallest group, keeping the island whole
    (ISLANDS_2x4[1:], "g1"),  # island 0 has 3 free, island 1 has 4
    (MIXED, "g2"),  # GPUs without links go first (g2, g3, g4), then name order
    (numa_node([0, 0, 0, 1]), "g3"),  # the orphan on NUMA 1
    (numa_node([0, 0, None, 1, 1]), "g2"),  # unknown NUMA first
])
def test_least_damage(gpus: list[G], chosen: str) -> None:
    assert choose(gpus, 1).gpus == (chosen,)


def test_without_least_damage_the_placement_order_decides() -> None:
    gpus = numa_node([0, 0, 0, 1])
    assert choose(gpus, 1, prefer_least_damage=False).gpus == ("g0",)
    assert choose(gpus, 1, prefer_least_damage=False, score=lambda g: g.name == "g2").gpus == ("g2",)


def test_placement_score_breaks_ties_only() -> None:
    # NVSwitch: all sets of 4 are tier 0 and equally tight, so the busiest GPUs win under a compact score
    busy = {"g7": 90, "g6": 80, "g5": 70, "g4": 60}
    plan = choose(NVSWITCH_8, 4, score=lambda g: busy.get(g.name, 0))
    assert plan.gpus == names(7, 6, 5, 4)
    # islands: the score picks between whole islands (150 beats 99) and never splits the pod across them
    plan = choose(ISLANDS_2x4, 4, score=lambda g: {"g0": 99, "g4": 50, "g5": 50, "g6": 50}.get(g.name, 0))
    assert plan.tier is Tier.NVLINK and plan.gpus == names(4, 5, 6, 7)
    plan = choose(ISLANDS_2x4, 4, score=lambda g: {"g0": 99, "g1": 99, "g4": 50, "g5": 50}.get(g.name, 0))
    assert plan.gpus == names(0, 1, 2, 3)


def test_source_numa_ignores_links() -> None:
    plan = choose(ISLANDS_2x4, 2, source=Source.NUMA)
    assert plan.tier is Tier.NUMA and plan.gpus == names(0, 1)


def test_no_topology_data_keeps_the_placement_order() -> None:
    gpus = numa_node([None] * 4)
    assert choose(gpus, 2, score=lambda g: int(g.name[1])).gpus == ("g3", "g2")
    assert choose(gpus, 2).tier is Tier.UNKNOWN


def test_many_candidates_stay_within_the_combination_cap() -> None:
    # 16 GPUs in four 4-GPU islands with one GPU taken from each of the first three: 3 pruned to groups
    gpus = nvlink_node([[0, 1, 2, 3], [4, 5, 6, 7], [8, 9, 10, 11], [12, 13, 14, 15]],
                       numa=[0] * 8 + [1] * 8)
    free = [g for g in gpus if g.name not in {"g0", "g4", "g8", "g12"}]
    plan = choose(free, 5)
    assert plan.tier is Tier.NUMA
    assert len(plan.gpus) == 5


@st.composite
def small_nodes(draw: st.DrawFn) -> tuple[list[G], int]:
    n = draw(st.integers(2, 8))
    numa = draw(st.lists(st.sampled_from([None, 0, 1, 2]), min_size=n, max_size=n))
    links: list[list[Link]] = [[] for _ in range(n)]
    for a, b in draw(st.lists(st.tuples(st.integers(0, n - 1), st.integers(0, n - 1)), max_size=12)):
        if a != b:
            links[a].append(Link(f"u{b}", draw(st.integers(0, 3))))
    gpus = [G(f"g{i}", f"u{i}", numa[i], tuple(links[i])) for i in range(n)]
    return gpus, draw(st.integers(2, n))


def _numa_set_tier(subset: list[G]) -> int:
    nodes = {g.numa_node for g in subset}
    if None in nodes:
        return Tier.UNKNOWN if len(nodes) == 1 else Tier.CROSS_NUMA
    return Tier.NUMA if len(nodes) == 1 else Tier.CROSS_NUMA


@settings(max_examples=400, deadline=None)
@given(small_nodes())
def test_never_a_worse_tier_than_some_free_set_allows(node: tuple[list[G], int]) -> None:
    """Up to 8 candidates every set is looked at (C(8, 4) = 70 <= 256): the chosen tier is the best any set
    of that size has, judged the way the evaluator judges this node (peer links if any GPU has them)."""
    gpus, count = node
    plan = choose(gpus, count)
    assert len(plan.gpus) == count
    if any(g.links for g in gpus):
        tiers, _ = pair_tiers(gpus)
        best = min(max(tiers[a][b] for a, b in itertools.combinations(combo, 2))
                   for combo in itertools.combinations(range(len(gpus)), count))
    elif any(g.numa_node is not None for g in gpus):
        best = min(_numa_set_tier(list(c)) for c in itertools.combinations(gpus, count))
    else:
        best = Tier.UNKNOWN
    assert plan.tier == best
