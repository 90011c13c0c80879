"""The engines' shared primitives (tandem_rlvr.engines.types): the per-step log-prob ``logp_of`` that every engine
records while sampling (and that ``token_logps`` applies row by row; its own tests: tests/training/test_core.py)."""

import math

import pytest
import torch

from tandem_rlvr.engines.types import logp_of, token_logps


def test_logp_of_by_hand_at_temperatures_one_and_a_half():
    # logits [0, ln 2, ln 5] -> softmax [1, 2, 5] / 8; at t = 0.5 the logits double: [1, 4, 25] / 30
    logits_BV = torch.tensor([[0.0, math.log(2), math.log(5)], [math.log(5), 0.0, math.log(2)]])
    tok_B = torch.tensor([1, 0])
    torch.testing.assert_close(logp_of(logits_BV, tok_B, 1.0), torch.tensor([math.log(2 / 8), math.log(5 / 8)]))
    torch.testing.assert_close(logp_of(logits_BV, tok_B, 0.5), torch.tensor([math.log(4 / 30), math.log(25 / 30)]))
    torch.testing.assert_close(logp_of(logits_BV, tok_B, 2.0),
                               torch.tensor([math.log(2 ** 0.5 / (1 + 2 ** 0.5 + 5 ** 0.5)),
                                             math.log(5 ** 0.5 / (1 + 2 ** 0.5 + 5 ** 0.5))]))


def test_greedy_decoding_records_the_temperature_one_log_prob():
    # t <= 0 means greedy sampling: the record is the model's own (t = 1) log-prob, finite, never a division by 0
    logits_BV = torch.randn(4, 9, generator=torch.Generator().manual_seed(0)) * 3
    tok_B = logits_BV.argmax(-1)
    ref = logp_of(logits_BV, tok_B, 1.0)
    for t in (0.0, -1.0):
        out = logp_of(logits_BV, tok_B, t)
        assert torch.isfinite(out).all()
        torch.testing.assert_close(out, ref)


def test_logp_of_takes_any_leading_shape_and_upcasts():
    # (B, W, V): a window of W positions per row (the engine's forced tokens); each position on its own
    g = torch.Generator().manual_seed(1)
    logits_BWV = torch.randn(2, 3, 7, generator=g) * 2
    tok_BW = torch.randint(0, 7, (2, 3), generator=g)
    for t in (1.0, 0.7):
        ref = torch.log_softmax(logits_BWV / t, -1).gather(-1, tok_BW.unsqueeze(-1)).squeeze(-1)
        torch.testing.assert_close(logp_of(logits_BWV, tok_BW, t), ref)
        torch.testing.assert_close(token_logps(logits_BWV, tok_BW, t), ref)  # the teacher-forced rows agree
    assert logp_of(logits_BWV.bfloat16(), tok_BW, 1.0).dtype == torch.float32


def test_draw_follows_the_probabilities_and_never_draws_a_zero():
    """Inverse-CDF sampling: 200,000 draws of each row match its probabilities within 5 standard errors,
    unnormalised rows are normalised, and a token of probability 0 (filtered by top-k / top-p) is never
    drawn, not even by a uniform at 0 or one that rounds up to the row's total."""
    from tandem_rlvr.engines.types import draw

    g = torch.Generator().manual_seed(0)
    probs = torch.tensor([[0.1, 0.2, 0.3, 0.4, 0.0], [0.0, 0.5, 0.0, 0.25, 0.25], [0.0, 0.0, 2.0, 0.0, 6.0]])
    n = 200_000
    picks = draw(probs.repeat(n, 1), g).view(n, 3)
    for r in range(3):
        want = probs[r] / probs[r].sum()
        got = torch.bincount(picks[:, r], minlength=5).double() / n
        se = torch.sqrt(want.double() * (1 - want.double()) / n)
        assert torch.all((got - want.double()).abs() <= 5 * se + 1e-12), (r, got, want)
        assert torch.all(got[want == 0] == 0)

    for u in (0.0, math.nextafter(1.0, 0.0), 1.0):  # the uniform's extremes (1.0: a product that rounds up)
        with pytest.MonkeyPatch.context() as mp:
            mp.setattr(torch, "rand", lambda *a, u=u, **kw: torch.full(a[:2], u, dtype=kw.get("dtype", torch.float32)))
            got = draw(probs, g)
        assert all(float(probs[b, int(got[b])]) > 0 for b in range(3)), (u, got)


