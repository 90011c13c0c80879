"""Small statistics for reports over a few seeds, on ``scipy.stats``: the t-interval of a mean and a
two-one-sided-tests (TOST) equivalence verdict."""

from __future__ import annotations

import math
import warnings

from scipy import stats


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
    return m, float(stats.t.ppf(0.5 + level / 2.0, len(vals) - 1)) * sd / math.sqrt(len(vals))


def _p_value(vals: list[float], bound: float, alternative: str) -> float:
    """One-sided one-sample t test of the mean against ``bound`` (``greater``: H1 mean > bound)."""
    with warnings.catch_warnings():  # identical values: scipy warns, the statistic is +-inf (p = 0 or 1)
        warnings.simplefilter("ignore", RuntimeWarning)
        return float(stats.ttest_1samp(vals, bound, alternative=alternative).pvalue)


def equivalence(values, margin: float, level: float = 0.95) -> str:
    """TOST verdict on the mean of ``values`` (per-seed differences) against ``±margin``: ``equivalent`` when
    both one-sided tests (mean > -margin, mean < margin) reject at ``(1 - level) / 2``, i.e. the whole
    ``level`` t-interval lies inside ``±margin``; ``not equivalent`` when a one-sided test puts the mean
    beyond the margin at that level (the whole interval lies outside); else ``inconclusive``. ``one
    seed`` for one value (no interval), ``not measured`` for none."""
    vals = clean(values)
    if not vals:
        return "not measured"
    if len(vals) < 2:
        return "one seed"
    alpha = (1.0 - level) / 2.0
    if _p_value(vals, -margin, "greater") < alpha and _p_value(vals, margin, "less") < alpha:
        return "equivalent"
    if _p_value(vals, margin, "greater") <= alpha or _p_value(vals, -margin, "less") <= alpha:
        return "not equivalent"
    return "inconclusive"
