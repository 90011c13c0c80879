"""Hand-computed checks of ``tandem_rlvr.training.core`` (the arithmetic is written out next to each number)."""

from __future__ import annotations

import math

import pytest
import torch

from tandem_rlvr.training.core import (
    LOSS_TYPES,
    aggregate,
    group_advantages,
    k3_kl,
    masked_mean,
    merge_metrics,
    policy_loss,
    token_logps,
)

LN = math.log

# ---------------------------------------------------------------------------------------------------------------
# group_advantages: 2 groups x 3 rollouts
# ---------------------------------------------------------------------------------------------------------------


def test_group_advantages_by_hand():
    rewards = torch.tensor([1.0, 0.0, 0.0, 2.0, 4.0, 6.0])
    adv, metrics = group_advantages(rewards, 3, eps=0.0)
    # group 1 = [1, 0, 0]: mean 1/3; unbiased var = ((2/3)^2 + 2 * (1/3)^2) / (3 - 1) = (6/9) / 2 = 1/3
    #   std = 1/sqrt(3); A = (2/3) * sqrt(3) = 1.154700..., (-1/3) * sqrt(3) = -0.577350...
    # group 2 = [2, 4, 6]: mean 4; unbiased var = (4 + 0 + 4) / 2 = 4, std = 2; A = [-1, 0, 1]
    s3 = math.sqrt(3.0)
    expected = torch.tensor([2 / 3 * s3, -1 / 3 * s3, -1 / 3 * s3, -1.0, 0.0, 1.0])
    torch.testing.assert_close(adv, expected)
    assert metrics["train/frac_zero_std_groups"] == 0.0
    # batch mean = 13/6; deviations (-7, -13, -13, -1, 11, 23)/6, squares sum 1038/36; unbiased var = 1038/36/5
    assert metrics["reward/mean"] == pytest.approx(13 / 6)
    assert metrics["reward/std"] == pytest.approx(math.sqrt(1038 / 36 / 5))
    assert all(isinstance(v, float) for v in metrics.values())


def test_group_advantages_eps_and_dr_grpo():
    rewards = torch.tensor([1.0, 0.0, 0.0, 2.0, 4.0, 6.0])
    adv, _ = group_advantages(rewards, 3, eps=1.0)
    # group 2: (r - 4) / (2 + 1) = [-2/3, 0, 2/3]
    torch.testing.assert_close(adv[3:], torch.tensor([-2 / 3, 0.0, 2 / 3]))
    adv, _ = group_advantages(rewards, 3, normalize_std=False)
    # Dr. GRPO: r - mean only
    torch.testing.assert_close(adv, torch.tensor([2 / 3, -1 / 3, -1 / 3, -2.0, 0.0, 2.0]))
    # integer rewards are accepted (cast to float)
    adv_int, _ = group_advantages(torch.tensor([1, 0, 0, 1]), 2)
    assert adv_int.dtype == torch.float32


def test_all_equal_rewards_zero_advantage_finite_loss():
    rewards = torch.tensor([1.0, 1.0, 1.0, 0.0, 0.0, 0.0])
    adv, metrics = group_advantages(rewards, 3)
    assert torch.equal(adv, torch.zeros(6))  # 0 / (0 + eps) == 0 exactly, no NaN
    assert metrics["train/frac_zero_std_groups"] == 1.0
    logps = torch.randn(6, 4, requires_grad=True)
    for loss_type in LOSS_TYPES:
        loss, m = policy_loss(logps, logps.detach() - 0.1, adv, torch.ones(6, 4), loss_type=loss_type)
        loss.backward()
        assert torch.isfinite(loss) and loss.item() == 0.0
        assert torch.isfinite(logps.grad).all()
        assert all(math.isfinite(v) for v in m.values())
        logps.grad = None


def test_mixed_groups_frac_zero_std():
    _, metrics = group_advantages(torch.tensor([1.0, 1.0, 0.0, 1.0, 0.5, 0.5, 0.5, 0.5]), 4)
    assert metrics["train/frac_zero_std_groups"] == 0.5


