"""The one way numbers typed by people are read: annotations, CRD fields, flags and files.

A number longer than :data:`MAX_DIGITS` characters is refused before Python converts it (so an annotation
of 5,000 digits is a clear "too long", not the interpreter's "Exceeds the limit" error), and NaN and the
infinities are refused where a count or an amount is expected. Every refusal is a :class:`NumberError`, a
``ValueError`` whose message names the value (shortened) and what was expected; the caller adds the key.
"""

from __future__ import annotations

import argparse
import math
import re
from collections.abc import Callable
from typing import TypeVar

MAX_DIGITS = 40  # far above any count, index, port or byte size a setting needs (2**64 has 20 digits)

_INT = re.compile(r"[+-]?[0-9]+")
_FLOAT = re.compile(r"[+-]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)(?:[eE][+-]?[0-9]{1,3})?")


class NumberError(ValueError):
    """A value that is not the number expected; the message names the value."""


T = TypeVar("T")


def shown(value: object, limit: int = 40) -> str:
    """``value`` as a message shows it: its repr, cut to ``limit`` characters with the full length."""
    text = repr(value)
    if len(text) <= limit:
        return text
    size = f"{len(value)} characters" if isinstance(value, str | bytes | list | dict) else "long"
    return f"{text[:limit]}... ({size})"


def parse_int(value: object, *, minimum: int | None = None, maximum: int | None = None,
              max_digits: int = MAX_DIGITS) -> int:
    """An integer from a string of ASCII digits (sign allowed, surrounding spaces ignored) or from an int
    (not a bool, not a float). ``NumberError`` for anything else, a longer string, or a value out of
    ``minimum``..``maximum``."""
    if isinstance(value, bool) or not isinstance(value, int | str):
        raise NumberError(f"{shown(value)} is not an integer")
    if isinstance(value, str):
        text = value.strip()
        if len(text) > max_digits:
            raise NumberError(f"{shown(value)} is too long for a number (at most {max_digits} digits)")
        if not text.isascii() or _INT.fullmatch(text) is None:
            raise NumberError(f"{shown(value)} is not an integer")
        number = int(text)
    else:
        if abs(value).bit_length() > max_digits * 4:  # about max_digits decimal digits
            raise NumberError(f"{shown(value)} is too large (at most {max_digits} digits)")
        number = value
    _check_range(value, number, minimum, maximum)
    return number


def parse_float(value: object, *, minimum: float | None = None, maximum: float | None = None,
                max_digits: int = MAX_DIGITS) -> float:
    """A finite number from a decimal string (``1``, ``1.5``, ``.5``, ``2e3``) or an int/float (not a
    bool). ``NumberError`` for NaN, the infinities, longer strings and values out of range."""
    if isinstance(value, bool) or not isinstance(value, int | float | str):
        raise NumberError(f"{shown(value)} is not a number")
    if isinstance(value, str):
        text = value.strip()
        if len(text) > max_digits:
            raise NumberError(f"{shown(value)} is too long for a number (at most {max_digits} digits)")
        if _FLOAT.fullmatch(text) is None:
            raise NumberError(f"{shown(value)} is not a number")
        number = float(text)
    elif isinstance(value, int):
        if abs(value).bit_length() > max_digits * 4:
            raise NumberError(f"{shown(value)} is too large (at most {max_digits} digits)")
        number = float(value)
    else:
        number = value
    if not math.isfinite(number):
        raise NumberError(f"{shown(value)} is not a finite number")
    _check_range(value, number, minimum, maximum)
    return number


def _check_range(value: object, number: float, minimum: float | None, maximum: float | None) -> None:
    if minimum is not None and number < minimum:
        raise NumberError(f"{shown(value)} is below {minimum}"
                          + (f" (expected {minimum}..{maximum})" if maximum is not None else ""))
    if maximum is not None and number > maximum:
        raise NumberError(f"{shown(value)} is above {maximum}"
                          + (f" (expected {minimum}..{maximum})" if minimum is not None else ""))


def _flag(parse: Callable[[str], T], name: str) -> Callable[[str], T]:
    """An argparse ``type`` from a parse that raises ``NumberError``: argparse's error with its message."""
    def convert(text: str) -> T:
        try:
            return parse(text)
        except NumberError as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None
    convert.__name__ = name
    return convert


def int_flag(minimum: int | None = None, maximum: int | None = None) -> Callable[[str], int]:
    """The argparse ``type`` of an integer flag: :func:`parse_int` with argparse's error."""
    return _flag(lambda text: parse_int(text, minimum=minimum, maximum=maximum), "integer")


def float_flag(minimum: float | None = None, maximum: float | None = None) -> Callable[[str], float]:
    """The argparse ``type`` of a number flag: :func:`parse_float` with argparse's error."""
    return _flag(lambda text: parse_float(text, minimum=minimum, maximum=maximum), "number")
