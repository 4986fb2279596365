"""Capacity amounts: TFLOPS and VRAM read from a pool's settings, and the field named when one is bad."""

from __future__ import annotations

import pytest

from extender.planning.amounts import Amount, CapacityError, parse_amount
from tests.unit.fixtures.planning import GI, T


def test_amount_parsing() -> None:
    assert parse_amount(None, "x") is None and parse_amount({}, "x") is None
    assert parse_amount({"tflops": "1.5", "vram": "1Gi"}, "x") == Amount(T(3, 2), GI)
    with pytest.raises(CapacityError, match=r"x\.tflops"):
        parse_amount({"tflops": "-1"}, "x")