@pytest.mark.parametrize(
    "rewards,group_size,match",
    [
        (torch.zeros(5), 2, "multiple"),
        (torch.zeros(4), 1, ">= 2"),
        (torch.zeros(2, 2), 2, "1-D"),
        (torch.tensor([1.0, float("nan")]), 2, "NaN"),
    ],
)
def test_group_advantages_validation(rewards, group_size, match):
    with pytest.raises(ValueError, match=match):
        group_advantages(rewards, group_size)


# ---------------------------------------------------------------------------------------------------------------
# token_logps, k3
# ---------------------------------------------------------------------------------------------------------------


def test_token_logps_by_hand_and_vs_log_softmax():
    # logits [0, ln 2, ln 5] -> softmax = [1, 2, 5] / 8; chosen token 1 -> ln(2/8) = ln 0.25
    logits = torch.tensor([[[0.0, LN(2), LN(5)]]])
    out = token_logps(logits, torch.tensor([[1]]))
    torch.testing.assert_close(out, torch.tensor([[LN(0.25)]]))
    # temperature 0.5 doubles the logits: [0, ln 4, ln 25] -> token 2: ln(25 / 30)
    out = token_logps(logits, torch.tensor([[2]]), temperature=0.5)
    torch.testing.assert_close(out, torch.tensor([[LN(25 / 30)]]))

    g = torch.Generator().manual_seed(0)
    logits = torch.randn(3, 5, 11, generator=g) * 4
    ids = torch.randint(0, 11, (3, 5), generator=g)
    for temp in (1.0, 0.7):
        ref = torch.log_softmax(logits / temp, dim=-1).gather(-1, ids.unsqueeze(-1)).squeeze(-1)
        torch.testing.assert_close(token_logps(logits, ids, temperature=temp), ref)
    out = token_logps(logits.bfloat16(), ids)
    assert out.dtype == torch.float32  # rows are upcast before the logsumexp


def test_token_logps_gradient_and_validation():
    logits = torch.randn(2, 3, 7, requires_grad=True)
    ids = torch.randint(0, 7, (2, 3))
    token_logps(logits, ids).sum().backward()
    ref_logits = logits.detach().clone().requires_grad_(True)
    torch.log_softmax(ref_logits, -1).gather(-1, ids.unsqueeze(-1)).sum().backward()
    torch.testing.assert_close(logits.grad, ref_logits.grad)
    with pytest.raises(ValueError, match="must be"):
        token_logps(logits, ids[:, :2])
    with pytest.raises(ValueError, match="temperature"):
        token_logps(logits, ids, temperature=0.0)


def test_k3_by_hand():
    p = torch.tensor([[LN(0.5), LN(0.25), LN(0.3)]])
    q = torch.tensor([[LN(0.25), LN(0.5), LN(0.3)]])
    kl = k3_kl(p, q)
    # q - p = ln 0.5: 0.5 - ln 0.5 - 1 = 0.5 + 0.693147 - 1 = 0.193147
    # q - p = ln 2:   2 - ln 2 - 1   = 2 - 0.693147 - 1  = 0.306853
    # p == q: 1 - 0 - 1 = 0
    torch.testing.assert_close(kl, torch.tensor([[0.5 - LN(0.5) - 1, 2 - LN(2) - 1, 0.0]]))
    assert (k3_kl(torch.randn(4, 5), torch.randn(4, 5)) >= 0).all()


