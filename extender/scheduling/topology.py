"""GPU topology within a node (DESIGN §6e): tiers of a GPU set and the best set within a node.

Pure and faithful to TensorFusion's ``GPUNetworkTopologyAware`` plugin (``internal/scheduler/gputopo``): a
set's tier is its worst pair (0 one NVLink group, 1 one NUMA node, 2 across NUMA nodes, 3 unknown); the
best set is chosen by tier, then pair affinity, then how little of the touched groups it leaves over, then
link bandwidth, then the placement mode's GPU score, then names. At most 256 combinations are scored; past
that the candidates are pruned to the largest groups, and past that a greedy fill from the largest group
decides. A one-GPU pod takes the GPU whose loss damages the fewest good groups ("least damage").

The differences from TensorFusion are deliberate and listed in docs/topology.md.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from enum import IntEnum, StrEnum
from typing import Protocol


class Tier(IntEnum):
    NVLINK = 0  # one high-speed interconnect group (NVLink / NVSwitch)
    NUMA = 1  # one NUMA node
    CROSS_NUMA = 2
    UNKNOWN = 3

    @property
    def text(self) -> str:
        return f"tier {int(self)} ({TIER_WORDS[self]})"


TIER_WORDS = {
    Tier.NVLINK: "one NVLink group",
    Tier.NUMA: "one NUMA node",
    Tier.CROSS_NUMA: "across NUMA nodes",
    Tier.UNKNOWN: "topology unknown",
}


class Source(StrEnum):
    AUTO = "auto"  # peer links where any GPU has them, else NUMA
    NUMA = "numa"
    VENDOR = "vendor"


class TopologyMode(StrEnum):
    SOFT = "soft"  # order GPUs within a node, never reject one
    HARD = "hard"  # also reject nodes whose best set is worse than the allowed tier


class UnknownPolicy(StrEnum):
    TREAT_AS_WORST = "treat-as-worst"
    REJECT = "reject"


MAX_COMBINATIONS = 256
DEFAULT_MAX_TIER = 1
_PAIR_AFFINITY_NUMA = {Tier.NUMA: 10, Tier.CROSS_NUMA: 2, Tier.UNKNOWN: 0}
_PAIR_AFFINITY_PEER = {Tier.NVLINK: 10, Tier.NUMA: 6, Tier.CROSS_NUMA: 2, Tier.UNKNOWN: 0}


@dataclass(frozen=True, slots=True)
class Link:
    """One GPU's link to a peer GPU on the same node, as the GPU object reports it."""

    peer_uuid: str
    tier: int
    bandwidth: int = 0  # bytes per second; 0 when not reported


class TopologyGPU(Protocol):
    """What topology needs of a GPU (``GPUDevice`` has it)."""

    @property
    def name(self) -> str: ...
    @property
    def uuid(self) -> str: ...
    @property
    def numa_node(self) -> int | None: ...
    @property
    def links(self) -> tuple[Link, ...]: ...


@dataclass(frozen=True)
class Settings:
    """The plugin's settings (pool template) after a pod's overrides."""

    mode: TopologyMode = TopologyMode.SOFT
    source: Source = Source.AUTO
    max_tier: int = DEFAULT_MAX_TIER
    unknown_policy: UnknownPolicy = UnknownPolicy.TREAT_AS_WORST
    prefer_least_damage: bool = True


    def for_pod(self, required: bool | None, max_tier: int | None, source: str | None) -> Settings:
        """These settings after a pod's overrides (``require-gpu-topology``, ``gpu-topology-max-tier``,
        ``gpu-topology-source``); None keeps the setting."""
        if required is None and max_tier is None and source is None:
            return self
        mode = self.mode if required is None else TopologyMode.HARD if required else TopologyMode.SOFT
        return Settings(mode, Source(source) if source else self.source,
                        self.max_tier if max_tier is None else max_tier, self.unknown_policy,
                        self.prefer_least_damage)


DEFAULT_SETTINGS = Settings()


class SettingsError(ValueError):
    pass


