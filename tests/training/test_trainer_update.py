"""Tests written to kill mutants that `make mutate` found surviving (docs/mutation.md): numbers and
invariants of the method's functions, checked against values computed here by hand."""

import math

import pytest
import torch

from tandem_rlvr.evaluation.evaluate import ModeResult, pass_metrics, tax_metrics
from tandem_rlvr.engines.handoff import make_schedule, simulate
from tandem_rlvr.evaluation.metrics import mean_pass_at_k, pass_at_k, pass_at_ks


def _mean(xs):
    return sum(xs) / len(xs)


def test_tax_is_signed_percentage_points_of_solo_minus_handoff():
    solo = ModeResult(rewards=[[1.0, 1.0, 0.0, 1.0], [0.0, 1.0, 0.0, 0.0], [1.0, 1.0, 1.0, 1.0]])
    hand = ModeResult(rewards=[[0.0, 1.0, 0.0, 0.0], [0.0, 0.0, 0.0, 0.0], [1.0, 0.0, 0.0, 1.0]])
    d = [0.75 - 0.25, 0.25 - 0.0, 1.0 - 0.5]
    se = math.sqrt(sum((x - _mean(d)) ** 2 for x in d) / 2 / 3)
    t = tax_metrics(solo, hand)
    assert t["communication_tax"] == pytest.approx(100 * _mean(d))  # 33.3 points
    assert t["communication_tax_se"] == pytest.approx(100 * se)
    back = tax_metrics(hand, solo)  # a handoff that helps is a negative tax
    assert back["communication_tax"] == pytest.approx(-100 * _mean(d))
    assert back["communication_tax_se"] == pytest.approx(100 * se)


def test_pass_metrics_of_a_mode():
    res = ModeResult(rewards=[[1.0, 0.0, 0.0, 0.0], [1.0, 1.0, 0.0, 1.0]], n_tokens=[3, 5, 7, 9, 11, 13, 2, 4],
                      finished=[True, False, True, True, False, True, True, True])
    m = pass_metrics("solo", res, (1, 2, 8))
    assert set(m) == {"solo_pass@1", "solo_pass@2", "solo_pass@1_se", "solo_len", "solo_finished"}
    assert m["solo_pass@1"] == pytest.approx((0.25 + 0.75) / 2)
    assert m["solo_pass@2"] == pytest.approx((pass_at_k(4, 1, 2) + pass_at_k(4, 3, 2)) / 2)
    assert pass_at_k(4, 1, 2) == pytest.approx(0.5) and pass_at_k(4, 3, 2) == pytest.approx(1.0)
    assert m["solo_pass@1_se"] == pytest.approx(math.sqrt(((0.25 - 0.5) ** 2 + (0.75 - 0.5) ** 2) / 1 / 2))
    assert m["solo_len"] == pytest.approx(_mean([3, 5, 7, 9, 11, 13, 2, 4]))
    assert m["solo_finished"] == pytest.approx(6 / 8)


def test_pass_at_k_counts_rewards_at_the_threshold_and_single_samples():
    assert mean_pass_at_k([[0.5, 0.0]], 1) == pytest.approx(0.5)  # reward == threshold is correct
    assert mean_pass_at_k([[1.0], [0.0], [1.0], [0.2]], 1) == pytest.approx(0.5)  # one sample per problem
    rewards = [[0.7, 0.2, 1.0], [0.7, 0.7, 0.0]]
    assert pass_at_ks(rewards, (1, 2), threshold=1.0) == pytest.approx({1: (1 / 3 + 0) / 2, 2: (2 / 3 + 0) / 2})
    assert pass_at_ks(rewards, (1,)) == pytest.approx({1: (2 / 3 + 2 / 3) / 2})


def test_simulated_owner_is_a_long_mask():
    owner, rounds = simulate(make_schedule("bernoulli", p=0.5), torch.zeros(3, 40, dtype=torch.long), seed=2)
    assert owner.dtype == torch.long and set(owner.unique().tolist()) == {0, 1}
    seen = 1 + (owner[:, 1:] != owner[:, :-1]).sum(1)  # turns visible in the stream; one more may start after it
    assert ((rounds == seen) | (rounds == seen + 1)).all()