def test_k3_is_clamped_to_10_as_verl_low_var_kl():
    """verl/trainer/ppo/core_algos.py kl_penalty("low_var_kl"): q - p clamped to [-20, 20], k3 to [-10, 10]
    (``clamp=10``, the paper configs' algo.kl_clamp); without a clamp, the plain k3."""
    q0 = torch.tensor([[3.0, -12.0]])
    torch.testing.assert_close(k3_kl(torch.zeros(1, 2), q0), torch.tensor([[math.exp(3) - 4, math.exp(-12) + 11]]))
    p = torch.zeros(1, 4, requires_grad=True)
    q = torch.tensor([[2.0, 3.0, -12.0, 200.0]])
    kl = k3_kl(p, q, clamp=10.0)
    # q - p = 2:   e^2 - 2 - 1 = 7.389056 - 3 = 4.389056 (below 10: unclamped)
    # q - p = 3:   e^3 - 3 - 1 = 20.085537 - 4 = 16.085537 -> 10
    # q - p = -12: e^-12 + 12 - 1 = 11.000006 -> 10
    # q - p = 200: clamped to 20 first (e^200 overflows float32), e^20 - 21 -> 10
    torch.testing.assert_close(kl, torch.tensor([[math.exp(2) - 3, 10.0, 10.0, 10.0]]), rtol=1e-6, atol=1e-6)
    kl.sum().backward()
    # d/dp k3 = 1 - e^(q - p) where unclamped (1 - e^2 = -6.389056), 0 where the clamp holds, never NaN
    torch.testing.assert_close(p.grad, torch.tensor([[1 - math.exp(2), 0.0, 0.0, 0.0]]), rtol=1e-6, atol=1e-6)


def test_k3_log_ratio_is_clamped_from_below_too():
    """With a clamp wider than 19 the log-ratio's own floor (-20) shows: q - p = -50 gives e^-20 + 20 - 1, not 49."""
    kl = k3_kl(torch.tensor([[50.0, 0.0]]), torch.tensor([[0.0, 0.0]]), clamp=100.0)
    torch.testing.assert_close(kl, torch.tensor([[math.exp(-20) + 19.0, 0.0]]))


def test_policy_loss_passes_kl_clamp_to_k3():
    """kl_reg's per-token k3 in the loss is clamped by ``kl_clamp``: one token with q - p = 3 adds beta * 1.0 (the
    clamp), not beta * (e^3 - 4), to a loss whose policy term is 0 (advantage 0)."""
    logps = torch.zeros(1, 2)
    ref = torch.tensor([[3.0, 0.0]])
    kw = dict(loss_type="dapo", clip_eps=0.2, kl_beta=0.5, ref_logps_BT=ref)
    clamped, _ = policy_loss(logps, logps, torch.zeros(1), torch.ones(1, 2, dtype=torch.bool), kl_clamp=1.0, **kw)
    plain, _ = policy_loss(logps, logps, torch.zeros(1), torch.ones(1, 2, dtype=torch.bool), **kw)
    torch.testing.assert_close(clamped, torch.tensor(0.5 * 1.0 / 2))
    torch.testing.assert_close(plain, torch.tensor(0.5 * (math.exp(3) - 4) / 2))


# ---------------------------------------------------------------------------------------------------------------
# aggregate
# ---------------------------------------------------------------------------------------------------------------

V = torch.tensor([[1.0, 2.0, 3.0, 4.0], [5.0, 6.0, 7.0, 8.0]])
M = torch.tensor([[1, 1, 0, 0], [0, 1, 1, 1]])


def test_aggregate_by_hand():
    # grpo: row 1 (1 + 2) / 2 = 1.5; row 2 (6 + 7 + 8) / 3 = 7; mean = 4.25
    assert aggregate(V, M, "grpo").item() == pytest.approx(4.25)
    # dapo / token_mean: (3 + 21) / 5 tokens = 4.8; global count 12 -> 24 / 12 = 2
    for name in ("dapo", "token_mean"):
        assert aggregate(V, M, name).item() == pytest.approx(4.8)
        assert aggregate(V, M, name, num_tokens=12).item() == pytest.approx(2.0)
        assert aggregate(V, M, name, num_tokens=torch.tensor(12)).item() == pytest.approx(2.0)
    # dr_grpo: 24 / (B=2 * T=4) = 3; max_len 6 -> 24 / 12 = 2
    assert aggregate(V, M, "dr_grpo").item() == pytest.approx(3.0)
    assert aggregate(V, M, "dr_grpo", max_len=6).item() == pytest.approx(2.0)
    # grpo with an empty row (TRL: count clamped to 1, row still counts in the batch mean): (1.5 + 0) / 2
    M_empty_row = torch.tensor([[1, 1, 0, 0], [0, 0, 0, 0]])
    assert aggregate(V, M_empty_row, "grpo").item() == pytest.approx(0.75)
    # bool masks work the same
    assert aggregate(V, M.bool(), "grpo").item() == pytest.approx(4.25)
    # masked_mean = token mean
    assert masked_mean(V, M).item() == pytest.approx(4.8)


