"""Go's Exp2, Log and Pow to the last bit: the bit patterns below are what Go's ``math`` package answers on
amd64 (printed with ``math.Float64bits`` by Go 1.26; ``src/math/exp.go``, ``log.go``, ``pow.go``). The VPA
histogram under TensorFusion's recommender uses all three (``decaying_histogram.go``,
``histogram_options.go``); the C library's answers differ in the last bit for some of these."""

from __future__ import annotations

import math
import struct

import pytest

from extender.autoscaling.gomath import go_exp2, go_log, go_pow_int


def bits(x: float) -> int:
    return int(struct.unpack("<Q", struct.pack("<d", x))[0])


@pytest.mark.parametrize(("x", "go"), [
    ("5.333333333333333", 0x404428a2f98d728a),
    ("37.77", 0x424b48c8f7f24cdb),
    ("99.99999", 0x462ffff176b51203),
    ("-73.25", 0x3b5ae89f995ad3ae),
    ("0.1", 0x3ff125fbee250664),
    ("12.5", 0x40b6a09e667f3bcc),
    ("64.0625", 0x43f0b5586cf9890f),
    ("3.7", 0x4029fdf8bcce533e),
    ("1e-09", 0x3ff00000002fa1f9),
])
def test_exp2(x: str, go: int) -> None:
    assert bits(go_exp2(float(x))) == go


@pytest.mark.parametrize(("x", "go"), [
    ("1.05", 0x3fa8fb063ef2c7f0),
    ("7.5", 0x40001e85798eb9a3),
    ("1e+07", 0x40301e3b843eaa73),
    ("123456.789", 0x40277281cad8a844),
    ("0.3", 0xbff34378fcbda721),
    ("9.99e+11", 0x403ba14907f3c942),
    ("2", 0x3fe62e42fefa39ef),
])
def test_log(x: str, go: int) -> None:
    assert bits(go_log(float(x))) == go


@pytest.mark.parametrize(("n", "go"), [
    (2, 0x3ff1a3d70a3d70a4), (3, 0x3ff285a1cac08313), (17, 0x4002560db3264e96), (100, 0x4060700a4de51799),
    (283, 0x412e4711f50464a3), (399, 0x41b0f99b43db255f), (566, 0x426ca5df832193d6),
])
def test_pow_of_the_bucket_ratio(n: int, go: int) -> None:
    assert bits(go_pow_int(1.05, n)) == go


def test_the_c_library_is_not_go() -> None:
    """Why these exist: at least one of the values above differs in Python's math."""
    assert bits(math.pow(1.05, 17)) != 0x4002560db3264e96 or bits(math.exp2(0.1)) != 0x3ff125fbee250664 or \
        any(bits(math.pow(1.05, n)) != bits(go_pow_int(1.05, n)) for n in range(2, 600))


def test_edges() -> None:
    assert go_exp2(2000.0) == math.inf and go_exp2(-2000.0) == 0.0 and math.isnan(go_exp2(math.nan))
    assert go_exp2(0.0) == 1.0 and go_exp2(10.0) == 1024.0
    assert go_log(0.0) == -math.inf and go_log(1.0) == 0.0 and math.isnan(go_log(-1.0))
    assert go_pow_int(1.05, 0) == 1.0 and go_pow_int(1.05, 1) == 1.05
