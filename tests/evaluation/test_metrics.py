"""Hand-checked tests of ``tandem_rlvr.evaluation.metrics`` (pure arithmetic; no models)."""

from __future__ import annotations

import math

import pytest
import torch

from tandem_rlvr.evaluation import metrics as M
from tandem_rlvr.evaluation.metrics import mean_pass_at_k, pass_at_ks


def closed_form(n: int, c: int, k: int) -> float:
    """Chen et al. (2021): pass@k = 1 - C(n - c, k) / C(n, k)."""
    return 1.0 - math.comb(n - c, k) / math.comb(n, k)


@pytest.mark.parametrize("n", range(1, 13))
def test_pass_at_k_matches_closed_form(n):
    for c in range(n + 1):
        for k in range(1, n + 1):
            assert M.pass_at_k(n, c, k) == pytest.approx(closed_form(n, c, k), abs=1e-12), (n, c, k)


def test_pass_at_k_hand_cases():
    assert M.pass_at_k(8, 0, 1) == 0.0
    assert M.pass_at_k(8, 8, 8) == 1.0
    assert M.pass_at_k(2, 1, 1) == 0.5
    assert M.pass_at_k(2, 1, 2) == 1.0          # n - c = 1 < k = 2: some draw of 2 always has the correct one
    assert M.pass_at_k(4, 1, 2) == pytest.approx(0.5)       # 1 - C(3,2)/C(4,2) = 1 - 3/6
    assert M.pass_at_k(8, 2, 4) == pytest.approx(1 - 15 / 70)  # 1 - C(6,4)/C(8,4)
    assert M.pass_at_k(8, 3, 1) == pytest.approx(3 / 8)     # pass@1 = c / n
    # large n stays exact and finite (the product form never builds huge binomials)
    assert M.pass_at_k(1000, 10, 100) == pytest.approx(closed_form(1000, 10, 100), rel=1e-10)


@pytest.mark.parametrize("n,c,k", [(4, 1, 5), (1, 0, 2), (8, 3, 9), (3, 1, 0), (3, 4, 1), (3, -1, 1), (0, 0, 1)])
def test_pass_at_k_rejects_bad_arguments(n, c, k):
    with pytest.raises(ValueError):
        M.pass_at_k(n, c, k)


def test_mean_pass_at_ks_and_k_filter():
    rewards = [[1, 0, 0, 0], [1.0, 1.0, 1.0, 1.0], [0, 0, 0, 0]]
    out = M.pass_at_ks(rewards, (1, 2, 4, 8))
    assert sorted(out) == [1, 2, 4]                     # k = 8 > n = 4 is left out, not estimated
    assert out[1] == pytest.approx((0.25 + 1 + 0) / 3)
    assert out[2] == pytest.approx((0.5 + 1 + 0) / 3)   # problem 1: 1 - C(3,2)/C(4,2) = 0.5
    assert out[4] == pytest.approx((1 + 1 + 0) / 3)
    with pytest.raises(ValueError):
        M.mean_pass_at_k(rewards, 5)
    # a sample is correct when reward >= 0.5
    assert M.mean_pass_at_k([[0.4, 0.6]], 1) == 0.5


def test_std_error():
    assert M.std_error([1.0]) == 0.0
    # values 0, 1: mean 0.5, unbiased var 0.5, se = sqrt(0.5 / 2) = 0.5
    assert M.std_error([0.0, 1.0]) == pytest.approx(0.5)


def test_token_scores_by_hand():
    # junior logits ln([0.5, 0.25, 0.25]) -> target 1: CE = ln 4, top-1 wrong; target 0: CE = ln 2, top-1 right
    lj = torch.log(torch.tensor([[0.5, 0.25, 0.25], [0.5, 0.25, 0.25]]))
    ls = torch.log(torch.tensor([[0.25, 0.5, 0.25], [0.25, 0.5, 0.25]]))
    s = M.token_scores(lj, torch.tensor([1, 0]), ls)
    torch.testing.assert_close(s["ce"], torch.tensor([math.log(4), math.log(2)]))
    torch.testing.assert_close(s["top1"], torch.tensor([0.0, 1.0]))
    # MC: log p_s(t) - log p_j(t) = ln(0.5/0.25), ln(0.25/0.5)
    torch.testing.assert_close(s["kl_mc"], torch.tensor([math.log(2), -math.log(2)]))
    # exact: 0.25 ln(0.25/0.5) + 0.5 ln(0.5/0.25) + 0.25 ln 1 = 0.25 ln 2
    torch.testing.assert_close(s["kl_exact"], torch.full((2,), 0.25 * math.log(2)))
    assert set(M.token_scores(lj, torch.tensor([1, 0]))) == {"ce", "top1"}


