"""The method's invariants through a real trainer step, for every arm and loss type of the shipped paper/ configs.

Each case loads a paper config (src/tandem_rlvr/configs/paper/<name>.yaml), shrinks only its scale (tiny local models,
2 prompts per step, 16 new tokens, one process) and runs ``Trainer.train_step``. Against values
computed here, independently of the trainer, it checks:

* the loss mask handed to ``core.policy_loss`` is ``response_mask * owner`` (trlvr) or the response
  mask (solo arms);
* the gradient reaching the senior's output logits is exactly zero at every junior-written position
  (and not zero at senior positions);
* ``train/loss`` equals ``core.policy_loss`` recomputed with this file's advantages, mask and token
  count (for ``dapo``: the mini-batch's senior-token count);
* ``kl/senior_junior`` (and ``_k3``) equal direct means over senior-written tokens of
  ``log p_senior - log p_junior`` from this file's own forward passes of the pre-step models.
"""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
import torch

from helpers.fixture_scopes import module_scope_unless_mutating
from tandem_rlvr import configs
from tandem_rlvr.engines import fastpath
from helpers.numeric import assert_close_to_scale
from helpers.tiny_models import bias_token, make_tiny_model
from helpers.trainers import examples, spread_reward
from tandem_rlvr.training import core
from tandem_rlvr.config import load_config
from tandem_rlvr.models import Pair, freeze
from tandem_rlvr.training.trainer import Trainer, make_trainer

PAPER = configs.ROOT / "paper"
ARMS = ("trlvr", "grpo", "grpo_g16", "kl_reg")
TOKEN_MEAN = ("dapo", "token_mean")
EOS_BIAS = 2.0
EXAMPLES = examples(8)


def paper_cfg(name: str, out_dir: Path, *extra: str):
    """The paper config ``name`` at toy scale: only sizes, the model and the device layout (one process, the
    in-process engine) change."""
    over = ["model.senior=unused", "train.fsdp='off'", "rollout.engine=hf", f"train.out_dir={out_dir}", "train.steps=1",
            "train.prompts_per_step=2", "algo.mini_batch_prompts=1", "rollout.max_new_tokens=16",
            "train.save_every=0", "train.progress=false", "val.every=0", *extra]
    return load_config(PAPER / f"{name}.yaml", over)


@pytest.fixture(scope="module")
def models(tokenizer):
    """Tiny random senior and junior with a mild EOS bias: responses of varied lengths (all hitting the
    budget would make the dapo loss of a group vanish, and with it the power of the loss check)."""
    s = bias_token(make_tiny_model(len(tokenizer), 0, 48), tokenizer.eos_token_id, EOS_BIAS)
    return s, freeze(bias_token(make_tiny_model(len(tokenizer), 1, 32), tokenizer.eos_token_id, EOS_BIAS))


def own_logps(model, ro, temperature: float) -> torch.Tensor:
    """log p(response token | history) at ``temperature``: one plain batched forward, written here."""
    ids = torch.cat([ro.prompt_ids_BP, ro.response_ids_BT], 1)
    mask = torch.cat([ro.prompt_mask_BP.long(), ro.response_mask_BT.long()], 1)
    pos = (mask.cumsum(-1) - 1).clamp(min=0)
    with torch.no_grad():
        logits = model(input_ids=ids, attention_mask=mask, position_ids=pos).logits.float()
    P = ro.prompt_ids_BP.shape[1]
    lp = torch.log_softmax(logits[:, P - 1:-1] / temperature, dim=-1)
    return lp.gather(-1, ro.response_ids_BT.unsqueeze(-1)).squeeze(-1)


def own_advantages(rewards: list[float], G: int, normalize_std: bool) -> torch.Tensor:
    r = torch.tensor(rewards, dtype=torch.float64).view(-1, G)
    centred = r - r.mean(1, keepdim=True)
    std = ((centred ** 2).sum(1, keepdim=True) / (G - 1)).sqrt()
    return (centred / (std + 1e-6) if normalize_std else centred).reshape(-1).float()


