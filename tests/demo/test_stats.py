"""Student-t quantiles (checked against printed tables), t-intervals and the equivalence verdict."""

import math

import pytest

from tandem_rlvr.demo.stats import betainc, equivalence, mean_ci, t_cdf, t_quantile

# two-sided 95% (0.975 quantile) and 99% (0.995) values from a printed Student-t table
T975 = {1: 12.706, 2: 4.303, 3: 3.182, 4: 2.776, 5: 2.571, 6: 2.447, 7: 2.365, 8: 2.306, 9: 2.262, 10: 2.228,
        11: 2.201, 12: 2.179, 15: 2.131, 20: 2.086, 25: 2.060, 30: 2.042, 40: 2.021, 60: 2.000, 120: 1.980}
T995 = {1: 63.657, 2: 9.925, 4: 4.604, 10: 3.169, 30: 2.750}
T95 = {1: 6.314, 5: 2.015, 20: 1.725}


@pytest.mark.parametrize("table,p", [(T975, 0.975), (T995, 0.995), (T95, 0.95)])
def test_t_quantile_matches_printed_tables(table, p):
    for df, ref in table.items():
        assert t_quantile(p, df) == pytest.approx(ref, abs=6e-4), df


def test_t_quantile_tends_to_the_normal_and_is_symmetric():
    assert t_quantile(0.975, 1e7) == pytest.approx(1.959964, abs=1e-4)
    assert t_quantile(0.025, 7) == pytest.approx(-t_quantile(0.975, 7), abs=1e-10)
    assert t_quantile(0.5, 3) == pytest.approx(0.0, abs=1e-9)
    for df in (1, 3, 17):
        for p in (0.6, 0.9, 0.999):
            assert t_cdf(t_quantile(p, df), df) == pytest.approx(p, abs=1e-10)


def test_betainc_closed_forms():
    assert betainc(1, 1, 0.3) == pytest.approx(0.3)  # uniform
    assert betainc(2, 1, 0.3) == pytest.approx(0.09)  # x^a for b = 1
    assert betainc(0.5, 0.5, 0.5) == pytest.approx(0.5)  # arcsine, symmetric
    assert betainc(3, 2, 0.8) + betainc(2, 3, 0.2) == pytest.approx(1.0)
    with pytest.raises(ValueError, match="0 <= x <= 1"):
        betainc(1, 1, 1.5)


def test_mean_ci_uses_the_t_quantile_of_its_degrees_of_freedom():
    vals = [1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0, 9.0, 10.0, 11.0, 12.0]  # df = 11 (no 1.96 fall-back)
    m, h = mean_ci(vals)
    sd = math.sqrt(sum((v - 6.5) ** 2 for v in vals) / 11)
    assert m == 6.5 and h == pytest.approx(2.201 * sd / math.sqrt(12), rel=1e-3)
    assert math.isnan(mean_ci([3.0])[1]) and math.isnan(mean_ci([])[0])
    assert mean_ci([1.0, float("nan"), 3.0])[0] == 2.0


def test_equivalence_needs_the_whole_interval_inside_the_margin():
    assert equivalence(-10.0, 15.0, 5.0) == "inconclusive"  # a noisy -10 ± 15 is not "the same"
    assert equivalence(1.0, 3.0, 5.0) == "equivalent"
    assert equivalence(1.0, 4.5, 5.0) == "inconclusive"
    assert equivalence(-9.0, 3.0, 5.0) == "not equivalent"
    assert equivalence(2.0, float("nan"), 5.0) == "one seed"