@pytest.fixture(scope="module")
def trainer_parts(tokenizer):
    from conftest import bias_token, make_tiny_model

    from tandem_rlvr.models import freeze

    eos = tokenizer.eos_token_id  # an EOS bias: responses of varied lengths
    return (bias_token(make_tiny_model(len(tokenizer), 0, 48), eos, 2.0),
            freeze(bias_token(make_tiny_model(len(tokenizer), 1, 32), eos, 2.0)))


def _one_step(tmp_path, tokenizer, parts, *over, spy=None):
    import copy
    from types import SimpleNamespace

    from tandem_rlvr.config import load_config
    from tandem_rlvr.models import Pair
    from tandem_rlvr.training.trainer import make_trainer

    examples = [SimpleNamespace(id=str(i), problem=f"What is {i} plus 1?", answer=str(i + 1)) for i in range(4)]
    cfg = load_config(None, ["algo.arm=trlvr", "model.senior=unused", "model.junior=unused", "train.steps=1",
                             "train.prompts_per_step=4", "algo.group_size=4", "algo.mini_batch_prompts=4",
                             "rollout.max_new_tokens=12", f"train.out_dir={tmp_path}", "algo.lr=1e-2",
                             "train.save_every=0", "train.progress=false", *over])
    tr = make_trainer(cfg, pair=Pair(copy.deepcopy(parts[0]), copy.deepcopy(parts[1]), tokenizer),
                 reward_fn=lambda c, g: float(len(c) % 3 == 0), examples=examples)
    if spy is not None:
        spy(tr)
    return tr.train_step(0)


@pytest.mark.parametrize("loss_type", ["dapo", "token_mean", "grpo", "dr_grpo"])
def test_micro_batches_do_not_change_the_update(tmp_path, tokenizer, trainer_parts, loss_type):
    """Gradient accumulation over micro-batches of 8 rollouts equals one backward over the mini-batch of 16:
    a token-mean (dapo) chunk already divides by the mini-batch's token count, a per-sequence one is
    weighted by its share of rows."""
    whole = _one_step(tmp_path / "a", tokenizer, trainer_parts, f"algo.loss_type={loss_type}")
    split = _one_step(tmp_path / "b", tokenizer, trainer_parts, f"algo.loss_type={loss_type}",
                               "algo.micro_batch=8")
    assert abs(whole["train/loss"]) > 1e-4
    assert split["train/loss"] == pytest.approx(whole["train/loss"], rel=1e-5, abs=1e-7)
    # the gradient's norm before clipping (Adam's first step, lr * sign(g), would amplify rounding noise)
    assert split["train/grad_norm"] == pytest.approx(whole["train/grad_norm"], rel=1e-5)


def test_dr_grpo_divides_by_each_mini_batch_longest_response(tmp_path, tokenizer, trainer_parts, monkeypatch):
    """dr_grpo's max_len is the longest response of the mini-batch (over processes), not T or a token sum."""
    from tandem_rlvr.training import core

    seen, rollouts = [], []
    real_loss = core.policy_loss

    def loss_spy(*a, **kw):
        seen.append(kw["max_len"])
        return real_loss(*a, **kw)

    def spy(tr):
        real_update = tr.update
        tr.update = lambda rollout, *a: rollouts.append(rollout) or real_update(rollout, *a)

    monkeypatch.setattr(core, "policy_loss", loss_spy)
    _one_step(tmp_path, tokenizer, trainer_parts, "algo.loss_type=dr_grpo", "algo.mini_batch_prompts=1",
              "rollout.max_new_tokens=24", spy=spy)
    lengths = rollouts[0].response_mask_BT.sum(-1)
    want = [int(lengths[m:m + 4].max()) for m in range(0, 16, 4)]
    assert seen == want
    assert len(set(want)) > 1  # the mini-batches differ, so T or one global maximum would not pass


