from __future__ import annotations

import argparse
import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from extender.common.numbers import MAX_DIGITS, NumberError, float_flag, int_flag, parse_float, parse_int


@pytest.mark.parametrize(("value", "expected"), [
    ("7", 7), (" 12 ", 12), ("-3", -3), ("+4", 4), (9, 9), ("0" * MAX_DIGITS, 0),
])
def test_integers_read(value: object, expected: int) -> None:
    assert parse_int(value) == expected


@pytest.mark.parametrize(("value", "needle"), [
    ("1" * 5000, "too long for a number (at most 40 digits)"),  # Python's own limit is 4,300
    (10**300, "too large"), ("1.5", "is not an integer"), ("", "is not an integer"), ("٣", "not an integer"),
    (True, "not an integer"), (None, "not an integer"), (1.0, "not an integer"), ([1], "not an integer"),
    ({"a": 1}, "not an integer"), ("0x10", "not an integer"), ("1_000", "not an integer"),
])
def test_integers_refused_with_the_value(value: object, needle: str) -> None:
    with pytest.raises(NumberError, match="") as exc:
        parse_int(value)
    assert needle in str(exc.value)
    assert len(str(exc.value)) < 200  # the value is shown shortened


def test_integer_range_names_the_bounds() -> None:
    with pytest.raises(NumberError, match=r"'0' is below 1 \(expected 1..128\)"):
        parse_int("0", minimum=1, maximum=128)
    with pytest.raises(NumberError, match="above 128"):
        parse_int("129", minimum=1, maximum=128)


@pytest.mark.parametrize("value", ["nan", "inf", "-inf", float("nan"), float("inf"), "1e999", "9" * 5000,
                                   True, None, [], "1,5"])
def test_floats_refuse_what_is_not_a_finite_number(value: object) -> None:
    with pytest.raises(NumberError):
        parse_float(value)


@given(st.text(max_size=60) | st.integers() | st.floats() | st.booleans() | st.none())
def test_both_parses_are_total(value: object) -> None:
    """Whatever a user types, a number or a NumberError; never another exception."""
    for parse in (parse_int, parse_float):
        try:
            got = parse(value)
        except NumberError:
            continue
        assert isinstance(got, int | float) and math.isfinite(got)


def test_flags_answer_argparse_errors() -> None:
    parser = argparse.ArgumentParser(exit_on_error=False)
    parser.add_argument("--port", type=int_flag(0, 65535))
    parser.add_argument("--timeout", type=float_flag(0))
    assert parser.parse_args(["--port", "80", "--timeout", "2.5"]).port == 80
    for argv in (["--port", "9" * 5000], ["--port", "70000"], ["--timeout", "nan"], ["--timeout", "-1"]):
        with pytest.raises(argparse.ArgumentError):
            parser.parse_args(argv)
