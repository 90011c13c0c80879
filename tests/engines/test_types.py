"""The engines' shared primitives (tandem_rlvr.engines.types): the per-step log-prob ``logp_of`` that every engine
records while sampling (and that ``token_logps`` applies row by row; its own tests: tests/training/test_core.py)."""

import math

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