def parse_settings(raw: object) -> Settings:
    """A template's ``spec.placement.gpuTopology`` (the plugin's args: ``mode``, ``topologySource``,
    ``maxAllowedTier``, ``unknownTopologyPolicy``, ``preferLeastDamage``); absent fields take TensorFusion's
    defaults. Raises ``SettingsError`` naming the field and value."""
    if raw is None:
        return DEFAULT_SETTINGS
    if not isinstance(raw, dict):
        raise SettingsError(f"gpuTopology must be a map, got {raw!r}")

    def choice(field: str, kind: type[StrEnum], default: StrEnum) -> StrEnum:
        value = raw.get(field)
        if value in (None, ""):
            return default
        try:
            return kind(str(value))
        except ValueError:
            allowed = ", ".join(m.value for m in kind)
            raise SettingsError(f"gpuTopology.{field}={value!r}: allowed: {allowed}") from None

    tier = raw.get("maxAllowedTier")
    if tier is None or tier == 0:
        tier = DEFAULT_MAX_TIER  # TensorFusion reads 0 as unset; a pod can still ask for tier 0
    if isinstance(tier, bool) or not isinstance(tier, int) or not 0 <= tier <= Tier.UNKNOWN:
        raise SettingsError(f"gpuTopology.maxAllowedTier={tier!r}: must be a tier 0..3")
    least = raw.get("preferLeastDamage", True)
    if not isinstance(least, bool):
        raise SettingsError(f"gpuTopology.preferLeastDamage={least!r}: must be true or false")
    return Settings(TopologyMode(choice("mode", TopologyMode, TopologyMode.SOFT)),
                    Source(choice("topologySource", Source, Source.AUTO)), tier,
                    UnknownPolicy(choice("unknownTopologyPolicy", UnknownPolicy,
                                         UnknownPolicy.TREAT_AS_WORST)),
                    least)


def hard_verdict(plan: Plan, settings: Settings) -> str | None:
    """Why hard mode rejects a node whose best set is ``plan`` (None: it does not)."""
    if settings.mode is not TopologyMode.HARD:
        return None
    allowed = f"the pod allows tier {settings.max_tier} at most"
    if plan.tier is Tier.UNKNOWN and settings.unknown_policy is UnknownPolicy.REJECT:
        return f"GPU topology unknown here and unknownTopologyPolicy=reject ({allowed})"
    if plan.tier > settings.max_tier:
        return f"GPU topology: the best GPU set here is {plan.tier.text}; {allowed}"
    return None


@dataclass(frozen=True)
class Plan:
    gpus: tuple[str, ...]
    tier: Tier
    reason: str = ""


Scorer = Callable[[TopologyGPU], float]


def _numa(gpu: TopologyGPU) -> int:
    numa = gpu.numa_node
    return numa if numa is not None and numa >= 0 else -1


def _clamp(tier: int) -> int:
    return tier if 0 <= tier <= Tier.UNKNOWN else int(Tier.UNKNOWN)


def _by_placement(gpus: Sequence[TopologyGPU], score: Scorer | None) -> list[TopologyGPU]:
    if score is None:
        return sorted(gpus, key=lambda g: g.name)
    return sorted(gpus, key=lambda g: (-score(g), g.name))


def _score_sum(gpus: Sequence[TopologyGPU], score: Scorer | None) -> float:
    return sum(score(g) for g in gpus) if score is not None else 0


def _best_score_sum(gpus: Sequence[TopologyGPU], count: int, score: Scorer | None) -> float:
    return _score_sum(_by_placement(gpus, score)[:count], score)


def choose(gpus: Sequence[TopologyGPU], count: int, source: Source = Source.AUTO,
           prefer_least_damage: bool = True, score: Scorer | None = None) -> Plan:
    """The best ``count`` GPUs of ``gpus`` (one node's free candidates) and their tier. ``score`` is the
    placement mode's preference for a GPU (higher first); topology decides first, it only breaks ties."""
    if source is Source.NUMA:
        return _numa_choose(gpus, count, prefer_least_damage, score)
    if source is Source.VENDOR or any(g.links for g in gpus):
        if not gpus:
            return Plan((), Tier.UNKNOWN, "no candidate GPUs")
        return _peer_choose(gpus, count, prefer_least_damage, score)
    if not gpus:
        return Plan((), Tier.UNKNOWN, "no candidate GPUs")
    if any(_numa(g) >= 0 for g in gpus):
        return _numa_choose(gpus, count, prefer_least_damage, score)
    ordered = _by_placement(gpus, score)
    return Plan(tuple(g.name for g in ordered[:count] if count > 0), Tier.UNKNOWN, "no topology data")


# ---- one NUMA node per GPU, no links ----