@pytest.mark.parametrize("arm,beta", [("kl_reg", 0.05), ("trlvr", 0.0)])
def test_each_chunk_gets_the_configs_loss_settings_and_its_share(tmp_path, tokenizer, trainer_parts, monkeypatch,
                                                                 arm, beta):
    """A mini-batch of 16 rollouts in micro-batches of 6, 6, 4 (grpo: per-sequence means): every chunk's
    ``policy_loss`` gets the config's clip range and KL weight (the junior's log-probs only where that
    weight is > 0), its weight is ``chunk_weight(loss_type, chunk, 16, processes)``, only the last chunk
    syncs gradients, and ``train/loss`` / ``train/pg_loss`` are the chunks' values weighted by share."""
    from tandem_rlvr.training import core, dist

    calls, weights, syncs, seniors = [], [], [], []
    real_loss, real_weight, real_sync = core.policy_loss, core.chunk_weight, dist.no_sync_unless_last

    def loss_spy(*a, **kw):
        loss, met = real_loss(*a, **kw)
        calls.append((kw, float(loss.detach()), met["train/pg_loss"], met["train/num_tokens"]))
        return loss, met

    monkeypatch.setattr(core, "policy_loss", loss_spy)
    monkeypatch.setattr(core, "chunk_weight", lambda *a, **kw: weights.append((a, kw)) or real_weight(*a, **kw))
    monkeypatch.setattr(dist, "no_sync_unless_last", lambda acc, m, last: syncs.append((m, last)) or real_sync(acc, m, last))
    row = _one_step(tmp_path, tokenizer, trainer_parts, f"algo.arm={arm}", f"algo.kl_beta={beta}", "algo.loss_type=grpo",
                    "algo.micro_batch=6", "algo.clip_eps=0.15", "algo.clip_eps_high=0.3",
                    spy=lambda tr: seniors.append(tr.senior))
    assert len(calls) == 3
    for kw, *_ in calls:
        assert (kw["loss_type"], kw["clip_eps"], kw["clip_eps_high"], kw["kl_beta"]) == ("grpo", 0.15, 0.3, beta)
        assert (kw["ref_logps_BT"] is None) == (beta == 0)
    assert [(a, kw) for a, kw in weights] == [(("grpo", n, 16, 1), {}) for n in (6, 6, 4)]
    assert [last for _, last in syncs] == [False, False, True] and all(m is seniors[0] for m, _ in syncs)
    shares = [6 / 16, 6 / 16, 4 / 16]
    assert row["train/loss"] == pytest.approx(sum(s * c[1] for s, c in zip(shares, calls)), rel=1e-6)
    assert row["train/pg_loss"] == pytest.approx(sum(s * c[2] for s, c in zip(shares, calls)), rel=1e-6)
    assert row["train/num_tokens"] == pytest.approx(sum(c[3] for c in calls))  # the chunks' tokens add up
    assert row["train/lr"] == pytest.approx(1e-2)  # constant after no warm-up
    if beta:  # the KL term separates the two metrics
        assert abs(row["train/loss"] - row["train/pg_loss"]) > 1e-7


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


def test_coin_tolerance_by_hand():
    from tandem_rlvr.training.ownership import coin_tolerance

    assert coin_tolerance(100, 1000, 1e-6) == pytest.approx(0.3272340, rel=1e-6)  # sqrt(ln(2000 / 1e-6) / 200)
    assert coin_tolerance(1, 1, 1e-6) == pytest.approx(2.693386, rel=1e-6)  # sqrt(ln(2 / 1e-6) / 2)
    assert coin_tolerance(5, 2, 1e-6) == pytest.approx(1.269571, rel=1e-6)  # N is at least n: sqrt(ln(10 / 1e-6) / 10)
    assert math.isfinite(coin_tolerance(0, 0))


