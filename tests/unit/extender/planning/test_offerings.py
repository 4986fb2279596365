"""Which instance types a Karpenter-mode pool may launch: eligibility, pricing, mixes and caps."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from extender.planning.amounts import Amount
from extender.planning.catalog import Catalog, parse_catalog
from extender.planning.offerings import MAX_PER_RECONCILE, Offering, cheapest, offerings
from extender.planning.pool import Requirement
from tests.unit.fixtures.planning import CATALOG, amount

# --- eligibility ------------------------------------------------------------------------------------


def names(offers: list[Offering]) -> list[tuple[str, str, str]]:
    return [o.sort_key for o in offers]


@pytest.mark.parametrize(
    ("requirements", "expected"),
    [
        (
            [],
            [
                ("arm.x1", "on-demand", ""),
                ("big.x4", "on-demand", ""),
                ("fat.x1", "on-demand", ""),
                ("small.x1", "on-demand", ""),
            ],
        ),
        ([("kubernetes.io/arch", "In", ["arm64"])], [("arm.x1", "on-demand", "")]),
        (
            [
                ("node.kubernetes.io/instance-type", "In", ["small.x1", "nope"]),
                ("karpenter.sh/capacity-type", "In", ["OnDemand", "Spot"]),
            ],
            [("small.x1", "on-demand", ""), ("small.x1", "spot", "")],
        ),
        ([("karpenter.sh/capacity-type", "In", ["Spot"])], [("small.x1", "spot", "")]),
        ([("karpenter.sh/capacity-type", "In", ["Reserved"])], []),
        (
            [("topology.kubernetes.io/zone", "In", ["z-b", "z-a"]), ("kubernetes.io/arch", "In", ["arm64"])],
            [("arm.x1", "on-demand", "z-a"), ("arm.x1", "on-demand", "z-b")],
        ),
        (
            [
                ("tensor-fusion.ai/gpu-vendor", "In", ["nvidia"]),
                ("tensor-fusion.ai/gpu-instance-family", "In", ["big"]),
            ],
            [("big.x4", "on-demand", "")],
        ),
        ([("tensor-fusion.ai/gpu-vendor", "In", ["AMD"])], []),
        (
            [("node.kubernetes.io/instance-type", "NotIn", ["small.x1", "big.x4", "fat.x1"])],
            [("arm.x1", "on-demand", "")],
        ),
        ([("kubernetes.io/arch", "DoesNotExist", [])], []),
    ],
)
def test_eligibility(
    requirements: list[tuple[str, str, list[str]]], expected: list[tuple[str, str, str]]
) -> None:
    reqs = [Requirement(k, op, tuple(v)) for k, op, v in requirements]
    assert names(offerings(CATALOG, reqs)) == expected


def test_catalog_zones_narrow_the_offerings() -> None:
    catalog = parse_catalog(
        "replaceDefaults: true\ninstanceTypes:\n"
        "- {name: a.x, gpuModel: T4, prices: {on-demand: 1}, zones: [z1, z2]}\n"
    )
    reqs = [Requirement("topology.kubernetes.io/zone", "In", ("z2", "z3"))]
    assert names(offerings(catalog, reqs)) == [("a.x", "on-demand", "z2")]


# --- pricing ------------------------------------------------------------------------------------


def plan_of(
    gap_amount: Amount,
    requirements: list[tuple[str, str, list[str]]] = (),  # type: ignore[assignment]
    room_amount: Amount | None = None,
    catalog: Catalog = CATALOG,
) -> list[tuple[str, str, int]]:
    offers = offerings(catalog, [Requirement(k, op, tuple(v)) for k, op, v in requirements])
    choice = cheapest(offers, gap_amount, room_amount)
    return [
        (launch.offering.instance.name, launch.offering.capacity_type, launch.count)
        for launch in choice.launches
    ]


AMD64_ON_DEMAND = [
    ("kubernetes.io/arch", "In", ["amd64"]),
    ("node.kubernetes.io/instance-type", "In", ["small.x1", "big.x4"]),
]


@pytest.mark.parametrize(
    ("gap_amount", "expected"),
    [
        (amount(100, 0), [("small.x1", "on-demand", 1)]),
        (amount(300, 0), [("small.x1", "on-demand", 3)]),  # 3.0 < 3.5
        (amount(400, 0), [("big.x4", "on-demand", 1)]),  # 3.5 < 4.0
        (amount(0, 96), [("big.x4", "on-demand", 1)]),  # VRAM alone decides the count
        (amount(800, 0), [("big.x4", "on-demand", 2)]),
        # 500: small x5 = 5.0, big x2 = 7.0, the mix big + small = 4.5 is strictly cheaper than both
        (amount(500, 0), [("big.x4", "on-demand", 1), ("small.x1", "on-demand", 1)]),
        (amount(0, 0), []),
    ],
)
def test_cheapest_single_or_mix(gap_amount: Amount, expected: list[tuple[str, str, int]]) -> None:
    assert plan_of(gap_amount, AMD64_ON_DEMAND) == expected


def test_spot_is_preferred_when_listed_and_cheaper() -> None:
    reqs = [
        ("node.kubernetes.io/instance-type", "In", ["small.x1"]),
        ("karpenter.sh/capacity-type", "In", ["OnDemand", "Spot"]),
    ]
    assert plan_of(amount(200, 0), reqs) == [("small.x1", "spot", 2)]
    assert plan_of(amount(200, 0), reqs[:1]) == [("small.x1", "on-demand", 2)]


def test_ties_break_by_name_not_at_random() -> None:
    catalog = parse_catalog(
        "replaceDefaults: true\ninstanceTypes:\n"
        "- {name: zz.x, gpuModel: T4, prices: {on-demand: 1}}\n"
        "- {name: aa.x, gpuModel: T4, prices: {on-demand: 1}}\n"
    )
    for _ in range(5):
        assert plan_of(amount(10, 0), catalog=catalog) == [("aa.x", "on-demand", 1)]


def test_cheapest_per_capacity_over_cheapest_per_instance() -> None:
    # arm.x1 is the cheapest instance, but 10 of them (4.2) cost more than 1 fat.x1 ... for VRAM 160Gi:
    # arm 10 x 0.42 = 4.2; fat 4 x 1.9 = 7.6; big 2 x 3.5 = 7.0; small 7 x 1.0 = 7.0 -> arm
    assert plan_of(amount(0, 160)) == [("arm.x1", "on-demand", 10)]


def test_max_resources_caps_the_launch() -> None:
    # Gap 500 TFLOPS, room 300: nothing closing the gap fits; the most of it within the cap is 3 small.
    offers = offerings(
        CATALOG, [Requirement("node.kubernetes.io/instance-type", "In", ("small.x1", "big.x4"))]
    )
    choice = cheapest(offers, amount(500, 0), amount(300, 1000))
    assert [(x.offering.instance.name, x.count) for x in choice.launches] == [("small.x1", 3)]
    assert choice.max_reached and choice.capacity.tflops <= 300
    # Room for a plan that closes the gap: the cheapest that fits under the cap, not the cheapest overall.
    choice = cheapest(offers, amount(400, 0), amount(450, 1000))
    assert [(x.offering.instance.name, x.count) for x in choice.launches] == [("big.x4", 1)]
    choice = cheapest(offers, amount(400, 0), amount(399, 1000))
    assert [(x.offering.instance.name, x.count) for x in choice.launches] == [("small.x1", 3)]
    assert choice.max_reached
    nothing = cheapest(offers, amount(400, 0), amount(50, 1000))
    assert nothing.launches == () and nothing.max_reached


def test_at_most_100_instances_per_reconcile() -> None:
    offers = offerings(CATALOG, [Requirement("node.kubernetes.io/instance-type", "In", ("small.x1",))])
    choice = cheapest(offers, amount(100 * 250, 0))
    assert [(x.offering.instance.name, x.count) for x in choice.launches] == [("small.x1", MAX_PER_RECONCILE)]


def test_no_eligible_type_says_why() -> None:
    choice = cheapest([], amount(1, 0))
    assert choice.launches == () and "gpuRequirements" in choice.reason


# --- properties ---------------------------------------------------------------------------------------


_TYPES = st.lists(
    st.tuples(st.integers(1, 8), st.integers(10, 400), st.integers(8, 96), st.integers(1, 4000)),
    min_size=1, max_size=4,
)


def _catalog(types: list[tuple[int, int, int, int]]) -> Catalog:
    lines = ["replaceDefaults: true", "instanceTypes:"]
    for i, (count, tflops, vram, cents) in enumerate(types):
        lines.append(f"- {{name: t{i}.x, gpuModel: X, gpuCount: {count}, tflopsPerGPU: '{tflops}', "
                     f"vramPerGPU: {vram}Gi, prices: {{on-demand: {cents / 100}}}}}")
    return parse_catalog("\n".join(lines))


@given(_TYPES, st.integers(0, 3000), st.integers(0, 500))
def test_the_choice_closes_the_gap_and_no_single_type_is_cheaper(types, tflops, vram_gi) -> None:
    offers = offerings(_catalog(types), [])
    need = amount(tflops, vram_gi)
    choice = cheapest(offers, need)
    if need.is_zero:
        assert choice.launches == ()
        return
    if sum(x.count for x in choice.launches) < MAX_PER_RECONCILE:
        assert choice.capacity.covers(need)
    assert len(choice.launches) <= 2
    for offer in offers:
        n = offer.instance.capacity.units_to_cover(need)
        if n <= MAX_PER_RECONCILE:
            assert choice.cost <= offer.price * n


@given(_TYPES, st.integers(1, 3000), st.integers(0, 500), st.integers(0, 3000), st.integers(0, 500))
def test_the_choice_never_exceeds_the_room(types, tflops, vram_gi, room_tflops, room_vram) -> None:
    room_amount = amount(room_tflops, room_vram)
    choice = cheapest(offerings(_catalog(types), []), amount(tflops, vram_gi), room_amount)
    assert room_amount.covers(choice.capacity)
    assert choice.max_reached or choice.capacity.covers(amount(tflops, vram_gi)) or not choice.launches \
        or sum(x.count for x in choice.launches) == MAX_PER_RECONCILE