def test_dapo_global_count_micro_batches_add_up():
    """Two micro-batches normalised by the global token count sum to the full-batch token mean."""
    g = torch.Generator().manual_seed(0)
    values = torch.randn(4, 6, generator=g)
    mask = (torch.rand(4, 6, generator=g) < 0.6).long()
    mask[:, 0] = 1
    full = aggregate(values, mask, "dapo")
    n = mask.sum()
    first = aggregate(values[:2], mask[:2], "dapo", num_tokens=n)
    second = aggregate(values[2:], mask[2:], "dapo", num_tokens=n)
    torch.testing.assert_close(first + second, full)


def test_aggregate_errors():
    with pytest.raises(ValueError, match="grpo, dapo, token_mean, dr_grpo"):
        aggregate(V, M, "bnpo")
    with pytest.raises(ValueError, match="all zero"):
        aggregate(V, torch.zeros_like(M), "dapo")
    with pytest.raises(ValueError, match="shape"):
        aggregate(V, M[:, :3], "grpo")
    with pytest.raises(ValueError, match="binary"):
        aggregate(V, M * 0.5, "grpo")
    with pytest.raises(ValueError, match="num_tokens"):
        aggregate(V, M, "dapo", num_tokens=0)
    with pytest.raises(ValueError, match="max_len"):
        aggregate(V, M, "dr_grpo", max_len=0)
    with pytest.raises(ValueError, match="all zero"):
        masked_mean(V, torch.zeros_like(M))
    assert LOSS_TYPES == ("grpo", "dapo", "token_mean", "dr_grpo")


# ---------------------------------------------------------------------------------------------------------------
# policy_loss: clipping
# ---------------------------------------------------------------------------------------------------------------


def _one_token(ratio: float, adv: float, **kw):
    """Single-token policy loss with the given ratio; returns (loss, d loss / d logp, metrics)."""
    logp = torch.tensor([[0.0]], requires_grad=True)
    old = torch.tensor([[-LN(ratio)]])  # exp(0 - old) = ratio
    loss, metrics = policy_loss(logp, old, torch.tensor([adv]), torch.ones(1, 1), **kw)
    loss.backward()
    return loss.item(), logp.grad.item(), metrics


@pytest.mark.parametrize(
    "ratio,adv,loss,grad,clipped",
    [
        # r = 1.5, A = +1: min(1.5, clip->1.2) = 1.2 -> loss -1.2, clipped branch is constant -> grad 0
        (1.5, 1.0, -1.2, 0.0, True),
        # r = 1.5, A = -1: min(-1.5, -1.2) = -1.5 -> loss 1.5, unclipped: d(-r A)/dlogp = -A r = 1.5
        (1.5, -1.0, 1.5, 1.5, False),
        # r = 1.1, A = +1: inside [0.8, 1.2] -> loss -1.1, grad -A r = -1.1
        (1.1, 1.0, -1.1, -1.1, False),
        # r = 0.5, A = -1: min(-0.5, clip->-0.8) = -0.8 -> loss 0.8, clipped -> grad 0
        (0.5, -1.0, 0.8, 0.0, True),
        # r = 0.5, A = +1: min(0.5, 0.8) = 0.5 -> loss -0.5 (pessimistic, not clipped), grad -0.5
        (0.5, 1.0, -0.5, -0.5, False),
    ],
)
def test_clipping_by_hand(ratio, adv, loss, grad, clipped):
    got_loss, got_grad, metrics = _one_token(ratio, adv, clip_eps=0.2)
    assert got_loss == pytest.approx(loss, abs=1e-6)
    assert got_grad == pytest.approx(grad, abs=1e-6)
    assert metrics["train/clip_frac"] == (1.0 if clipped else 0.0)
    assert metrics["train/ratio_mean"] == pytest.approx(ratio, rel=1e-6)
    assert metrics["train/num_tokens"] == 1.0