def test_the_senior_share_band_is_closed():
    from tandem_rlvr.config import load_config
    from tandem_rlvr.errors import TandemError
    from tandem_rlvr.engines.handoff import Schedule
    from tandem_rlvr.training.arms import check_senior_frac

    cfg = load_config(None, ["algo.arm=trlvr", "model.senior=unused", "model.junior=unused",
                                 "algo.senior_frac_band=[0.25,0.75]"])
    sched = Schedule("word", p=0.5)
    check_senior_frac(0.25, cfg.senior_band(), sched)
    check_senior_frac(0.75, cfg.senior_band(), sched)
    for frac in (0.2499, 0.7501):
        with pytest.raises(TandemError, match="outside algo.senior_frac_band"):
            check_senior_frac(frac, cfg.senior_band(), sched)


def test_k3_kl_checks_its_reference_shape():
    from tandem_rlvr.training import core

    with pytest.raises(ValueError, match=r"ref_logps_BT has shape \(2, 3\), expected \(2, 4\)"):
        core.k3_kl(torch.zeros(2, 4), torch.zeros(2, 3))


def _capture_trainer(tmp_path, tokenizer, trainer_parts, *over):
    got = []
    _one_step(tmp_path, tokenizer, trainer_parts, *over, spy=got.append)
    return got[0]


def test_drift_metrics_are_means_over_senior_tokens_by_hand(tmp_path, tokenizer, trainer_parts):
    """kl/senior_junior = mean of log p_s - log p_j over senior-written tokens; _k3 the k3 estimator's mean;
    one senior token in the whole step is a mean over one token; no senior token gives 0, not a division by 0."""
    from types import SimpleNamespace

    tr = _capture_trainer(tmp_path, tokenizer, trainer_parts)
    old = torch.tensor([[-1.0, -2.0, -0.5], [-3.0, -1.5, -0.25]])
    jun = torch.tensor([[-1.5, -1.0, -0.5], [-2.0, -2.5, -4.0]])
    ro = SimpleNamespace(response_mask_BT=torch.tensor([[1, 1, 0], [1, 1, 1]]),
                         owner_BT=torch.tensor([[1, 0, 1], [1, 1, 0]]))  # senior tokens: (0,0) (1,0) (1,1)
    d = [0.5, -1.0, 1.0]
    k3 = [math.exp(-x) + x - 1 for x in d]
    got = tr._drift_metrics(old, jun, ro)
    assert got["kl/senior_junior"] == pytest.approx(sum(d) / 3) and got["kl/senior_junior_k3"] == pytest.approx(sum(k3) / 3)
    one = SimpleNamespace(response_mask_BT=ro.response_mask_BT, owner_BT=torch.tensor([[0, 0, 0], [0, 1, 0]]))
    got = tr._drift_metrics(old, jun, one)
    assert got["kl/senior_junior"] == pytest.approx(1.0) and got["kl/senior_junior_k3"] == pytest.approx(k3[2])
    none = SimpleNamespace(response_mask_BT=ro.response_mask_BT, owner_BT=torch.zeros(2, 3, dtype=torch.long))
    assert tr._drift_metrics(old, jun, none) == {"kl/senior_junior": 0.0, "kl/senior_junior_k3": 0.0}


@pytest.mark.parametrize("arm,beta", [("trlvr", 0.0), ("kl_reg", 0.05)])
def test_update_forwards_respect_the_micro_batch_and_reuse_recorded_junior_logps(tmp_path, tokenizer, trainer_parts,
                                                                                  monkeypatch, arm, beta):
    """Every teacher-forced forward of the update (old log-probs, the junior's) runs on at most
    algo.micro_batch rows; the junior runs only where the rollout did not record its log-probs (kl_reg's
    solo rollouts), never again for a tandem rollout that did."""
    from tandem_rlvr.engines import scoring

    calls, seen = [], []
    real = scoring._forward_logps
    monkeypatch.setattr(scoring, "_forward_logps", lambda m, ro, rows, t: calls.append((m, len(rows))) or real(m, ro, rows, t))
    _one_step(tmp_path, tokenizer, trainer_parts, f"algo.arm={arm}", f"algo.kl_beta={beta}", "algo.micro_batch=6",
              spy=seen.append)
    tr = seen[0]
    assert calls and max(n for _, n in calls) <= 6
    junior = [n for m, n in calls if m is tr.junior]
    assert sum(junior) == (16 if arm == "kl_reg" else 0)


