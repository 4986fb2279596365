"""Removal rules shared by compaction (AutoSelect) and Karpenter mode: empty, old, unpinned, surplus."""

from __future__ import annotations

import datetime as dt
from fractions import Fraction
from typing import Any

import pytest

from extender.planning.amounts import Amount
from extender.planning.pool import pool_config
from extender.planning.removal import NodeVerdict, PoolNode, removal_decisions

GI = 1 << 30
NOW = dt.datetime(2026, 1, 1, 12, 0, tzinfo=dt.UTC)
ONE = Amount(Fraction(100), 24 * GI)


def node(
    name: str,
    *,
    age: float | None = 600,
    used: int = 0,
    pinned: bool = False,
    price: str | None = None,
    size: int = 1,
) -> PoolNode:
    return PoolNode(
        name,
        ONE.times(size),
        Amount(Fraction(used), used * GI),
        None if age is None else NOW - dt.timedelta(seconds=age),
        pinned,
        Fraction(price) if price else None,
    )


def config(**capacity: Any):  # type: ignore[no-untyped-def]
    return pool_config({"metadata": {"name": "p"}, "spec": {"capacityConfig": capacity}})


def verdicts(cfg: Any, nodes: list[PoolNode], protection: float = 300) -> dict[str, NodeVerdict]:
    return {d.node.name: d.verdict for d in removal_decisions(cfg, nodes, NOW, protection)}


WARM_ONE = {"warmResources": {"tflops": 100, "vram": "24Gi"}}
MIN_TWO = {"minResources": {"tflops": 200}}


@pytest.mark.parametrize(
    ("targets", "nodes", "expected"),
    [
        # no targets: every old empty node goes, busy ones stay
        ({}, [node("a"), node("b", used=10)], {"a": NodeVerdict.RELEASE, "b": NodeVerdict.BUSY}),
        # warm one node: the older-eligible, more expensive one goes, the other is kept for warm
        (
            WARM_ONE,
            [node("a", price="1"), node("b", price="2")],
            {"a": NodeVerdict.NEEDED_WARM, "b": NodeVerdict.RELEASE},
        ),
        # a busy node with free room counts toward warm: both empty nodes may go
        (
            WARM_ONE,
            [node("a"), node("b"), node("c", used=1, size=2)],
            {"a": NodeVerdict.RELEASE, "b": NodeVerdict.RELEASE, "c": NodeVerdict.BUSY},
        ),
        # minimum two nodes of three
        (
            MIN_TWO,
            [node("a"), node("b"), node("c")],
            {"a": NodeVerdict.RELEASE, "b": NodeVerdict.NEEDED_MIN, "c": NodeVerdict.NEEDED_MIN},
        ),
        # young surplus node: not released yet; the old one is released first, the young one kept for warm
        (
            WARM_ONE,
            [node("old"), node("young", age=60)],
            {"old": NodeVerdict.RELEASE, "young": NodeVerdict.NEEDED_WARM},
        ),
        ({}, [node("young", age=60)], {"young": NodeVerdict.YOUNG}),
        # unknown age is never old enough
        ({}, [node("x", age=None)], {"x": NodeVerdict.YOUNG}),
        # pinned nodes never go, and their capacity still counts toward warm
        (WARM_ONE, [node("pin", pinned=True), node("a")],
         {"pin": NodeVerdict.PINNED, "a": NodeVerdict.RELEASE}),
        # warm needs the VRAM of one node; one busy node leaves none free
        (
            {"warmResources": {"vram": "24Gi"}},
            [node("busy", used=24), node("a")],
            {"busy": NodeVerdict.BUSY, "a": NodeVerdict.NEEDED_WARM},
        ),
        # larger nodes go first among equals
        (
            WARM_ONE,
            [node("small"), node("big", size=4)],
            {"small": NodeVerdict.NEEDED_WARM, "big": NodeVerdict.RELEASE},
        ),
    ],
)
def test_removal_rules(targets: dict[str, Any], nodes: list[PoolNode],
                       expected: dict[str, NodeVerdict]) -> None:
    assert verdicts(config(**targets), nodes) == expected


def test_protection_time_is_a_parameter() -> None:
    assert verdicts(config(), [node("a", age=20)], protection=10) == {"a": NodeVerdict.RELEASE}
    assert verdicts(config(), [node("a", age=20)], protection=30) == {"a": NodeVerdict.YOUNG}


def test_reasons_name_the_target_and_the_figures() -> None:
    decisions = removal_decisions(config(**WARM_ONE), [node("a"), node("b")], NOW)
    kept = next(d for d in decisions if d.needed)
    assert "kept for warmResources (100 TFLOPS, 24Gi VRAM)" in kept.reason
    released = next(d for d in decisions if d.verdict is NodeVerdict.RELEASE)
    assert "10m old" in released.reason  # an age as kubectl prints one, never 600s