def test_asymmetric_eps_high():
    # r = 1.25, A = +1: symmetric eps 0.2 clips at 1.2 -> loss -1.2, grad 0
    loss, grad, m = _one_token(1.25, 1.0, clip_eps=0.2)
    assert (loss, grad, m["train/clip_frac_high"]) == (pytest.approx(-1.2), 0.0, 1.0)
    # eps_high 0.28 -> upper bound 1.28 > 1.25: loss -1.25, grad -1.25, not clipped
    loss, grad, m = _one_token(1.25, 1.0, clip_eps=0.2, clip_eps_high=0.28)
    assert (loss, grad, m["train/clip_frac"]) == (pytest.approx(-1.25), pytest.approx(-1.25), 0.0)
    # the low side stays at 1 - 0.2: r = 0.75, A = -1: min(-0.75, -0.8) = -0.8 -> loss 0.8, clipped low
    loss, grad, m = _one_token(0.75, -1.0, clip_eps=0.2, clip_eps_high=0.28)
    assert (loss, grad, m["train/clip_frac_low"]) == (pytest.approx(0.8), 0.0, 1.0)


def test_clip_frac_and_losses_on_a_batch():
    # tokens (ratio, A): (1.5,+1) clipped high, (1.0,+1) not, (0.5,-1) clipped low, (1.5,-1) not; mask all
    ratio = torch.tensor([[1.5, 1.0], [0.5, 1.5]])
    logps = torch.zeros(2, 2)
    adv = torch.tensor([1.0, -1.0])
    loss, m = policy_loss(logps, -ratio.log(), adv, torch.ones(2, 2), loss_type="dapo")
    # per token: -1.2, -1.0, 0.8, 1.5 -> token mean = 0.1 / 4 = 0.025
    assert loss.item() == pytest.approx(0.025, abs=1e-6)
    assert m["train/clip_frac"] == 0.5 and m["train/clip_frac_low"] == 0.25 and m["train/clip_frac_high"] == 0.25
    assert m["train/ratio_mean"] == pytest.approx(1.125)  # (1.5 + 1 + 0.5 + 1.5) / 4
    assert m["train/pg_loss"] == pytest.approx(m["train/loss"])
    assert "kl/policy_ref" not in m


def test_kl_term_by_hand():
    # ratio 1 and A = 0: the surrogate is 0, the loss is beta * k3 = 0.1 * (0.5 - ln 0.5 - 1) per token
    logps = torch.full((1, 2), LN(0.5))
    ref = torch.full((1, 2), LN(0.25))
    loss, m = policy_loss(logps, logps, torch.zeros(1), torch.ones(1, 2), kl_beta=0.1, ref_logps_BT=ref)
    k3 = 0.5 - LN(0.5) - 1
    assert loss.item() == pytest.approx(0.1 * k3, abs=1e-7)
    assert m["kl/policy_ref"] == pytest.approx(k3, abs=1e-7)
    assert m["train/pg_loss"] == pytest.approx(0.0, abs=1e-7)
    # with kl_beta = 0 a given reference is only logged
    loss, m = policy_loss(logps, logps, torch.zeros(1), torch.ones(1, 2), ref_logps_BT=ref)
    assert loss.item() == 0.0 and m["kl/policy_ref"] == pytest.approx(k3, abs=1e-7)
    # IS-corrected KL: ratio r = 2 (old = p - ln 2): r * k3 with A = 0
    loss, _ = policy_loss(
        logps, logps - LN(2), torch.zeros(1), torch.ones(1, 2), kl_beta=0.1, ref_logps_BT=ref, kl_is_correction=True
    )
    assert loss.item() == pytest.approx(0.1 * 2 * k3, abs=1e-6)


