"""Capacity decisions of Karpenter-mode pools: targets, gaps, eligibility, pricing, mixes and caps."""

from __future__ import annotations

from fractions import Fraction
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from extender.common.timefmt import parse_duration
from extender.planning.amounts import Amount, CapacityError, parse_amount
from extender.planning.catalog import DEFAULT_CATALOG, Catalog, parse_catalog
from extender.planning.gaps import PoolCapacity, gap, room
from extender.planning.offerings import MAX_PER_RECONCILE, Offering, cheapest, offerings
from extender.planning.pool import ProvisioningMode, Requirement, pool_config

GI = 1 << 30
T = Fraction


def amount(tflops: int | str, vram_gi: int) -> Amount:
    return Amount(T(tflops), vram_gi * GI)


CATALOG = parse_catalog("""
replaceDefaults: true
instanceTypes:
- {name: small.x1, arch: amd64, gpuModel: A10G, gpuCount: 1, tflopsPerGPU: "100", vramPerGPU: 24Gi,
   prices: {on-demand: 1.0, spot: 0.4}}
- {name: big.x4, arch: amd64, gpuModel: A10G, gpuCount: 4, tflopsPerGPU: "100", vramPerGPU: 24Gi,
   prices: {on-demand: 3.5}}
- {name: arm.x1, arch: arm64, gpuModel: T4G, gpuCount: 1, tflopsPerGPU: "65", vramPerGPU: 16Gi,
   prices: {OnDemand: 0.42}}
- {name: fat.x1, arch: amd64, gpuModel: L40S, gpuCount: 1, vramPerGPU: 48Gi, prices: {on-demand: 1.9}}
""")


def pool(**capacity: Any) -> dict[str, Any]:
    return {
        "kind": "GPUPool",
        "metadata": {"name": "p"},
        "spec": {
            "capacityConfig": capacity,
            "nodeManagerConfig": {
                "provisioningMode": "Karpenter",
                "nodeProvisioner": {
                    "karpenterNodeClassRef": {
                        "group": "karpenter.kwok.sh",
                        "kind": "KWOKNodeClass",
                        "version": "v1alpha1",
                        "name": "default",
                    }
                },
            },
        },
    }


def test_catalog_reads_the_issue_format_and_fills_tflops_from_the_model_table() -> None:
    fat = CATALOG.get("fat.x1")
    assert fat is not None and fat.tflops_per_gpu == T(362) and fat.vram_per_gpu == 48 * GI
    assert CATALOG.get("arm.x1") is not None and CATALOG.get("arm.x1").prices == {"on-demand": T("0.42")}
    assert [t.name for t in CATALOG.types] == ["arm.x1", "big.x4", "fat.x1", "small.x1"]


def test_catalog_extends_and_overrides_the_builtin_default() -> None:
    merged = parse_catalog(
        "instanceTypes:\n- {name: g5.xlarge, gpuModel: A10G, prices: {on-demand: 9}}\n"
        "- {name: my.gpu, gpuModel: H100, gpuCount: 2, prices: {spot: 3}}\n"
    )
    assert len(merged.types) == len(DEFAULT_CATALOG.types) + 1
    assert merged.get("g5.xlarge").prices == {"on-demand": T(9)}
    assert merged.get("my.gpu").capacity == Amount(T(989) * 2, 160 * GI)


def test_catalog_from_a_configmap() -> None:
    text = (
        "kind: ConfigMap\ndata:\n  catalog.yaml: |\n    replaceDefaults: true\n    instanceTypes:\n"
        "    - {name: a.b, gpuModel: T4, prices: {on-demand: 1}}\n"
    )
    assert [t.name for t in parse_catalog(text).types] == ["a.b"]


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("instanceTypes: [{gpuModel: T4, prices: {on-demand: 1}}]", "needs a name"),
        ("instanceTypes: [{name: x, gpuModel: Q9, prices: {on-demand: 1}}]", "give tflopsPerGPU"),
        ("instanceTypes: [{name: x, gpuModel: T4}]", "prices"),
        ("instanceTypes: [{name: x, gpuModel: T4, prices: {cheap: 1}}]", "unknown capacity type 'cheap'"),
        ("instanceTypes: [{name: x, gpuModel: T4, prices: {spot: -1}}]", "must not be negative"),
        ("instanceTypes: [{name: x, gpuModel: T4, gpuCount: 0, prices: {spot: 1}}]", "gpuCount=0"),
        (
            "instanceTypes: [{name: x, gpuModel: T4, vramPerGPU: lots, prices: {spot: 1}}]",
            "vramPerGPU='lots'",
        ),
        ("[1, 2]", "instanceTypes list"),
        ("instanceTypes: [3]", "expected a map"),
    ],
)
def test_bad_catalogs_are_named(text: str, message: str) -> None:
    with pytest.raises(CapacityError, match=message.replace("(", r"\(").replace("[", r"\[")):
        parse_catalog(text)