def _numa_groups(gpus: Sequence[TopologyGPU]) -> dict[int, list[TopologyGPU]]:
    groups: dict[int, list[TopologyGPU]] = {}
    for gpu in gpus:
        groups.setdefault(_numa(gpu), []).append(gpu)
    return groups


def _numa_choose(gpus: Sequence[TopologyGPU], count: int, least_damage: bool, score: Scorer | None) -> Plan:
    if count <= 0:
        return Plan((), Tier.UNKNOWN, "zero GPU request")
    if count == 1:
        if not least_damage or len(gpus) <= 1:
            gpu = _by_placement(gpus, score)[0]
            return Plan((gpu.name,), Tier.NUMA if _numa(gpu) >= 0 else Tier.UNKNOWN, "one GPU")
        groups = _numa_groups(gpus)
        gpu = min(gpus, key=lambda g: (_numa(g) >= 0, len(groups[_numa(g)]),
                                       -score(g) if score else 0, g.name))
        return Plan((gpu.name,), Tier.NUMA if _numa(gpu) >= 0 else Tier.UNKNOWN,
                    f"least damage: NUMA node {_numa(gpu)} has {len(groups[_numa(gpu)])} free")
    if len(gpus) < count:
        return Plan((), Tier.UNKNOWN, f"need {count} GPUs, {len(gpus)} free")
    groups = _numa_groups(gpus)
    whole = [(numa, members) for numa, members in sorted(groups.items())
             if numa >= 0 and len(members) >= count]
    if whole:
        # the tightest NUMA node that holds the pod, then the placement mode's best GPUs in it
        numa, members = min(whole, key=lambda e: (len(e[1]), -_best_score_sum(e[1], count, score), e[0]))
        chosen = _by_placement(members, score)[:count]
        return Plan(tuple(g.name for g in chosen), Tier.NUMA, f"all on NUMA node {numa}")
    if math.comb(len(gpus), count) <= MAX_COMBINATIONS:
        return _best_numa_combination(gpus, count, groups, score)
    pruned = _largest_numa_domains(groups, count, len(gpus))
    if pruned is not None and math.comb(len(pruned), count) <= MAX_COMBINATIONS:
        return _best_numa_combination(pruned, count, _numa_groups(pruned), score)
    return _numa_greedy(count, groups, score)


def _largest_numa_domains(groups: dict[int, list[TopologyGPU]], count: int,
                          total: int) -> list[TopologyGPU] | None:
    ordered = sorted(groups.items(), key=lambda e: (e[0] < 0, -len(e[1]), e[0]))
    kept: list[TopologyGPU] = []
    for _, members in ordered:
        kept.extend(members)
        if len(kept) >= count:
            break
    return kept if len(kept) < total else None


@dataclass(frozen=True, order=True)
class _Rank:
    """A combination's rank; smaller is better (the order of TensorFusion's comparison)."""

    tier: int
    neg_affinity: int
    leftover: int
    neg_bandwidth: int
    neg_placement: float
    names: tuple[str, ...]