def test_max_grad_norm_zero_means_no_clipping(tmp_path, tokenizer, trainer_parts):
    tr = _capture_trainer(tmp_path, tokenizer, trainer_parts, "algo.max_grad_norm=0")
    for p in tr.senior.parameters():
        p.grad = torch.full_like(p, 1e-3)
    before = [p.detach().clone() for p in tr.senior.parameters()]
    norm = tr._clip_and_step()
    assert norm == pytest.approx(1e-3 * math.sqrt(sum(p.numel() for p in tr.senior.parameters())), rel=1e-4)
    assert all(not torch.equal(a, p) for a, p in zip(before, tr.senior.parameters()))


def test_non_finite_gradients_skip_the_update_and_count_in_a_row(tmp_path, tokenizer, trainer_parts):
    tr = _capture_trainer(tmp_path, tokenizer, trainer_parts)
    params = list(tr.senior.parameters())
    before = [p.detach().clone() for p in params]
    for k in (1, 2):
        for p in params:
            p.grad = torch.full_like(p, float("nan"))
        assert not math.isfinite(tr._clip_and_step())
        assert tr.nonfinite_run == k and all(p.grad is None for p in params)
        assert all(torch.equal(a, p) for a, p in zip(before, params))
    for p in params:
        p.grad = torch.full_like(p, 1e-3)
    assert math.isfinite(tr._clip_and_step()) and tr.nonfinite_run == 0
    assert all(not torch.equal(a, p) for a, p in zip(before, params))
    assert all(p.grad is None for p in params)  # gradients freed after the step


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


def test_rounds_limits_and_schedule_defaults():
    from tandem_rlvr.engines.handoff import CoinStream, Schedule, make_schedule, over_rounds

    assert (over_rounds(3, 2), over_rounds(2, 2), over_rounds(1, None), over_rounds(0, None)) == (True, False, False, False)
    assert bool(over_rounds(torch.tensor([0, 1, 5]), None).any()) is False
    sch = make_schedule("chunk")
    assert (sch.max_gap, sch.chunk_size) == (32, 16)  # the paper's K = 32
    assert make_schedule("chunk", max_gap=1, chunk_size=1).chunk_size == 1
    for bad in ({"max_gap": 0}, {"chunk_size": 0}):
        with pytest.raises(ValueError, match="max_gap and chunk_size must be >= 1"):
            make_schedule("chunk", **bad)
    state = Schedule("bernoulli").start(CoinStream(3, 0.5, 0))
    assert state.gap_B.dtype == torch.long and state.rounds_B.dtype == torch.long and state.t == 0


def test_workers_that_cannot_start_score_errors_and_the_batch_returns(monkeypatch):
    """No verifier process can start: each worker is tried twice per batch (start, then one retry round),
    the batch returns at once with every check scored 0 and counted as an error; failed starts are not
    counted as restarts of a working worker."""
    import time

    from tandem_rlvr.rewards import RewardScorer, workers

    attempts = []

    def no_process(self):
        attempts.append(self)
        raise OSError("no processes allowed")

    monkeypatch.setattr(workers.Worker, "start", no_process)
    with RewardScorer("math", num_workers=2, time_limit=1.0) as sc:
        t0 = time.monotonic()
        rewards, stats = sc.score([r"\boxed{2}", r"\boxed{3}", r"\boxed{x}"], ["2", "3", "4"])
        took = time.monotonic() - t0
    assert rewards == [0.0, 0.0, 0.0] and stats["reward/errors"] == 3.0 and stats["reward/worker_restarts"] == 0.0
    assert len(attempts) == 4 and took < 5.0