def test_top_k_then_top_p_by_hand():
    """Probabilities .5 .3 .15 .05 (logits their logs, in shuffled order) and a fifth token below them: top_k 3
    drops the last two; the nucleus renormalises over the three kept (.526 .316 .158): top_p .7 keeps the smallest
    prefix reaching .7, the first two; top_p .85 all three (.842 before the third)."""
    from tandem_rlvr.engines.types import _filter_logits, _top_k_nucleus

    logits = torch.tensor([[math.log(0.3), math.log(0.15), math.log(0.5), -9.0, math.log(0.05)]])
    inf = float("-inf")
    assert not bool(_top_k_nucleus(logits, 3, 0.7)[1].any())  # no tie: decided without the sort
    assert torch.equal(_filter_logits(logits, 3, 0.7), torch.tensor([[math.log(0.3), inf, math.log(0.5), inf, inf]]))
    assert torch.equal(_filter_logits(logits, 3, 0.85),
                       torch.tensor([[math.log(0.3), math.log(0.15), math.log(0.5), inf, inf]]))


def test_rows_a_tie_could_decide_are_left_to_the_sort():
    """Probabilities .5 .3 .1 .1 and a fifth below: top_k 3 keeps the fourth too (it ties the third), so that row
    is left to the sort, which keeps the first two at top_p .7. At top_k 4 and top_p .85 the nucleus would keep
    one of the tied pair, which one being the order of equal logits: left to the sort too. A row of equal logits
    (a finished row) is left to it; a row without ties beside them is not."""
    from tandem_rlvr.engines.types import _filter_full, _filter_logits, _top_k_nucleus

    tied = [math.log(0.1), math.log(0.3), math.log(0.5), -9.0, math.log(0.1)]
    plain = [math.log(0.3), math.log(0.15), math.log(0.5), -9.0, math.log(0.05)]
    logits = torch.tensor([tied, [0.0] * 5, plain])
    inf = float("-inf")
    assert _top_k_nucleus(logits, 3, 0.7)[1].tolist() == [True, True, False]
    assert _top_k_nucleus(logits, 4, 0.85)[1].tolist() == [True, True, False]
    assert _top_k_nucleus(logits, 4, 0.7)[1].tolist() == [False, True, False]  # the tied pair is dropped whole
    for k, p in ((3, 0.7), (4, 0.85), (4, 0.7)):
        assert torch.equal(_filter_logits(logits, k, p), _filter_full(logits, k, p)), (k, p)
    assert torch.equal(_filter_logits(logits, 3, 0.7)[0], torch.tensor([inf, math.log(0.3), math.log(0.5), inf, inf]))


@pytest.mark.parametrize("top_k,top_p", [(20, 0.8), (5, 0.3), (50, 0.95), (20, 0.999), (1, 0.5)])
def test_the_top_k_first_nucleus_keeps_what_the_full_sort_keeps(top_k, top_p):
    """The sampler's nucleus over the top-k values alone equals the nucleus over a sort of the whole vocabulary:
    on random logits, on rounded ones (ties: the rows a tie could decide are sorted) and at several scales."""
    from tandem_rlvr.engines.types import _filter_full, _filter_logits, _top_k_nucleus

    g = torch.Generator().manual_seed(top_k)
    decided = rows = 0
    for trial in range(60):
        x = torch.randn(16, 300, generator=g) * (0.5 + trial / 10)
        if trial % 3 == 0:
            x = x.round()
        decided += int((~_top_k_nucleus(x, top_k, top_p)[1]).sum())
        rows += len(x)
        assert torch.equal(_filter_logits(x, top_k, top_p), _filter_full(x, top_k, top_p)), trial
    assert rows // 2 <= decided < rows  # most rows decided over the top k, some left to the sort