def test_pool_config_parses_targets_and_reports_problems() -> None:
    config = pool_config(
        pool(
            minResources={"tflops": "200", "vram": "48Gi"},
            warmResources={"tflops": 100},
            maxResources={"tflops": "1k"},
        )
    )
    assert config.mode is ProvisioningMode.KARPENTER and not config.problems
    assert config.min == amount(200, 48) and config.warm == amount(100, 0)
    assert config.max is not None and config.max.tflops == 1000 and config.max.vram > 10**20  # no VRAM cap
    bad = pool_config(
        {
            "metadata": {"name": "q"},
            "spec": {
                "capacityConfig": {"minResources": {"vram": "x"}},
                "nodeManagerConfig": {
                    "provisioningMode": "Karpenter",
                    "nodeProvisioner": {"karpenterNodeClassRef": {"name": "n"}},
                },
            },
        }
    )
    assert any("minResources.vram='x'" in p for p in bad.problems)
    assert any("missing group, kind, version" in p for p in bad.problems)
    assert pool_config({"metadata": {"name": "r"}}).mode is ProvisioningMode.AUTO_SELECT


@pytest.mark.parametrize(("text", "seconds"), [("5m", 300), ("1h30m", 5400), ("90s", 90), ("250ms", 0.25)])
def test_durations(text: str, seconds: float) -> None:
    assert parse_duration(text).total_seconds() == seconds


@pytest.mark.parametrize("text", ["", "5", "m5", "5 m", "5d"])
def test_bad_durations(text: str) -> None:
    with pytest.raises(ValueError):
        parse_duration(text)


def test_amount_parsing() -> None:
    assert parse_amount(None, "x") is None and parse_amount({}, "x") is None
    assert parse_amount({"tflops": "1.5", "vram": "1Gi"}, "x") == Amount(T(3, 2), GI)
    with pytest.raises(CapacityError, match=r"x\.tflops"):
        parse_amount({"tflops": "-1"}, "x")


# --- gaps -----------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("targets", "total", "available", "pending", "demand", "want", "kind"),
    [
        ({"minResources": {"tflops": 200, "vram": "48Gi"}}, (0, 0), (0, 0), (0, 0), (0, 0), (200, 48), "min"),
        ({"minResources": {"tflops": 200}}, (100, 24), (100, 24), (100, 24), (0, 0), (0, 0), ""),
        ({"minResources": {"vram": "48Gi"}}, (400, 24), (400, 24), (0, 0), (0, 0), (0, 24), "min"),
        # a minimum gap hides the warm gap
        (
            {"minResources": {"tflops": 200}, "warmResources": {"tflops": 500}},
            (100, 24),
            (0, 0),
            (0, 0),
            (0, 0),
            (100, 0),
            "min",
        ),
        (
            {"warmResources": {"tflops": 100, "vram": "24Gi"}},
            (200, 48),
            (50, 30),
            (0, 0),
            (0, 0),
            (50, 0),
            "warm",
        ),
        ({"warmResources": {"tflops": 100}}, (200, 48), (50, 30), (60, 24), (0, 0), (0, 0), ""),
        ({}, (100, 24), (0, 0), (0, 0), (30, 8), (30, 8), "demand"),
        ({}, (100, 24), (0, 0), (20, 24), (30, 8), (10, 0), "demand"),
        ({"warmResources": {"tflops": 10}}, (100, 24), (0, 0), (0, 0), (30, 8), (30, 8), "warm+demand"),
    ],
)
def test_gap_rules(
    targets: dict[str, Any],
    total: tuple[int, int],
    available: tuple[int, int],
    pending: tuple[int, int],
    demand: tuple[int, int],
    want: tuple[int, int],
    kind: str,
) -> None:
    result = gap(
        pool_config(pool(**targets)),
        PoolCapacity(amount(*total), amount(*available), amount(*pending)),
        amount(*demand),
    )
    assert (result.amount, result.kind) == (amount(*want), kind)


def test_room_under_max() -> None:
    config = pool_config(pool(maxResources={"tflops": 500, "vram": "100Gi"}))
    assert room(config, PoolCapacity(amount(200, 24), amount(0, 0), amount(100, 24))) == amount(200, 52)
    assert room(config, PoolCapacity(amount(600, 24), amount(0, 0), amount(0, 0))) == amount(0, 76)
    assert room(pool_config(pool()), PoolCapacity(amount(1, 1), amount(1, 1), amount(0, 0))) is None


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