def test_a_fresh_scorers_first_batch_starts_workers_without_counting_restarts():
    from tandem_rlvr.rewards import RewardScorer

    with RewardScorer("math", num_workers=1, time_limit=5.0) as sc:
        rewards, stats = sc.score([r"\boxed{2}", r"\boxed{5}"], ["2", "3"])
        assert rewards == [1.0, 0.0] and stats["reward/worker_restarts"] == 0.0 and stats["reward/errors"] == 0.0
        w = sc._workers[0]
        w.kill()  # gone between batches (as after close of a connection): the next batch starts it again, uncounted
        rewards, stats = sc.score([r"\boxed{3}"], ["3"])
        assert rewards == [1.0] and stats["reward/worker_restarts"] == 0.0


def test_a_worker_that_dies_mid_check_scores_an_error_and_is_restarted():
    """A verifier process killed in the middle of a check: that check is an error (not a timeout, not a
    pass), the worker's restart is counted, and the replacement scores the next batch."""
    import threading

    from test_rewards import TOWER
    from tandem_rlvr.rewards import RewardScorer

    with RewardScorer(num_workers=1, time_limit=30.0, soft_limit_fraction=10.0) as sc:
        sc.start()
        threading.Timer(1.0, sc._workers[0].proc.kill).start()
        rewards, stats = sc.score([TOWER, r"\boxed{7}"], ["1", "8"])
        assert rewards == [0.0, 0.0] and stats["reward/errors"] == 1.0 and stats["reward/timeouts"] == 0.0
        assert stats["reward/worker_restarts"] == 1.0
        assert sc.score([r"\boxed{2}"], ["2"])[0] == [1.0]


def test_the_soft_limit_is_a_fraction_of_the_limit_and_the_hard_kill_keeps_short_limits():
    """A check past ``soft_limit_fraction`` of the limit gives up inside the worker (a timeout, no restart);
    a soft limit past the hard one leaves the parent to kill at the limit, also for limits under a second."""
    import time

    from test_rewards import SLACK, TOWER
    from tandem_rlvr.rewards import RewardScorer

    for limit, frac, soft in ((1.0, 0.5, 0.5), (2.0, 0.5, 1.0)):
        with RewardScorer(num_workers=1, time_limit=limit, soft_limit_fraction=frac) as sc:
            sc.start()
            t0 = time.monotonic()
            rewards, stats = sc.score([TOWER], ["1"])
            took = time.monotonic() - t0
        assert rewards == [0.0] and stats["reward/timeouts"] == 1.0 and stats["reward/worker_restarts"] == 0.0
        assert soft - 0.1 <= took <= soft + SLACK, (limit, took)
    with RewardScorer(num_workers=1, time_limit=0.5, soft_limit_fraction=10.0) as sc:
        sc.start()
        t0 = time.monotonic()
        rewards, stats = sc.score([TOWER], ["1"])
        took = time.monotonic() - t0
    assert stats["reward/timeouts"] == 1.0 and stats["reward/worker_restarts"] == 1.0 and 0.5 <= took <= 0.5 + SLACK


@pytest.mark.parametrize("how", ["slow_start", "dies_at_start"])
def test_workers_that_never_get_ready_score_errors_uncounted(monkeypatch, how):
    """A worker that does not report ready within ``start_timeout``, or whose process exits before it is ready:
    the batch returns in bounded time with its checks as errors; no start counts as a worker restart."""
    import subprocess
    import sys
    import time

    from tandem_rlvr.rewards import RewardScorer, workers

    kw = {}
    if how == "slow_start":
        kw["start_timeout"] = 0.05  # importing math-verify takes longer than this
    else:
        monkeypatch.setattr(workers.Worker, "_launch", lambda self, child: subprocess.Popen(
            [sys.executable, "-c", "pass"], pass_fds=(child.fileno(),), stdin=subprocess.DEVNULL))
    with RewardScorer("math", num_workers=2, time_limit=1.0, **kw) as sc:
        t0 = time.monotonic()
        rewards, stats = sc.score([r"\boxed{2}", r"\boxed{3}"], ["2", "3"])
        took = time.monotonic() - t0
    assert rewards == [0.0, 0.0] and stats["reward/errors"] == 2.0 and stats["reward/worker_restarts"] == 0.0
    assert took < 10.0
