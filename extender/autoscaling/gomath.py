"""Go's ``math.Exp2``, ``math.Log`` and ``math.Pow`` (integer powers) as they compute on amd64, step for step
(``src/math/exp.go``, ``log.go`` (the amd64 assembly computes the same), ``pow.go``).

Python's ``math`` calls the C library, whose results differ from Go's in the last bit for about one value
in ten (``exp2``), one in two hundred (``log``) and nearly every power of 1.05; in TensorFusion's decaying
histograms a last bit decides a percentile that falls exactly between two buckets' weights.
"""

from __future__ import annotations

import math

_LN2_HI = 6.93147180369123816490e-01
_LN2_LO = 1.90821492927058770002e-10
_SQRT2_HALF = math.sqrt(2) / 2


def go_exp2(x: float) -> float:
    """``math.Exp2`` (pure Go on amd64)."""
    if math.isnan(x):
        return x
    if x > 1.0239999999999999e03:
        return math.inf
    if x < -1.0740e03:
        return 0.0
    k = int(x + 0.5) if x > 0 else int(x - 0.5) if x < 0 else 0
    t = x - float(k)
    hi = t * _LN2_HI
    lo = -t * _LN2_LO
    p1, p2, p3 = 1.66666666666666657415e-01, -2.77777777770155933842e-03, 6.61375632143793436117e-05
    p4, p5 = -1.65339022054652515390e-06, 4.13813679705723846039e-08
    r = hi - lo
    t = r * r
    c = r - t * (p1 + t * (p2 + t * (p3 + t * (p4 + t * p5))))
    y = 1 - ((lo - (r * c) / (2 - c)) - hi)
    return math.ldexp(y, k)


def go_log(x: float) -> float:
    """``math.Log``."""
    if math.isnan(x) or x == math.inf:
        return x
    if x < 0:
        return math.nan
    if x == 0:
        return -math.inf
    f1, ki = math.frexp(x)
    if f1 < _SQRT2_HALF:
        f1 *= 2
        ki -= 1
    f = f1 - 1
    k = float(ki)
    l1, l2, l3, l4 = 6.666666666666735130e-01, 3.999999999940941908e-01, 2.857142874366239149e-01, \
        2.222219843214978396e-01
    l5, l6, l7 = 1.818357216161805012e-01, 1.531383769920937332e-01, 1.479819860511658591e-01
    s = f / (2 + f)
    s2 = s * s
    s4 = s2 * s2
    t1 = s2 * (l1 + s4 * (l3 + s4 * (l5 + s4 * l7)))
    t2 = s4 * (l2 + s4 * (l4 + s4 * l6))
    big_r = t1 + t2
    hfsq = 0.5 * f * f
    return k * _LN2_HI - ((hfsq - (s * (hfsq + big_r) + k * _LN2_LO)) - f)


def go_pow_int(x: float, n: int) -> float:
    """``math.Pow(x, float64(n))`` for a finite ``x > 0`` and an integer ``n >= 0``: successive squarings
    of ``x``'s mantissa, powers of two kept apart."""
    if n == 0 or x == 1:
        return 1.0
    if n == 1:
        return x
    a1, ae = 1.0, 0
    x1, xe = math.frexp(x)
    i = n
    while i != 0:
        if xe < -(1 << 12) or xe > (1 << 12):
            ae += xe
            break
        if i & 1:
            a1 *= x1
            ae += xe
        x1 *= x1
        xe <<= 1
        if x1 < 0.5:
            x1 += x1
            xe -= 1
        i >>= 1
    return math.ldexp(a1, ae)
