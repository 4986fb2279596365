"""Which instances to launch: eligible offerings, then the cheapest way to close a capacity gap.

For each eligible offering (instance type x capacity type x zone) ``n = max(ceil(tflops gap / its
TFLOPS), ceil(vram gap / its VRAM))`` and ``cost = hourly price x n``; the cheapest wins, ties by
name. A mix of two instance types is chosen only when it is strictly cheaper than every single type.
Launches never push the pool past ``maxResources``: when no plan closing the gap fits under the cap,
the single type covering the largest share of the gap within the cap is launched and the cap reported.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from fractions import Fraction

from extender.common.labels import (
    ARCH,
    CAPACITY_TYPE,
    GPU_INSTANCE_FAMILY,
    GPU_INSTANCE_SIZE,
    GPU_VENDOR,
    INSTANCE_TYPE,
    OS,
    REGION,
    ZONE,
)
from extender.kube.selectors import requirement_selects
from extender.planning.amounts import Amount
from extender.planning.catalog import Catalog, InstanceType, normalise_capacity_type
from extender.planning.pool import Requirement

MAX_PER_RECONCILE = 100
# Keys decided by the offering; every other requirement is passed through to the NodeClaim.
OFFERING_KEYS = (INSTANCE_TYPE, ARCH, OS, ZONE, REGION, CAPACITY_TYPE, GPU_VENDOR, GPU_INSTANCE_FAMILY,
                 GPU_INSTANCE_SIZE)


@dataclass(frozen=True)
class Offering:
    instance: InstanceType
    capacity_type: str
    zone: str  # "" when the pool and the catalog leave the zone open
    price: Fraction

    @property
    def sort_key(self) -> tuple[str, str, str]:
        return (self.instance.name, self.capacity_type, self.zone)


@dataclass(frozen=True)
class Launch:
    offering: Offering
    count: int

    @property
    def cost(self) -> Fraction:
        return self.offering.price * self.count

    @property
    def capacity(self) -> Amount:
        return self.offering.instance.capacity.times(self.count)


@dataclass(frozen=True)
class Choice:
    launches: tuple[Launch, ...]
    max_reached: bool = False  # the gap was not (fully) closed because of maxResources
    reason: str = ""  # why nothing, or less than the gap, is launched

    @property
    def cost(self) -> Fraction:
        return sum((launch.cost for launch in self.launches), Fraction(0))

    @property
    def capacity(self) -> Amount:
        total = Amount()
        for launch in self.launches:
            total = total + launch.capacity
        return total


def _meets(requirement: Requirement, value: str) -> bool:
    """A requirement on an instance type's value ("" when it has none)."""
    return requirement_selects(requirement.operator, requirement.values, value or None)


def _instance_value(instance: InstanceType, key: str) -> str | None:
    return {
        INSTANCE_TYPE: instance.name, ARCH: instance.arch, OS: "linux", GPU_VENDOR: instance.vendor,
        GPU_INSTANCE_FAMILY: instance.family, GPU_INSTANCE_SIZE: instance.size,
    }.get(key)


def _normalised(requirement: Requirement) -> Requirement:
    if requirement.key == CAPACITY_TYPE:
        return Requirement(requirement.key, requirement.operator, tuple(
            normalise_capacity_type(v) or v for v in requirement.values))
    if requirement.key == GPU_VENDOR:
        upper = tuple(v.upper() for v in requirement.values)
        return Requirement(requirement.key, requirement.operator, upper)
    return requirement


def offerings(catalog: Catalog, requirements: Sequence[Requirement]) -> list[Offering]:
    """Every (instance type, capacity type, zone) the pool's gpuRequirements allow, with its price."""
    reqs = [_normalised(r) for r in requirements]
    by_key: dict[str, list[Requirement]] = {}
    for r in reqs:
        by_key.setdefault(r.key, []).append(r)
    capacity_reqs = by_key.get(CAPACITY_TYPE, [])
    zone_reqs = by_key.get(ZONE, [])
    zone_choices = sorted({v for r in zone_reqs if r.operator == "In" for v in r.values})
    out: list[Offering] = []
    for instance in catalog.types:
        if instance.capacity.is_zero:
            continue
        ok = True
        for key, rs in by_key.items():
            value = _instance_value(instance, key)
            if key == GPU_VENDOR and value is not None:
                value = value.upper()
            if key == REGION and instance.region:
                value = instance.region
            if value is not None and not all(_meets(r, value) for r in rs):
                ok = False
        if not ok:
            continue
        zones = list(instance.zones) or zone_choices or [""]
        zones = [z for z in zones if not z or all(_meets(r, z) for r in zone_reqs)]
        for capacity_type, price in sorted(instance.prices.items()):
            allowed = (all(_meets(r, capacity_type) for r in capacity_reqs) if capacity_reqs
                       else capacity_type == "on-demand")
            if allowed:
                out.extend(Offering(instance, capacity_type, zone, price) for zone in zones)
    return sorted(out, key=lambda o: o.sort_key)


