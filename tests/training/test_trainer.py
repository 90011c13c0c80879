"""Trainer invariants: zero gradient on junior tokens, frozen junior, p=1 == GRPO, fails closed."""

import copy
import json

import pytest
import torch

from tandem_rlvr.training import core
from tandem_rlvr.engines.handoff import make_schedule
from tandem_rlvr.engines.rollout import generate
from tandem_rlvr.engines.types import Sampling
from tandem_rlvr.training.arms import ArmPlan
from tandem_rlvr.training.trainer import TandemError, Trainer, loss_mask, sequence_logps
from helpers.trainers import EXAMPLES, base_models  # noqa: F401 (fixture)
from helpers.trainers import tiny_trainer as _trainer, trainer_config as _cfg


def test_junior_tokens_get_exactly_zero_gradient(tokenizer, base_models):
    senior, junior = copy.deepcopy(base_models[0]), base_models[1]
    prompts = [tokenizer.apply_chat_template([{"role": "user", "content": e.problem}], add_generation_prompt=True,
                                             tokenize=False) for e in EXAMPLES[:4]]
    enc = tokenizer(prompts, return_tensors="pt", padding=True)
    r = generate(senior, junior, enc.input_ids, enc.attention_mask, make_schedule("bernoulli", p=0.5),
                 Sampling(max_new_tokens=12, temperature=1.0), eos_token_ids=[tokenizer.eos_token_id],
                 pad_token_id=tokenizer.pad_token_id, seed=0)
    mask = loss_mask(r, ArmPlan("bernoulli", True, 0.0))
    logps = sequence_logps(senior, r, 1.0)
    logps.retain_grad()
    old = logps.detach() + 0.05 * torch.randn_like(logps)
    adv = torch.tensor([1.0, -1.0, 0.5, -0.5])
    loss, _ = core.policy_loss(logps, old, adv, mask, loss_type="grpo")
    loss.backward()
    junior_pos = r.response_mask_BT.bool() & (r.owner_BT == 0)
    senior_pos = r.response_mask_BT.bool() & (r.owner_BT == 1)
    assert junior_pos.any() and senior_pos.any()
    assert (logps.grad[junior_pos] == 0).all()
    assert (logps.grad[~r.response_mask_BT.bool()] == 0).all()
    assert (logps.grad[senior_pos] != 0).float().mean() > 0.9


@pytest.mark.parametrize("arm", ["trlvr", "grpo", "kl_reg"])
def test_every_arm_trains_senior_and_never_touches_junior(tmp_path, tokenizer, base_models, arm):
    tr = _trainer(_cfg(tmp_path, arm), tokenizer, base_models)
    junior_before = {k: v.clone() for k, v in tr.junior.state_dict().items()}
    senior_before = {k: v.clone() for k, v in tr.pair.senior.state_dict().items()}
    assert not any(p.requires_grad for p in tr.junior.parameters())
    opt_params = {id(p) for g in tr.opt.param_groups for p in g["params"]}
    assert not opt_params & {id(p) for p in tr.junior.parameters()}
    tr.train()
    assert all(torch.equal(junior_before[k], v) for k, v in tr.junior.state_dict().items())
    changed = [k for k, v in tr.pair.senior.state_dict().items() if not torch.equal(senior_before[k], v)]
    assert len(changed) >= len(senior_before) // 2, changed
    rows = [json.loads(line) for line in (tmp_path / arm / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2]
    for key in ("train/loss", "reward/mean", "rollout/senior_token_frac", "train/frac_zero_std_groups",
                "kl/senior_junior", "time/step_s"):
        assert key in rows[-1], key
    frac = rows[-1]["rollout/senior_token_frac"]
    assert (0.3 <= frac <= 0.7) if arm == "trlvr" else frac == 1.0
    times = rows[-1]
    assert 0 <= times["time/score_s"] <= times["time/update_s"] <= times["time/step_s"]  # scoring is part of the update


def test_p1_tandem_reproduces_solo_grpo(tmp_path, tokenizer, base_models):
    a = _trainer(_cfg(tmp_path, "trlvr", "handoff.p=1.0"), tokenizer, base_models)
    b = _trainer(_cfg(tmp_path, "grpo"), tokenizer, base_models)
    ra, rb = a.train_step(0), b.train_step(0)
    assert ra["train/loss"] == pytest.approx(rb["train/loss"], abs=1e-7)
    assert ra["reward/mean"] == rb["reward/mean"]
    for (ka, va), (kb, vb) in zip(a.pair.senior.state_dict().items(), b.pair.senior.state_dict().items()):
        torch.testing.assert_close(va, vb, rtol=0, atol=1e-7, msg=ka)


def test_fails_closed_on_bad_senior_fraction(tmp_path, tokenizer, base_models):
    tr = _trainer(_cfg(tmp_path, "trlvr", "algo.senior_frac_band=[0.9,1.0]"), tokenizer, base_models)
    with pytest.raises(TandemError, match="senior token fraction"):
        tr.train_step(0)


def test_fails_closed_without_senior_tokens(tmp_path, tokenizer, base_models):
    tr = _trainer(_cfg(tmp_path, "trlvr", "handoff.p=0.0", "algo.senior_frac_band=[0.0,1.0]"), tokenizer, base_models)
    with pytest.raises(TandemError, match="selects no senior token"):
        tr.train_step(0)


def test_no_senior_token_is_judged_over_every_process(tokenizer, base_models):
    """One process's rows may hold no senior token while another's do (multi-process, low p): its mask is then
    all zero and the step trains (each chunk's loss an exact zero there); only a step with no senior token on
    any process is refused. ``reduce`` stands in for the sum over processes."""
    import torch

    senior = base_models[0]
    enc = tokenizer(["hi"], return_tensors="pt")
    r = generate(senior, None, enc.input_ids, enc.attention_mask, make_schedule("none"), Sampling(max_new_tokens=4),
                 eos_token_ids=[tokenizer.eos_token_id], pad_token_id=tokenizer.pad_token_id)
    r.owner_BT = torch.zeros_like(r.response_mask_BT)  # the junior wrote every token of this process's rows
    plan = ArmPlan("word", True, 0.0)
    with pytest.raises(TandemError, match="selects no senior token"):
        loss_mask(r, plan)  # one process: identity
    with pytest.raises(TandemError, match="selects no senior token"):
        loss_mask(r, plan, reduce=lambda local: local + 0.0)  # no process has one
    mask = loss_mask(r, plan, reduce=lambda local: local + 4.0)  # another process has 4
    assert mask.shape == r.response_mask_BT.shape and float(mask.sum()) == 0.0


def test_missing_ownership_is_an_error(tokenizer, base_models):
    senior = base_models[0]
    enc = tokenizer(["hi"], return_tensors="pt")
    r = generate(senior, None, enc.input_ids, enc.attention_mask, make_schedule("none"), Sampling(max_new_tokens=4),
                 eos_token_ids=[tokenizer.eos_token_id], pad_token_id=tokenizer.pad_token_id)
    r.owner_BT = None
    with pytest.raises(TandemError, match="needs ownership"):
        loss_mask(r, ArmPlan("word", True, 0.0))
    assert loss_mask(r, ArmPlan("none", False, 0.0)).sum() > 0