def test_kl_full_self_zero_and_zero_probabilities():
    x = torch.randn(5, 7)
    assert torch.allclose(M.kl_full(x, x), torch.zeros(5), atol=1e-6)
    p = torch.tensor([[0.0, float("-inf"), 1.0]])  # p puts no mass on the middle token
    q = torch.tensor([[0.0, 0.0, 0.0]])
    kl = M.kl_full(p, q)
    assert torch.isfinite(kl).all()
    # p = [1/(1+e), 0, e/(1+e)], q uniform: sum p ln(3 p)
    pv = torch.softmax(p, -1)[0]
    want = sum(float(v) * math.log(3 * float(v)) for v in pv if v > 0)
    assert float(kl) == pytest.approx(want, rel=1e-5)


def test_chain_means_and_deciles():
    values = torch.tensor([1.0, 3.0, 10.0, 2.0, 4.0, 6.0])
    chain = torch.tensor([0, 0, 1, 2, 2, 2])
    means = M.chain_means(values, chain, 4)
    assert means[:3].tolist() == [2.0, 10.0, 4.0]
    assert math.isnan(means[3])                       # chain 3 has no token
    # decile of position t in a chain of length L: floor(10 t / L)
    assert M.decile_index(torch.arange(10), torch.full((10,), 10)).tolist() == list(range(10))
    assert M.decile_index(torch.arange(3), torch.full((3,), 3)).tolist() == [0, 3, 6]
    pos = torch.tensor([0, 1, 0, 0, 1, 2])
    length = torch.tensor([2, 2, 1, 3, 3, 3])
    dec = M.per_chain_deciles(values, chain, pos, length, 3)
    assert dec.shape == (3, 10)
    assert dec[0, 0] == 1.0 and dec[0, 5] == 3.0 and dec[1, 0] == 10.0
    assert dec[2, 0] == 2.0 and dec[2, 3] == 4.0 and dec[2, 6] == 6.0
    assert int(torch.isfinite(dec).sum()) == 6


def test_macro_average():
    a = {"n_problems": 10, "n_samples": 8, "solo_pass@1": 0.5, "solo_pass@1_se": 0.3, "curve": {"1.0": 0.5, "0.5": 0.2},
         "junior_ce_by_decile": [1.0, float("nan")], "junior_ce": 2.0, "only_a": 1.0}
    b = {"n_problems": 30, "n_samples": 8, "solo_pass@1": 0.7, "solo_pass@1_se": 0.4, "curve": {"1.0": 0.7, "0.5": 0.4},
         "junior_ce_by_decile": [3.0, 5.0], "junior_ce": float("nan")}
    m = M.macro_average({"a": a, "b": b})
    assert m["n_benchmarks"] == 2 and m["n_problems"] == 40 and m["n_samples"] == 8
    assert m["solo_pass@1"] == pytest.approx(0.6)     # each benchmark counts once, not weighted by size
    assert m["solo_pass@1_se"] == pytest.approx(math.sqrt(0.3**2 + 0.4**2) / 2)
    assert m["curve"] == pytest.approx({"1.0": 0.6, "0.5": 0.3})
    assert m["junior_ce_by_decile"] == pytest.approx([2.0, 5.0])  # NaN (empty decile) skipped
    assert m["junior_ce"] == 2.0
    assert "only_a" not in m
    assert M.macro_average({}) == {}


def test_pass_at_k_counts_rewards_at_the_threshold_and_single_samples():
    assert mean_pass_at_k([[0.5, 0.0]], 1) == pytest.approx(0.5)  # reward == threshold is correct
    assert mean_pass_at_k([[1.0], [0.0], [1.0], [0.2]], 1) == pytest.approx(0.5)  # one sample per problem
    rewards = [[0.7, 0.2, 1.0], [0.7, 0.7, 0.0]]
    assert pass_at_ks(rewards, (1, 2), threshold=1.0) == pytest.approx({1: (1 / 3 + 0) / 2, 2: (2 / 3 + 0) / 2})
    assert pass_at_ks(rewards, (1,)) == pytest.approx({1: (2 / 3 + 2 / 3) / 2})


def test_macro_average_of_parts_read_back_where_a_number_with_no_data_is_null():
    """A finished part is strict JSON (NaN written as null) and read back for a resumed run: a None is a number
    with no data, skipped as NaN is, whichever benchmark holds it (first or not)."""
    a = {"junior_ce": None, "junior_ce_se": None, "junior_ce_by_decile": [None, 1.0], "curve": {"0.5": None}}
    b = {"junior_ce": 2.0, "junior_ce_se": 0.5, "junior_ce_by_decile": [3.0, 5.0], "curve": {"0.5": 0.4}}
    m = M.macro_average({"a": a, "b": b})
    assert m["junior_ce"] == 2.0 and m["junior_ce_by_decile"] == pytest.approx([3.0, 3.0])
    assert m["curve"] == pytest.approx({"0.5": 0.4}) and math.isnan(m["junior_ce_se"])
    assert M.macro_average({"a": a, "c": a})["junior_ce"] is None  # no benchmark has one
