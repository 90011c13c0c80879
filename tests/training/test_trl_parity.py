"""Parity of ``tandem_rlvr.training.core`` with TRL 1.16 ``GRPOTrainer`` (the oracle) on a tiny Qwen2 model.

We build a real ``GRPOTrainer`` and feed its loss (``compute_loss`` -> ``_compute_loss``) a hand-built
batch, then compute ours from the *same* model's plain forward: logits at the completion positions ->
``token_logps`` -> ``policy_loss``. Loss and every parameter gradient must agree.

Adaptations needed to line the two up (documented here, mirrored exactly):

* Ownership mask: TRL attends over ``completion_mask`` but trains on ``completion_mask * tool_mask``
  (its multi-turn tool mask). That is exactly the tandem setting (junior tokens condition the senior,
  but carry no loss), so the senior-ownership mask goes in as ``tool_mask`` and ours gets
  ``mask_BT = completion_mask * tool_mask``. One row owns no token at all, to exercise ``clamp(min=1)``.
* Precision: ``GRPOConfig`` defaults to ``bf16=True``, so TRL's forward runs under bf16 autocast even on
  CPU; we set ``bf16=False`` so both sides are fp32 (``token_logps`` itself upcasts rows to fp32).
* Log-probs: TRL patches the model with a fused, chunked LM head that divides logits by
  ``args.temperature`` and returns 0 at positions whose ``attention_mask`` is 0. We pass the same
  temperature to ``token_logps`` (a non-default 0.7 in some cases); the padded positions are masked on
  both sides, and ``old_per_token_logps`` is 0 there, as TRL itself would produce.
* ``grpo`` / ``dr_grpo``: TRL divides by ``current_gradient_accumulation_steps`` (set by its training
  loop; we set it to 1). ``dr_grpo`` divides by ``B * max_completion_length``: we pass that as ``max_len``.
* ``dapo``: TRL divides by ``num_items_in_batch / num_processes * grad_accum / steps_per_generation``
  (= ``num_items_in_batch`` here: 1 process, 1 step); we feed a *global* count larger than the local
  mask sum, as a multi-process run would, and pass the same number as ``num_tokens``.
* KL: TRL 1.16 defaults to ``use_bias_correction_kl=True`` (per-token KL times the differentiable
  ratio). The method's KL-Reg baseline is plain ``beta * k3``, so the cases set it explicitly: ``False``
  against our default, ``True`` against ``policy_loss(..., kl_is_correction=True)``.
* Advantages: TRL's group normalisation uses the unbiased std and a hard-coded ``eps = 1e-4``; our
  ``group_advantages(..., eps=1e-4)`` must reproduce it (checked through ``_generate_and_score_completions``).
"""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("trl")

from helpers.tiny_models import make_tiny_model  # noqa: E402

from tandem_rlvr.training.core import group_advantages, policy_loss, token_logps  # noqa: E402

B, G, P, C, MAX_COMPLETION = 6, 3, 5, 7, 8
REWARDS = [1.0, 0.0, 0.0, 2.0, 4.0, 6.0]


@pytest.fixture(scope="module")
def saved_model_dir(tmp_path_factory, tokenizer):
    d = tmp_path_factory.mktemp("trl_parity_model")
    model = make_tiny_model(len(tokenizer), seed=3)
    model.save_pretrained(str(d))
    tokenizer.save_pretrained(str(d))
    return d


def _reward_func(completions, **kwargs):
    return REWARDS[: len(completions)]


def _make_trainer(model_dir, tokenizer, tmp_path, **overrides):
    from datasets import Dataset
    from trl import GRPOConfig, GRPOTrainer

    kw = dict(
        output_dir=str(tmp_path / "out"),
        report_to=[],
        beta=0.0,
        loss_type="grpo",
        per_device_train_batch_size=B,
        num_generations=G,
        max_completion_length=MAX_COMPLETION,
        use_cpu=True,
        bf16=False,  # TRL's GRPOConfig defaults to bf16=True (autocast); compare in plain fp32
        seed=0,
    )
    kw.update(overrides)
    trainer = GRPOTrainer(
        model=str(model_dir),
        reward_funcs=_reward_func,
        args=GRPOConfig(**kw),
        train_dataset=Dataset.from_dict({"prompt": ["What is 3 plus 4?"] * 4}),
        processing_class=tokenizer,
    )
    trainer.model.train()  # TRL picks the "train" normalisers from model.training
    trainer.current_gradient_accumulation_steps = 1  # normally set by the HF training loop
    return trainer


def _batch(vocab_size: int) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    prompt_ids = torch.randint(3, vocab_size, (B, P), generator=g)
    prompt_mask = torch.ones(B, P, dtype=torch.long)
    prompt_mask[1, :2] = 0  # left padding
    prompt_mask[4, :1] = 0
    prompt_ids = prompt_ids.masked_fill(prompt_mask == 0, 0)
    completion_ids = torch.randint(3, vocab_size, (B, C), generator=g)
    completion_mask = torch.ones(B, C, dtype=torch.long)
    completion_mask[0, 4:] = 0  # right padding after EOS
    completion_mask[3, 2:] = 0
    completion_ids = completion_ids.masked_fill(completion_mask == 0, 0)
    owner = (torch.rand(B, C, generator=g) < 0.6).long()  # 1 = senior token
    owner[0, 0] = 1
    owner[5] = 0  # a rollout where the junior wrote everything: no loss tokens, still in the batch
    adv, _ = group_advantages(torch.tensor(REWARDS), G, eps=1e-4)
    return dict(
        prompt_ids=prompt_ids,
        prompt_mask=prompt_mask,
        completion_ids=completion_ids,
        completion_mask=completion_mask,
        tool_mask=owner,
        advantages=adv,
    )