def _affinity(total: int, pairs: int) -> int:
    most = pairs * 10
    return (total * 100 + most // 2) // most if most else 0


def _best_numa_combination(gpus: Sequence[TopologyGPU], count: int, groups: dict[int, list[TopologyGPU]],
                           score: Scorer | None) -> Plan:
    best: _Rank | None = None
    for combo in itertools.combinations(gpus, count):
        per_numa: dict[int, int] = {}
        for gpu in combo:
            per_numa[_numa(gpu)] = per_numa.get(_numa(gpu), 0) + 1
        if -1 in per_numa:
            tier = Tier.UNKNOWN if len(per_numa) == 1 else Tier.CROSS_NUMA
        else:
            tier = Tier.NUMA if len(per_numa) == 1 else Tier.CROSS_NUMA
        total = 0
        for a, b in itertools.combinations(combo, 2):
            na, nb = _numa(a), _numa(b)
            pair = Tier.UNKNOWN if na < 0 or nb < 0 else Tier.NUMA if na == nb else Tier.CROSS_NUMA
            total += _PAIR_AFFINITY_NUMA[pair]
        leftover = sum(len(groups[n]) - used for n, used in per_numa.items() if n >= 0)
        rank = _Rank(int(tier), -_affinity(total, count * (count - 1) // 2), leftover, 0,
                     -_score_sum(combo, score), tuple(sorted(g.name for g in combo)))
        if best is None or rank < best:
            best = rank
    assert best is not None
    return Plan(best.names, Tier(best.tier), f"best of {math.comb(len(gpus), count)} combinations")


def _numa_greedy(count: int, groups: dict[int, list[TopologyGPU]], score: Scorer | None) -> Plan:
    ordered = sorted(groups.items(), key=lambda e: (-len(e[1]), -_score_sum(e[1], score), e[0]))
    chosen: list[str] = []
    used = 0
    unknown = False
    for numa, members in ordered:
        if len(chosen) >= count:
            break
        chosen.extend(g.name for g in _by_placement(members, score)[: count - len(chosen)])
        unknown = unknown or numa < 0
        used += 1
    tier = Tier.CROSS_NUMA
    if used == 1:
        tier = Tier.UNKNOWN if unknown else Tier.NUMA
    return Plan(tuple(chosen), tier, "greedy fill from the largest NUMA nodes")


# ---- peer links (NVLink groups), NUMA where a pair has no link ----

def pair_tiers(gpus: Sequence[TopologyGPU]) -> tuple[list[list[int]], list[list[int]]]:
    """The tier and bandwidth of every pair: the better of the two directions' reports, then NUMA."""
    n = len(gpus)
    index = {g.uuid: i for i, g in enumerate(gpus) if g.uuid}
    tiers = [[int(Tier.UNKNOWN)] * n for _ in range(n)]
    bandwidth = [[0] * n for _ in range(n)]
    for i, gpu in enumerate(gpus):
        for link in gpu.links:
            if link.peer_uuid == gpu.uuid:
                continue
            j = index.get(link.peer_uuid)
            if j is None or j == i:
                continue
            tiers[i][j] = _clamp(link.tier)
            bandwidth[i][j] = link.bandwidth
    unknown = int(Tier.UNKNOWN)
    for i in range(n):
        for j in range(i + 1, n):
            a, b = tiers[i][j], tiers[j][i]
            better = b if a == unknown else (b if b != unknown and b < a else a)
            if better == unknown:
                ni, nj = _numa(gpus[i]), _numa(gpus[j])
                if ni >= 0 and nj >= 0:
                    better = int(Tier.NUMA if ni == nj else Tier.CROSS_NUMA)
            tiers[i][j] = tiers[j][i] = better
            bandwidth[i][j] = bandwidth[j][i] = max(bandwidth[i][j], bandwidth[j][i])
    return tiers, bandwidth


def nvlink_groups(tiers: Sequence[Sequence[int]]) -> list[list[int]]:
    """Indices joined by tier-0 pairs, largest group first (ties: lowest first index)."""
    n = len(tiers)
    parent = list(range(n))

    def root(x: int) -> int:
        while parent[x] != x:
            parent[x] = parent[parent[x]]
            x = parent[x]
        return x

    for i in range(n):
        for j in range(i + 1, n):
            if tiers[i][j] == Tier.NVLINK:
                ri, rj = root(i), root(j)
                if ri != rj:
                    parent[ri] = rj
    groups: dict[int, list[int]] = {}
    for i in range(n):
        groups.setdefault(root(i), []).append(i)
    return sorted(groups.values(), key=lambda g: (-len(g), g[0]))


def _single_tier(gpu: TopologyGPU) -> Tier:
    if gpu.links:
        return Tier.NVLINK
    return Tier.NUMA if _numa(gpu) >= 0 else Tier.UNKNOWN


def _peer_choose(gpus: Sequence[TopologyGPU], count: int, least_damage: bool, score: Scorer | None) -> Plan:
    if count <= 0:
        return Plan((), Tier.UNKNOWN, "zero GPU request")
    if count == 1:
        if not least_damage or len(gpus) <= 1:
            gpu = _by_placement(gpus, score)[0]
            return Plan((gpu.name,), _single_tier(gpu), "one GPU")
        tiers, _ = pair_tiers(gpus)
        size = {i: len(group) for group in nvlink_groups(tiers) for i in group}
        i = min(range(len(gpus)), key=lambda k: (bool(gpus[k].links), size[k],
                                                 -score(gpus[k]) if score else 0, gpus[k].name))
        return Plan((gpus[i].name,), _single_tier(gpus[i]), f"least damage: NVLink group of {size[i]} free")
    if len(gpus) < count:
        return Plan((), Tier.UNKNOWN, f"need {count} GPUs, {len(gpus)} free")
    tiers, bandwidth = pair_tiers(gpus)
    groups = nvlink_groups(tiers)
    whole = [g for g in groups if len(g) >= count
             and all(tiers[a][b] == Tier.NVLINK for a, b in itertools.combinations(g, 2))]
    if whole:
        # stable: among equally tight groups with equal scores the earlier group wins
        group = min(whole, key=lambda g: (len(g), -_best_score_sum([gpus[i] for i in g], count, score)))
        chosen = _by_placement([gpus[i] for i in group], score)[:count]
        return Plan(tuple(g.name for g in chosen), Tier.NVLINK, f"one NVLink group of {len(group)} free")
    if math.comb(len(gpus), count) <= MAX_COMBINATIONS:
        return _best_peer_combination(gpus, count, tiers, bandwidth, score)
    kept: list[TopologyGPU] = []
    for group in groups:
        kept.extend(gpus[i] for i in group)
        if len(kept) >= count:
            break
    if len(kept) < len(gpus) and math.comb(len(kept), count) <= MAX_COMBINATIONS:
        kept_tiers, kept_bandwidth = pair_tiers(kept)
        return _best_peer_combination(kept, count, kept_tiers, kept_bandwidth, score)
    return _peer_greedy(gpus, count, tiers, groups, score)


def _best_peer_combination(gpus: Sequence[TopologyGPU], count: int, tiers: list[list[int]],
                           bandwidth: list[list[int]], score: Scorer | None) -> Plan:
    groups = nvlink_groups(tiers)
    group_of = {i: k for k, group in enumerate(groups) for i in group}
    best: _Rank | None = None
    for combo in itertools.combinations(range(len(gpus)), count):
        worst, total, links = 0, 0, 0
        for a, b in itertools.combinations(combo, 2):
            tier = _clamp(tiers[a][b])
            worst = max(worst, tier)
            total += _PAIR_AFFINITY_PEER[Tier(tier)]
            links += bandwidth[a][b]
        taken: dict[int, int] = {}
        for i in combo:
            taken[group_of[i]] = taken.get(group_of[i], 0) + 1
        leftover = sum(len(groups[k]) - used for k, used in taken.items())
        rank = _Rank(worst, -_affinity(total, count * (count - 1) // 2), leftover, -links,
                     -_score_sum([gpus[i] for i in combo], score), tuple(sorted(gpus[i].name for i in combo)))
        if best is None or rank < best:
            best = rank
    assert best is not None
    return Plan(best.names, Tier(best.tier), f"best of {math.comb(len(gpus), count)} combinations")


def _peer_greedy(gpus: Sequence[TopologyGPU], count: int, tiers: list[list[int]], groups: list[list[int]],
                 score: Scorer | None) -> Plan:
    chosen: list[int] = []
    used = 0
    unknown = False
    for group in groups:
        if len(chosen) >= count:
            break
        members = sorted(group, key=lambda i: (-score(gpus[i]) if score else 0, gpus[i].name))
        chosen.extend(members[: count - len(chosen)])
        if len(group) == 1 and not gpus[group[0]].links:
            unknown = True
        used += 1
    worst = max((_clamp(tiers[a][b]) for a, b in itertools.combinations(chosen, 2)), default=0)
    tier = Tier.UNKNOWN if unknown and used == 1 else Tier(worst)
    return Plan(tuple(gpus[i].name for i in chosen), tier, "greedy fill from the largest NVLink groups")


def set_tier(gpus: Sequence[TopologyGPU], source: Source = Source.AUTO) -> Tier:
    """The tier of a given GPU set (a running pod's GPUs), judged as ``choose`` judges one."""
    if not gpus:
        return Tier.UNKNOWN
    if len(gpus) == 1:
        gpu = gpus[0]
        if source is not Source.NUMA and gpu.links:
            return Tier.NVLINK
        return Tier.NUMA if _numa(gpu) >= 0 else Tier.UNKNOWN
    if source is Source.NUMA or (source is Source.AUTO and not any(g.links for g in gpus)):
        numas = {_numa(g) for g in gpus}
        if -1 in numas:
            return Tier.UNKNOWN if len(numas) == 1 else Tier.CROSS_NUMA
        return Tier.NUMA if len(numas) == 1 else Tier.CROSS_NUMA
    tiers, _ = pair_tiers(gpus)
    return Tier(max(_clamp(tiers[a][b]) for a, b in itertools.combinations(range(len(gpus)), 2)))
