"""t-intervals (their quantiles checked against printed tables) and the TOST equivalence verdict."""

import math
import random

import pytest
from scipy import stats

from tandem_rlvr.demo.stats import equivalence, mean_ci

# two-sided 95% (0.975 quantile) and 99% (0.995) values from a printed Student-t table
T975 = {1: 12.706, 2: 4.303, 3: 3.182, 4: 2.776, 5: 2.571, 6: 2.447, 7: 2.365, 8: 2.306, 9: 2.262, 10: 2.228,
        11: 2.201, 12: 2.179, 15: 2.131, 20: 2.086, 25: 2.060, 30: 2.042, 40: 2.021, 60: 2.000, 120: 1.980}
T995 = {1: 63.657, 2: 9.925, 4: 4.604, 10: 3.169, 30: 2.750}
T95 = {1: 6.314, 5: 2.015, 20: 1.725}


def _quantile(vals: list[float], level: float) -> float:
    """The t quantile inside ``mean_ci``'s half-width: half-width / standard error."""
    m, h = mean_ci(vals, level)
    sd = math.sqrt(sum((v - m) ** 2 for v in vals) / (len(vals) - 1))
    return h / (sd / math.sqrt(len(vals)))


@pytest.mark.parametrize("table,level", [(T975, 0.95), (T995, 0.99), (T95, 0.90)])
def test_interval_quantiles_match_printed_tables(table, level):
    for df, ref in table.items():
        assert _quantile([float(i) for i in range(df + 1)], level) == pytest.approx(ref, abs=6e-4), df


def test_interval_quantiles_tend_to_the_normal_and_cover_exactly():
    assert _quantile([float(i % 7) for i in range(100_001)], 0.95) == pytest.approx(1.959964, abs=1e-4)
    for df in (1, 3, 17):
        for p in (0.6, 0.9, 0.999):  # the half-width's quantile has exactly the two-sided coverage asked for
            assert stats.t.cdf(_quantile([float(i * i) for i in range(df + 1)], 2 * p - 1), df) == pytest.approx(p, abs=1e-10)


def test_mean_ci_uses_the_t_quantile_of_its_degrees_of_freedom():
    vals = [1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0, 9.0, 10.0, 11.0, 12.0]  # df = 11 (no 1.96 fall-back)
    m, h = mean_ci(vals)
    sd = math.sqrt(sum((v - 6.5) ** 2 for v in vals) / 11)
    assert m == 6.5 and h == pytest.approx(2.201 * sd / math.sqrt(12), rel=1e-3)
    assert math.isnan(mean_ci([3.0])[1]) and math.isnan(mean_ci([])[0])
    assert mean_ci([1.0, float("nan"), 3.0])[0] == 2.0


def _sample(m: float, h: float) -> list[float]:
    """Two values whose mean is ``m`` and whose 95% t-interval has half-width ``h``."""
    d = h / stats.t.ppf(0.975, 1)
    return [m - d, m + d]


def test_equivalence_needs_the_whole_interval_inside_the_margin():
    for (m, h), verdict in (((-10.0, 15.0), "inconclusive"),  # a noisy -10 ± 15 is not "the same"
                            ((1.0, 3.0), "equivalent"),
                            ((1.0, 4.5), "inconclusive"),
                            ((-9.0, 3.0), "not equivalent")):
        vals = _sample(m, h)
        assert mean_ci(vals) == pytest.approx((m, h))
        assert equivalence(vals, 5.0) == verdict, (m, h)
    assert equivalence([2.0], 5.0) == "one seed" and equivalence([2.0, float("nan")], 5.0) == "one seed"
    assert equivalence([], 5.0) == "not measured"
    assert equivalence([1.0, 1.0, 1.0], 5.0) == "equivalent" and equivalence([7.0, 7.0], 5.0) == "not equivalent"


def test_the_two_one_sided_tests_agree_with_the_interval_rule():
    """TOST at (1 - level) / 2 per side decides as the ``level`` interval does: inside the margin, outside, or across."""
    rng = random.Random(0)
    for _ in range(500):
        vals = [rng.gauss(rng.uniform(-8, 8), rng.uniform(0.1, 6)) for _ in range(rng.randint(2, 8))]
        m, h = mean_ci(vals)
        rule = ("equivalent" if -5 < m - h and m + h < 5 else
                "not equivalent" if m - h >= 5 or m + h <= -5 else "inconclusive")
        assert equivalence(vals, 5.0) == rule, vals