def _our_logps(model, batch, temperature: float) -> torch.Tensor:
    input_ids = torch.cat([batch["prompt_ids"], batch["completion_ids"]], dim=1)
    attention_mask = torch.cat([batch["prompt_mask"], batch["completion_mask"]], dim=1)
    logits = model(input_ids=input_ids, attention_mask=attention_mask, use_cache=False).logits
    # logits at position i predict token i + 1: the completion is predicted by positions P-1 .. P+C-2
    return token_logps(logits[:, P - 1 : -1], batch["completion_ids"], temperature=temperature)


def _grads(model) -> dict[str, torch.Tensor]:
    out = {n: p.grad.detach().clone() for n, p in model.named_parameters() if p.grad is not None}
    model.zero_grad(set_to_none=True)
    return out


CASES = [
    # (loss_type, beta, temperature, epsilon_high, KL importance-sampling correction)
    ("grpo", 0.0, 1.0, None, False),
    ("dapo", 0.0, 1.0, None, False),
    ("grpo", 0.0, 0.7, 0.28, False),
    ("dapo", 0.0, 0.7, 0.28, False),
    ("dr_grpo", 0.0, 1.0, None, False),
    ("grpo", 0.05, 1.0, None, False),
    ("dapo", 0.05, 0.7, None, False),
    ("grpo", 0.05, 1.0, None, True),
    ("dapo", 0.05, 1.0, 0.28, True),
]


@pytest.mark.parametrize("loss_type,beta,temperature,eps_high,kl_is", CASES)
def test_loss_and_grads_match_trl(
    saved_model_dir, tokenizer, tmp_path, loss_type, beta, temperature, eps_high, kl_is
):
    trainer = _make_trainer(
        saved_model_dir,
        tokenizer,
        tmp_path,
        loss_type=loss_type,
        beta=beta,
        temperature=temperature,
        epsilon=0.2,
        epsilon_high=eps_high,
        use_bias_correction_kl=kl_is,
    )
    model = trainer.model
    batch = _batch(len(tokenizer))
    completion_mask = batch["completion_mask"]
    mask = completion_mask * batch["tool_mask"]

    # Old / reference log-probs: current ones perturbed (so some ratios leave [0.8, 1.2]), 0 at padding.
    with torch.no_grad():
        current = _our_logps(model, batch, temperature)
    g = torch.Generator().manual_seed(1)
    old = ((current + 0.3 * torch.randn(current.shape, generator=g)) * completion_mask).detach()
    ref = ((current + 0.2 * torch.randn(current.shape, generator=g)) * completion_mask).detach()
    num_items = mask.sum() + 13  # a "global" count over processes / other micro-batches

    inputs = dict(batch, old_per_token_logps=old, num_items_in_batch=num_items)
    if beta > 0:
        inputs["ref_per_token_logps"] = ref
    trl_loss = trainer.compute_loss(model, inputs)
    trl_loss.backward()
    trl_grads = _grads(model)

    logps = _our_logps(model, batch, temperature)
    ours, metrics = policy_loss(
        logps,
        old,
        batch["advantages"],
        mask,
        loss_type=loss_type,
        clip_eps=0.2,
        clip_eps_high=eps_high,
        kl_beta=beta,
        ref_logps_BT=ref if beta > 0 else None,
        num_tokens=num_items if loss_type == "dapo" else None,
        max_len=MAX_COMPLETION if loss_type == "dr_grpo" else None,
        kl_is_correction=kl_is,
    )
    ours.backward()
    our_grads = _grads(model)

    assert 0.0 < metrics["train/clip_frac"] < 1.0  # the batch really exercises clipping
    torch.testing.assert_close(ours.detach(), trl_loss.detach(), rtol=0, atol=1e-6)
    assert set(our_grads) == set(trl_grads) and len(our_grads) > 0
    for name, grad in trl_grads.items():
        assert grad.abs().max() > 0, name
        torch.testing.assert_close(our_grads[name], grad, rtol=0, atol=1e-6, msg=lambda m, n=name: f"{n}: {m}")

    # Metric conventions: TRL logs region clipping and the k3 KL as global token means over the mask.
    logged = trainer._metrics["train"]
    assert metrics["train/clip_frac"] == pytest.approx(logged["clip_ratio/region_mean"][-1], abs=1e-6)
    assert metrics["train/clip_frac_low"] == pytest.approx(logged["clip_ratio/low_mean"][-1], abs=1e-6)
    assert metrics["train/clip_frac_high"] == pytest.approx(logged["clip_ratio/high_mean"][-1], abs=1e-6)
    if beta > 0 and not kl_is:  # TRL logs the ratio-weighted KL when the correction is on; we log plain k3
        assert metrics["kl/policy_ref"] == pytest.approx(logged["kl"][-1], abs=1e-6)


def test_group_advantages_match_trl(saved_model_dir, tokenizer, tmp_path):
    """TRL's own scoring path (generate -> reward -> group-normalise) vs ``group_advantages(eps=1e-4)``."""
    trainer = _make_trainer(saved_model_dir, tokenizer, tmp_path)
    out = trainer._generate_and_score_completions([{"prompt": "What is 3 plus 4?"}] * B)
    ours, metrics = group_advantages(torch.tensor(REWARDS), G, eps=1e-4)
    torch.testing.assert_close(ours, out["advantages"].float(), rtol=0, atol=1e-6)
    assert metrics["reward/std"] == pytest.approx(trainer._metrics["train"]["reward_std"][-1], abs=1e-6)
    assert metrics["train/frac_zero_std_groups"] == pytest.approx(
        trainer._metrics["train"]["frac_reward_zero_std"][-1]
    )
