"""The capacity gap of a pool: minimum, warm and pending-demand targets against what it has and has coming,
and the room its maximum leaves."""

from __future__ import annotations

from typing import Any

import pytest

from extender.planning.gaps import PoolCapacity, gap, room
from extender.planning.pool import pool_config
from tests.unit.fixtures.planning import amount, pool


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