# ---------------------------------------------------------------------------------------------------------------
# policy_loss: ownership mask
# ---------------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("loss_type", LOSS_TYPES)
def test_gradient_exactly_zero_at_junior_tokens(loss_type):
    g = torch.Generator().manual_seed(0)
    B, T = 3, 6
    logps = (torch.randn(B, T, generator=g) - 2.0).requires_grad_(True)
    old = logps.detach() + 0.05 * torch.randn(B, T, generator=g)  # ratios near 1: nothing clipped
    ref = logps.detach() + 0.3 * torch.randn(B, T, generator=g)
    senior = torch.tensor([[1, 0, 1, 1, 0, 0], [0, 0, 1, 0, 1, 1], [1, 1, 1, 0, 1, 0]])
    # junior positions hold garbage: exp(p - old) would overflow to inf, and inf * 0 = NaN if not excluded first
    old = torch.where(senior.bool(), old, torch.tensor(-1e4))
    ref = torch.where(senior.bool(), ref, torch.tensor(1e4))
    adv = torch.tensor([1.0, -0.5, 2.0])
    loss, m = policy_loss(logps, old, adv, senior, loss_type=loss_type, kl_beta=0.05, ref_logps_BT=ref)
    loss.backward()
    assert torch.isfinite(loss) and all(math.isfinite(v) for v in m.values())
    junior = senior == 0
    assert torch.equal(logps.grad[junior], torch.zeros(int(junior.sum())))  # exactly zero
    assert (logps.grad[~junior] != 0).all()
    assert m["train/num_tokens"] == float(senior.sum())


def test_policy_loss_mask_and_argument_errors():
    logps = torch.zeros(2, 3)
    adv = torch.ones(2)
    ones = torch.ones(2, 3)
    with pytest.raises(ValueError, match="all zero"):
        policy_loss(logps, logps, adv, torch.zeros(2, 3))
    with pytest.raises(ValueError, match="required"):
        policy_loss(logps, logps, adv, None)
    with pytest.raises(ValueError, match="mask_BT has shape"):
        policy_loss(logps, logps, adv, torch.ones(2, 4))
    with pytest.raises(ValueError, match="old_logps_BT has shape"):
        policy_loss(logps, torch.zeros(2, 4), adv, ones)
    with pytest.raises(ValueError, match="adv_B has shape"):
        policy_loss(logps, logps, torch.ones(3), ones)
    with pytest.raises(ValueError, match="ref_logps_BT"):
        policy_loss(logps, logps, adv, ones, kl_beta=0.1)
    with pytest.raises(ValueError, match="kl_beta"):
        policy_loss(logps, logps, adv, ones, kl_beta=-0.1, ref_logps_BT=logps)
    with pytest.raises(ValueError, match="clip_eps"):
        policy_loss(logps, logps, adv, ones, clip_eps=1.5)
    with pytest.raises(ValueError, match="valid: grpo"):
        policy_loss(logps, logps, adv, ones, loss_type="ppo")


def test_metrics_are_python_floats():
    logps = torch.randn(2, 3, requires_grad=True)
    _, m = policy_loss(logps, logps.detach(), torch.tensor([1.0, -1.0]), torch.ones(2, 3), ref_logps_BT=logps.detach())
    expected = {
        "train/loss",
        "train/pg_loss",
        "train/clip_frac",
        "train/clip_frac_low",
        "train/clip_frac_high",
        "train/ratio_mean",
        "train/num_tokens",
        "kl/policy_ref",
    }
    assert set(m) == expected
    assert all(type(v) is float for v in m.values())
    assert m["train/ratio_mean"] == pytest.approx(1.0) and m["kl/policy_ref"] == pytest.approx(0.0)


# ---------------------------------------------------------------------------------------------------------------
# edge cases: chunk weights, shapes, defaults, the smallest counts
# ---------------------------------------------------------------------------------------------------------------


def test_chunk_weights_and_process_scale_by_hand():
    from tandem_rlvr.training import core

    assert core.chunk_weight("dapo", 2, 8, num_processes=4) == (4.0, 1.0)  # undo DDP's average; loss as is
    assert core.chunk_weight("token_mean", 3, 8) == (1.0, 1.0)
    assert core.chunk_weight("grpo", 2, 8, num_processes=4) == (0.25, 0.25)  # per-sequence: share of rows
    assert core.chunk_weight("dr_grpo", 3, 12) == (0.25, 0.25)
    assert (core.process_scale("dapo", 4), core.process_scale("token_mean", 3)) == (4, 3)
    assert (core.process_scale("grpo", 4), core.process_scale("dr_grpo", 4)) == (1, 1)
    with pytest.raises(ValueError, match="unknown loss_type"):
        core.chunk_weight("ppo", 1, 1)