def _single(offer: Offering, gap: Amount) -> Launch:
    return Launch(offer, max(1, offer.instance.capacity.units_to_cover(gap)))


def _plan_key(choice: Choice) -> tuple[Fraction, int, tuple[tuple[str, str, str], ...]]:
    return (choice.cost, sum(launch.count for launch in choice.launches),
            tuple(launch.offering.sort_key for launch in choice.launches))


def _mixes(offers: Sequence[Offering], gap: Amount,
           singles: dict[tuple[str, str, str], Launch]) -> Iterable[Choice]:
    for i, first in enumerate(offers):
        for second in offers[i + 1:]:
            if first.instance.name == second.instance.name:
                continue
            for a, b in ((first, second), (second, first)):
                for n_a in range(1, min(singles[a.sort_key].count, MAX_PER_RECONCILE)):
                    rest = (gap - a.instance.capacity.times(n_a)).positive()
                    if rest.is_zero:
                        break
                    n_b = b.instance.capacity.units_to_cover(rest)
                    if n_a + n_b <= MAX_PER_RECONCILE:
                        pair = sorted((Launch(a, n_a), Launch(b, n_b)), key=lambda x: x.offering.sort_key)
                        yield Choice(tuple(pair))


def cheapest(offers: Sequence[Offering], gap: Amount, room: Amount | None = None) -> Choice:
    """The cheapest launches that close ``gap`` without exceeding ``room`` (None: no cap)."""
    if gap.is_zero:
        return Choice(())
    if not offers:
        return Choice((), reason="no instance type in the catalog matches the pool's gpuRequirements")
    singles = {offer.sort_key: _single(offer, gap) for offer in offers}
    candidates = [Choice((launch,)) for launch in singles.values() if launch.count <= MAX_PER_RECONCILE]
    best_single = min(candidates, key=_plan_key, default=None)
    fits = [c for c in candidates if room is None or room.covers(c.capacity)]
    best = min(fits, key=_plan_key, default=None)
    if best_single is not None:
        per_type: dict[str, Offering] = {}
        for offer in sorted(offers, key=lambda o: (o.price, o.sort_key)):
            per_type.setdefault(offer.instance.name, offer)  # zones and capacity types: the cheapest only
        cheaper_mixes = [m for m in _mixes(sorted(per_type.values(), key=lambda o: o.sort_key), gap, singles)
                         if m.cost < best_single.cost and (room is None or room.covers(m.capacity))]
        best_mix = min(cheaper_mixes, key=_plan_key, default=None)
        if best_mix is not None and (best is None or best_mix.cost < best.cost):
            best = best_mix
    if best is not None:
        return best
    return _partial(offers, gap, room)


def _covered(supply: Amount, gap: Amount) -> Fraction:
    shares = []
    if gap.tflops > 0:
        shares.append(min(Fraction(1), supply.tflops / gap.tflops))
    if gap.vram > 0:
        shares.append(min(Fraction(1), Fraction(supply.vram, gap.vram)))
    return min(shares) if shares else Fraction(1)


def _partial(offers: Sequence[Offering], gap: Amount, room: Amount | None) -> Choice:
    """The gap cannot be closed: the most of it one type can cover within the cap and the per-reconcile
    limit, cheapest first."""
    options = []
    for offer in offers:
        need = min(offer.instance.capacity.units_to_cover(gap), MAX_PER_RECONCILE)
        count = min(need, offer.instance.capacity.units_within(room)) if room is not None else need
        if count >= 1:
            options.append(Launch(offer, count))
    capped = room is not None
    if not options:
        return Choice((), max_reached=capped,
                      reason="maxResources leaves no room for any eligible instance type" if capped else "")
    best = min(options, key=lambda x: (-_covered(x.capacity, gap), x.cost, x.offering.sort_key))
    return Choice((best,), max_reached=capped and not best.capacity.covers(gap),
                  reason="maxResources caps the launch" if capped else "at most 100 instances per reconcile")
