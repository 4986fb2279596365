"""Kubernetes quantities: what users write and the canonical form the webhook stores."""

from __future__ import annotations

from fractions import Fraction

import pytest
from hypothesis import given
from hypothesis import strategies as st

from extender.common.quantity import (
    Format,
    QuantityError,
    canonical_quantity,
    format_quantity,
    parse_quantity,
)


@pytest.mark.parametrize(
    ("text", "value"),
    [
        ("10", Fraction(10)),
        ("1.5", Fraction(3, 2)),
        ("500m", Fraction(1, 2)),
        ("16Gi", Fraction(16 * 2**30)),
        ("16384Mi", Fraction(16 * 2**30)),
        ("1k", Fraction(1000)),
        ("1e3", Fraction(1000)),
        ("1E-3", Fraction(1, 1000)),
        (".5", Fraction(1, 2)),
        ("+2", Fraction(2)),
        ("-2", Fraction(-2)),
        ("1n", Fraction(1, 10**9)),
        ("0.1n", Fraction(1, 10**9)),  # finer than nano rounds up, as the API server does
        (" 3 ", Fraction(3)),
    ],
)
def test_parse_quantity_values(text: str, value: Fraction) -> None:
    assert parse_quantity(text).value == value


@pytest.mark.parametrize("text", ["", "abc", "1.2.3", "10 Gi", "1GiB", "Gi", "--1", "1e99", "1" * 65, "0x10"])
def test_parse_quantity_rejects(text: str) -> None:
    with pytest.raises(QuantityError):
        parse_quantity(text)


@pytest.mark.parametrize(
    ("text", "canonical"),
    [
        ("16384Mi", "16Gi"),
        ("1.5", "1500m"),
        ("1000", "1k"),
        ("1024", "1024"),
        ("1536Mi", "1536Mi"),
        ("0.5Gi", "512Mi"),
        ("1Ki", "1Ki"),
        ("0", "0"),
        ("0Gi", "0"),
        ("100m", "100m"),
        ("1e3", "1e3"),
        ("2.5e3", "2500"),
        ("1500000", "1500k"),
        ("-1.5", "-1500m"),
    ],
)
def test_canonical_form(text: str, canonical: str) -> None:
    assert canonical_quantity(text) == canonical


def test_binary_format_falls_back_to_decimal_for_fractions() -> None:
    assert format_quantity(Fraction(3, 2), Format.BINARY_SI) == "1500m"


@given(st.integers(min_value=-(10**15), max_value=10**15), st.integers(min_value=0, max_value=9))
def test_canonical_form_parses_back_to_the_same_value(mantissa: int, nano_exponent: int) -> None:
    value = Fraction(mantissa, 10**nano_exponent)
    for fmt in Format:
        text = format_quantity(value, fmt)
        assert parse_quantity(text).value == value
        assert canonical_quantity(text) == canonical_quantity(canonical_quantity(text))


@given(st.integers(min_value=0, max_value=2**50))
def test_byte_counts_round_trip_through_binary_form(value: int) -> None:
    assert parse_quantity(format_quantity(value, Format.BINARY_SI)).value == value


@given(st.text(max_size=20))
def test_any_text_parses_or_raises_quantity_error(text: str) -> None:
    try:
        quantity = parse_quantity(text)
    except QuantityError as exc:
        assert repr(text) in str(exc) or "out of range" in str(exc)
        return
    assert parse_quantity(quantity.canonical()).value == quantity.value