class Recorder:
    """Spies on one train step: the rollout, every ``core.policy_loss`` call, the logits' gradients."""

    def __init__(self, tr: Trainer, monkeypatch):
        self.rollouts, self.calls, self.logit_grads = [], [], []
        real_rollout, real_loss = tr.rollout, core.policy_loss

        def rollout(step):
            out = real_rollout(step)
            self.rollouts.append(out)
            return out

        def policy_loss(logps, old, adv, mask, **kw):
            self.calls.append({"logps": logps.detach().clone(), "old": old.detach().clone(), "mask": mask.clone(),
                               "ref": None if kw.get("ref_logps_BT") is None else kw["ref_logps_BT"].detach().clone(),
                               "kw": {k: v for k, v in kw.items() if k != "ref_logps_BT"}})
            return real_loss(logps, old, adv, mask, **kw)

        def on_logits(_module, _inputs, out):
            if torch.is_grad_enabled() and out.requires_grad:
                slot = len(self.logit_grads)
                self.logit_grads.append(None)
                out.register_hook(lambda g: self.logit_grads.__setitem__(slot, g.detach().clone()))

        tr.rollout = rollout
        monkeypatch.setattr(core, "policy_loss", policy_loss)
        self.hook = tr.acc.unwrap_model(tr.senior).get_output_embeddings().register_forward_hook(on_logits)


@pytest.fixture(scope=module_scope_unless_mutating, params=ARMS)
def step(request, tmp_path_factory, tokenizer, models):
    """One real train step of a paper arm: (cfg, trainer, recorder, metrics row, pre-step senior)."""
    name = request.param
    cfg = paper_cfg(name, tmp_path_factory.mktemp(name) / "run")
    s, j = models
    tr = make_trainer(cfg, pair=Pair(copy.deepcopy(s), copy.deepcopy(j), tokenizer), reward_fn=spread_reward,
                 examples=EXAMPLES)
    before = copy.deepcopy(tr.acc.unwrap_model(tr.senior)).eval()
    mp = pytest.MonkeyPatch()
    # every row through the loss, also those with advantage 0 (the update's default leaves them out, exactly:
    # tests/training/test_trainer_update.py::test_rows_without_advantage_are_left_out_of_the_update_exactly)
    mp.setattr(fastpath, "SKIP_ZERO_ADVANTAGE", False)
    rec = Recorder(tr, mp)
    try:
        row = tr.train_step(0)
    finally:
        mp.undo()
        rec.hook.remove()
    return cfg, tr, rec, row, before


def step_advantages(cfg, tr, ro, idx) -> torch.Tensor:
    """The step's advantages, recomputed here from the decoded responses and their golds."""
    texts = ro.texts(tr.tok)
    rewards = [spread_reward(t, EXAMPLES[tr.prompt_example[i]].answer) for t, i in zip(texts, idx)]
    return own_advantages(rewards, cfg.algo.group_size, cfg.algo.normalize_std)


def expected_mask(cfg, ro) -> torch.Tensor:
    resp = ro.response_mask_BT.float()
    return resp * ro.owner_BT.float() if cfg.algo.arm == "trlvr" else resp


def test_paper_configs_cover_the_arms_and_loss_types_tested_here():
    seen = {(load_config(PAPER / f"{n}.yaml").algo.arm, load_config(PAPER / f"{n}.yaml").algo.loss_type) for n in ARMS}
    every = {(load_config(p).algo.arm, load_config(p).algo.loss_type) for p in PAPER.glob("*.yaml") if p.name != "eval.yaml"}
    assert seen == every, "a paper config uses an arm/loss type these tests do not run"


def test_policy_loss_receives_response_mask_times_owner(step):
    cfg, tr, rec, _, _ = step
    ((ro, _),) = rec.rollouts
    want = expected_mask(cfg, ro)
    assert len(rec.calls) == ro.batch_size, "one loss call per rollout (paper configs: micro_batch 1, 1 epoch)"
    got = torch.cat([c["mask"].float() for c in rec.calls])
    assert torch.equal(got, want), f"{cfg.algo.arm}: the loss mask is not the arm's (response x owner for trlvr)"
    if cfg.algo.arm == "trlvr":
        junior = ro.response_mask_BT.bool() & (ro.owner_BT == 0)
        assert junior.sum() > 0.2 * ro.response_mask_BT.sum(), "the rollout must hold junior tokens"
        # a micro-batch without any senior token must not break the step (it once raised a KeyError)
        assert bool(((ro.owner_BT.bool() & ro.response_mask_BT.bool()).sum(-1) == 0).any()), \
            "this seed no longer draws a rollout without senior tokens; pick one that does"
    else:
        assert bool((ro.owner_BT.bool() | ~ro.response_mask_BT.bool()).all()), "solo arms: the senior writes all"