def test_k3_kl_checks_its_reference_shape():
    from tandem_rlvr.training import core

    with pytest.raises(ValueError, match=r"ref_logps_BT has shape \(2, 3\), expected \(2, 4\)"):
        core.k3_kl(torch.zeros(2, 4), torch.zeros(2, 3))


def test_advantages_default_eps_dtype_and_empty_batch():
    from tandem_rlvr.training import core

    adv, _ = core.group_advantages(torch.tensor([1.0, 0.0, 0.0]), 3)  # std = sqrt(1/3), mean 1/3
    s = math.sqrt(1 / 3)
    assert adv.tolist() == pytest.approx([(2 / 3) / (s + 1e-6), (-1 / 3) / (s + 1e-6), (-1 / 3) / (s + 1e-6)], rel=1e-6)
    assert core.group_advantages(torch.tensor([1.0, 0.0], dtype=torch.float64), 2)[0].dtype == torch.float64
    assert core.group_advantages(torch.tensor([1, 0]), 2)[0].dtype == torch.float32
    with pytest.raises(ValueError, match="positive multiple"):
        core.group_advantages(torch.zeros(0), 2)


def test_token_logps_at_temperature_two():
    from tandem_rlvr.training import core

    logits = torch.tensor([[[1.0, 3.0, -2.0], [0.5, 0.0, 4.0]]])
    ids = torch.tensor([[1, 2]])
    want = torch.log_softmax(logits / 2.0, -1).gather(-1, ids[..., None])[..., 0]
    assert torch.allclose(core.token_logps(logits, ids, temperature=2.0), want)


def test_aggregate_accepts_the_smallest_positive_counts():
    from tandem_rlvr.training import core

    v, m = torch.tensor([[2.0, 4.0]]), torch.tensor([[1, 0]])
    assert float(core.aggregate(v, m, "dr_grpo", max_len=1)) == pytest.approx(2.0)
    assert float(core.aggregate(v, m, "dapo", num_tokens=1)) == pytest.approx(2.0)


def test_policy_loss_kl_term_is_plain_by_default_and_dr_grpo_uses_max_len():
    """ratio != 1: the default KL term is beta * k3 (not ratio * k3); dr_grpo divides by B * max_len."""
    from tandem_rlvr.training import core

    lp, old, ref = torch.tensor([[-1.0, -2.0]]), torch.tensor([[-1.5, -1.0]]), torch.tensor([[-0.5, -2.5]])
    adv, mask = torch.tensor([1.0]), torch.ones(1, 2)
    r = torch.exp(lp - old)
    pg = -torch.minimum(r * 1.0, r.clamp(0.8, 1.2) * 1.0)
    k3 = torch.exp(ref - lp) - (ref - lp) - 1
    got, _ = core.policy_loss(lp, old, adv, mask, loss_type="dapo", kl_beta=0.1, ref_logps_BT=ref)
    assert float(got) == pytest.approx(float((pg + 0.1 * k3).sum() / 2), rel=1e-6)
    got, _ = core.policy_loss(lp, old, adv, mask, loss_type="dr_grpo", max_len=10)
    assert float(got) == pytest.approx(float(pg.sum() / 10), rel=1e-6)


def test_an_empty_mask_allowed_is_an_exact_zero_with_zero_gradient():
    from tandem_rlvr.training import core

    lp = torch.tensor([[-1.0, -2.0]], requires_grad=True)
    loss, met = core.policy_loss(lp, lp.detach(), torch.tensor([1.0]), torch.zeros(1, 2), allow_empty=True)
    loss.backward()
    assert float(loss.detach()) == 0.0 and met == {} and torch.equal(lp.grad, torch.zeros(1, 2))


