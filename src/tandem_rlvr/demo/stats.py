"""Small statistics for reports over a few seeds: Student-t quantiles for any degrees of freedom,
t-intervals of a mean, and a two-one-sided-tests (TOST) equivalence verdict. No SciPy needed.

The t distribution's CDF is written with the regularized incomplete beta function, evaluated by
its continued fraction (modified Lentz); the quantile inverts the CDF by bisection.
"""

from __future__ import annotations

import math

_EPS = 1e-15
_TINY = 1e-300


def _beta_cf(a: float, b: float, x: float) -> float:
    """Continued fraction of the incomplete beta function (converges for ``x < (a + 1) / (a + b + 2)``)."""
    qab, qap, qam = a + b, a + 1.0, a - 1.0
    c, d = 1.0, 1.0 - qab * x / qap
    d = 1.0 / (d if abs(d) > _TINY else _TINY)
    h = d
    for m in range(1, 1000):
        m2 = 2 * m
        for num in (m * (b - m) * x / ((qam + m2) * (a + m2)), -(a + m) * (qab + m) * x / ((a + m2) * (qap + m2))):
            d = 1.0 + num * d
            d = 1.0 / (d if abs(d) > _TINY else _TINY)
            c = 1.0 + num / c
            c = c if abs(c) > _TINY else _TINY
            h *= d * c
        if abs(d * c - 1.0) < _EPS:
            return h
    raise ArithmeticError(f"incomplete beta continued fraction did not converge (a={a}, b={b}, x={x})")


def betainc(a: float, b: float, x: float) -> float:
    """Regularized incomplete beta ``I_x(a, b)`` for ``a, b > 0`` and ``0 <= x <= 1``."""
    if not (a > 0 and b > 0):
        raise ValueError(f"betainc needs a, b > 0, got a={a}, b={b}")
    if not 0.0 <= x <= 1.0:
        raise ValueError(f"betainc needs 0 <= x <= 1, got {x}")
    if x in (0.0, 1.0):
        return x
    log_front = math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b) + a * math.log(x) + b * math.log1p(-x)
    if x < (a + 1.0) / (a + b + 2.0):
        return math.exp(log_front) * _beta_cf(a, b, x) / a
    return 1.0 - math.exp(log_front) * _beta_cf(b, a, 1.0 - x) / b


def t_cdf(t: float, df: float) -> float:
    """CDF of Student's t with ``df`` degrees of freedom."""
    if df <= 0:
        raise ValueError(f"degrees of freedom must be > 0, got {df}")
    tail = 0.5 * betainc(df / 2.0, 0.5, df / (df + t * t))
    return 1.0 - tail if t >= 0 else tail


def t_quantile(p: float, df: float) -> float:
    """The ``p`` quantile of Student's t with ``df`` degrees of freedom (bisection on :func:`t_cdf`)."""
    if not 0.0 < p < 1.0:
        raise ValueError(f"quantile level must be in (0, 1), got {p}")
    if p < 0.5:
        return -t_quantile(1.0 - p, df)
    lo, hi = 0.0, 1.0
    while t_cdf(hi, df) < p:
        lo, hi = hi, 2.0 * hi
        if hi > 1e12:
            raise ArithmeticError(f"t quantile out of range (p={p}, df={df})")
    for _ in range(200):
        mid = 0.5 * (lo + hi)
        if t_cdf(mid, df) < p:
            lo = mid
        else:
            hi = mid
        if hi - lo <= 1e-12 * max(1.0, hi):
            break
    return 0.5 * (lo + hi)


def clean(values) -> list[float]:
    """``values`` without None and NaN, as floats."""
    return [float(v) for v in values if v is not None and not math.isnan(float(v))]


def mean_ci(values, level: float = 0.95) -> tuple[float, float]:
    """Mean and half-width of the two-sided ``level`` t-interval (nan half-width for one value)."""
    vals = clean(values)
    if not vals:
        return float("nan"), float("nan")
    m = sum(vals) / len(vals)
    if len(vals) < 2:
        return m, float("nan")
    sd = math.sqrt(sum((v - m) ** 2 for v in vals) / (len(vals) - 1))
    return m, t_quantile(0.5 + level / 2.0, len(vals) - 1) * sd / math.sqrt(len(vals))


def equivalence(m: float, h: float, margin: float) -> str:
    """TOST verdict from a mean difference ``m`` and its interval half-width ``h``: ``equivalent`` when the
    whole interval lies inside ``±margin``, ``not equivalent`` when it lies wholly outside, else
    ``inconclusive``; ``one seed`` without an interval."""
    if math.isnan(m):
        return "not measured"
    if math.isnan(h):
        return "one seed"
    if -margin < m - h and m + h < margin:
        return "equivalent"
    if m - h >= margin or m + h <= -margin:
        return "not equivalent"
    return "inconclusive"