def test_junior_positions_get_exactly_zero_gradient(step):
    cfg, tr, rec, _, _ = step
    ((ro, idx),) = rec.rollouts
    T = ro.response_ids_BT.shape[1]
    assert len(rec.logit_grads) == ro.batch_size and all(g is not None for g in rec.logit_grads)
    # each forward keeps the logits of its rows' own longest response + 1 (scoring cuts the columns past it,
    # which no forward computes: they get no gradient); position t of them predicts response token t
    g_BT = torch.cat([torch.nn.functional.pad(g[:, :-1].abs().amax(-1), (0, T + 1 - g.shape[1]))
                      for g in rec.logit_grads])
    resp = ro.response_mask_BT.bool()
    senior, junior = resp & ro.owner_BT.bool(), resp & ~ro.owner_BT.bool()
    assert bool((g_BT[~resp] == 0).all()), "padding got a gradient"
    assert bool((g_BT[junior] == 0).all()), f"{int((g_BT[junior] != 0).sum())} junior-written positions got a gradient"
    signal = step_advantages(cfg, tr, ro, idx).abs().gt(1e-6).unsqueeze(-1) | (cfg.algo.arm == "kl_reg")
    assert float((g_BT[senior & signal] > 0).float().mean()) > 0.9, "the senior's own tokens must be trained"
    assert int(senior.sum()) > 0 and (cfg.algo.arm != "trlvr" or int(junior.sum()) > 0)


def test_train_loss_is_policy_loss_over_senior_tokens(step):
    cfg, tr, rec, row, _ = step
    ((ro, idx),) = rec.rollouts
    a, G = cfg.algo, cfg.algo.group_size
    adv = step_advantages(cfg, tr, ro, idx)
    assert float(adv.abs().max()) > 0, "the step must have a learning signal"
    mask = expected_mask(cfg, ro)
    beta = a.kl_beta if a.arm == "kl_reg" else 0.0  # the method: only kl_reg adds beta * KL(senior || junior)
    mb = a.mini_batch_prompts * G
    per_mb = []
    for m in range(0, ro.batch_size, mb):
        rows = range(m, min(m + mb, ro.batch_size))
        n_tok = float(mask[m:m + mb].sum())  # dapo: the mini-batch's trained (senior) tokens
        max_len = int(ro.response_mask_BT[m:m + mb].sum(-1).max())
        total = 0.0
        for r in rows:
            c = rec.calls[r]
            loss, _ = core.policy_loss(
                c["logps"], c["old"], adv[r:r + 1], mask[r:r + 1], loss_type=a.loss_type, clip_eps=a.clip_eps,
                clip_eps_high=a.clip_eps_high, kl_beta=beta, ref_logps_BT=c["ref"] if beta > 0 else None,
                num_tokens=n_tok, max_len=max_len, kl_clamp=a.kl_clamp, allow_empty=True)
            assert c["kw"]["kl_clamp"] == a.kl_clamp == 10.0, "the paper configs' k3 clamp reaches the loss"
            total += float(loss) * (1.0 if a.loss_type in TOKEN_MEAN else 1.0 / len(rows))
        per_mb.append(total)
    want = sum(per_mb) / len(per_mb)
    assert abs(want) > 1e-3, "the loss must be far from 0 for this check to have teeth"
    assert row["train/loss"] == pytest.approx(want, rel=1e-5, abs=1e-9), (cfg.algo.arm, a.loss_type)
    if beta > 0:  # the reference handed to the loss is the junior's log-probs
        junior_lp = own_logps(tr.junior, ro, cfg.rollout.temperature)
        ref = torch.cat([c["ref"] for c in rec.calls])
        assert_close_to_scale(ref[mask.bool()], junior_lp[mask.bool()])


def test_drift_metrics_are_direct_means_over_senior_tokens(step):
    cfg, tr, rec, row, before = step
    ((ro, _),) = rec.rollouts
    tau = cfg.rollout.temperature
    lp_s, lp_j = own_logps(before, ro, tau), own_logps(tr.junior, ro, tau)
    sm = ro.response_mask_BT.bool() & ro.owner_BT.bool()
    d = (lp_s - lp_j)[sm]
    mc, k3 = float(d.mean()), float((torch.exp(-d) + d - 1).mean())
    assert abs(mc) > 1e-3 and k3 > 1e-3, "drift must be measurable for this check to have teeth"
    assert row["kl/senior_junior"] == pytest.approx(mc, rel=1e-3, abs=1e-5)
    assert row["kl/senior_junior_k3"] == pytest.approx(k3, rel=1e-3, abs=1e-5)
    if cfg.algo.arm != "trlvr":  # senior-sampled tokens: the MC estimate of KL(senior || junior) is positive
        assert row["kl/senior_junior"] > 0