def test_policy_loss_takes_advantages_from_the_cpu(monkeypatch):
    """The trainer's rewards, and so its advantages, are CPU tensors, while on a GPU the log-probs are not: the
    loss moves the advantages to the log-probs' device. The meta device stands in for a GPU (a CPU tensor
    with dimensions mixed into its arithmetic fails the same way); the mask check and the metrics, which read
    values, are left out."""
    from tandem_rlvr.training import core

    monkeypatch.setattr(core, "_loss_metrics", lambda *a, **kw: {})
    monkeypatch.setattr(core, "_check_mask", lambda mask_BT, values_BT: mask_BT.bool())
    logps_BT = torch.zeros(2, 3, device="meta")
    for loss_type in ("dapo", "grpo", "dr_grpo"):
        loss, _ = core.policy_loss(logps_BT, torch.zeros(2, 3, device="meta"), torch.tensor([1.0, -1.0]),
                                   torch.ones(2, 3, device="meta"), loss_type=loss_type, num_tokens=6, max_len=3)
        assert loss.device.type == "meta" and loss.shape == ()


def test_merge_metrics_weights_token_means_by_tokens_sums_and_averages_the_rest():
    """Two chunks of 3 and 1 trained tokens: a token mean is (3·a + 1·b) / 4, a summed key adds up (0 where a
    part lacks it), any other key is the plain mean over the parts that have it."""
    parts = [{"train/clip_frac": 1 / 3, "train/ratio_mean": 1.2, "train/num_tokens": 3.0, "train/loss": 0.5, "x": 2.0},
             {"train/clip_frac": 1.0, "train/ratio_mean": 0.8, "train/num_tokens": 1.0, "train/loss": 0.25},
             {}]  # a chunk with no trained token (another process's tokens only): no metrics
    out = merge_metrics(parts, summed={"train/loss", "train/num_tokens", "train/pg_loss"})
    assert out["train/clip_frac"] == pytest.approx((3 * (1 / 3) + 1.0) / 4)  # 0.5, not the chunks' mean 2/3
    assert out["train/ratio_mean"] == pytest.approx((3 * 1.2 + 0.8) / 4)
    assert out["train/loss"] == pytest.approx(0.75) and out["train/num_tokens"] == 4.0 and out["train/pg_loss"] == 0.0
    assert out["x"] == 2.0


def test_processes_rows_merge_token_means_by_their_tokens(monkeypatch):
    """Two processes' rows: a token mean is weighted by each process's tokens (10 and 30: (0.5·10 + 0·30) / 40),
    the tokens add up, any other metric is the plain mean over processes."""
    import accelerate.utils

    from tandem_rlvr.training import dist

    rows = [{"step": 1, "train/clip_frac": 0.5, "train/num_tokens": 10.0, "reward/mean": 0.25},
            {"step": 1, "train/clip_frac": 0.0, "train/num_tokens": 30.0, "reward/mean": 0.75}]
    monkeypatch.setattr(accelerate.utils, "gather_object", lambda _mine: rows)
    out = dist.reduce_row(type("Acc", (), {"num_processes": 2})(), rows[0])
    assert out["train/clip_frac"] == pytest.approx(0.125) and out["train/num_tokens"] == 40.0
    assert out["reward/mean"] == pytest.approx(0.5) and out["step"] == 1


def test_processes_rows_sum_counts_that_only_one_process_saw(monkeypatch):
    """reward/bad_gold and reward/gold_text appear in a row only when they occur: one seen by process 1 alone is
    kept and summed, not dropped for missing from process 0's row."""
    import accelerate.utils

    from tandem_rlvr.training import dist

    rows = [{"step": 1, "reward/n": 4.0, "reward/mean": 0.5},
            {"step": 1, "reward/n": 4.0, "reward/mean": 0.25, "reward/gold_text": 2.0, "reward/bad_gold": 1.0}]
    monkeypatch.setattr(accelerate.utils, "gather_object", lambda _mine: rows)
    out = dist.reduce_row(type("Acc", (), {"num_processes": 2})(), rows[0])
    assert out["reward/n"] == 8.0 and out["reward/gold_text"] == 2.0 and out["reward/bad_gold"] == 1.0
    assert out["reward/mean"] == pytest.approx(0.375)
