"""P3: is our GRPO training step cheaper than TRL's?

One optimiser update on the same precomputed batch (prompt + completion ids, senior-ownership mask,
old log-probs, advantages), no generation, on both sides:

- ours: ``Trainer._minibatch`` (``sequence_logps`` forward -> ``core.policy_loss`` -> backward ->
  grad clip -> AdamW step), the exact code the training loop runs;
- TRL 1.16: ``GRPOTrainer.compute_loss`` (its fused LM-head forward and loss) -> ``accelerator.backward``
  -> ``clip_grad_norm_`` -> its optimiser's ``step`` -> ``zero_grad``, i.e. the HF training loop's
  inner step without ``_prepare_inputs`` (which would generate).

Same model weights (two copies of one random init), loss ``grpo``, ε = 0.2, β = 0, temperature 0.6,
max grad norm 1.0, lr 1e-6, fp32. The ownership mask goes to TRL as its ``tool_mask``
(tests/training/test_trl_parity.py shows the two losses and gradients agree). Target: ours ÷ TRL ≤ 0.8.

``P3-proposed`` (a what-if, not the shipped trainer): the same ``_minibatch`` with two changes the
profile points at, applied by patching in this process only: (1) the whole step inside
``rollout.gqa_attention`` (no ``repeat_kv`` copies of K/V in forward and backward); (2) a
``sequence_logps`` that asks the model for ``logits_to_keep = T + 1`` (no LM head over the prompt)
and takes the log-softmax of the whole batch at once instead of one row at a time.
"""

from __future__ import annotations

import argparse
import copy
import tempfile
import warnings
from dataclasses import dataclass
from pathlib import Path

import common as C
import torch


@dataclass(frozen=True)
class _Ex:
    id: str
    problem: str
    answer: str


def _batch(tok, B: int, T: int, V: int, seed: int = 0):
    from tandem_rlvr.engines.types import Rollout

    g = torch.Generator().manual_seed(seed)
    p_ids, p_mask = C.prompts(tok, B, seed=seed)
    r_ids = torch.randint(3, V, (B, T), generator=g)
    lengths = torch.randint(T // 2, T + 1, (B,), generator=g)
    lengths[0] = T
    r_mask = (torch.arange(T)[None] < lengths[:, None]).long()
    r_ids = r_ids.masked_fill(r_mask == 0, tok.pad_token_id)
    owner = (torch.rand(B, T, generator=g) < 0.5).long() * r_mask
    rewards = (torch.rand(B, generator=g) < 0.5).float()
    ro = Rollout(prompt_ids_BP=p_ids, prompt_mask_BP=p_mask, response_ids_BT=r_ids, response_mask_BT=r_mask,
                 owner_BT=owner, senior_logps_BT=torch.zeros(B, T), junior_logps_BT=None,
                 rounds_B=torch.ones(B, dtype=torch.long), finished_B=torch.zeros(B, dtype=torch.bool), schedule="word")
    return ro, rewards


def proposed_sequence_logps(model, rollout, temperature: float, micro: int = 0, rows=None) -> torch.Tensor:
    """``trainer.sequence_logps`` with the LM head on response positions only, batched log-softmax."""
    rows = torch.arange(rollout.batch_size) if rows is None else rows
    p_ids, p_mask = rollout.prompt_ids_BP[rows], rollout.prompt_mask_BP[rows]
    r_ids, r_mask = rollout.response_ids_BT[rows], rollout.response_mask_BT[rows]
    ids, mask = torch.cat([p_ids, r_ids], 1), torch.cat([p_mask.long(), r_mask.long()], 1)
    pos = (mask.cumsum(-1) - 1).clamp(min=0)
    T = r_ids.shape[1]
    logits = model(input_ids=ids, attention_mask=mask, position_ids=pos, use_cache=False, logits_to_keep=T + 1).logits
    z = logits[:, :-1].float() / temperature
    return z.gather(-1, r_ids.unsqueeze(-1)).squeeze(-1) - torch.logsumexp(z, -1)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--prompts", type=int, default=2)
    ap.add_argument("--group", type=int, default=8)
    ap.add_argument("--tokens", type=int, default=128)
    ap.add_argument("--repeats", type=int, default=4 if C.quick() else 10)
    args = ap.parse_args()
    warnings.filterwarnings("ignore")

    from datasets import Dataset
    from trl import GRPOConfig, GRPOTrainer

    from tandem_rlvr.config import load_config
    from tandem_rlvr.training.core import group_advantages
    from tandem_rlvr.models import Pair
    from tandem_rlvr.engines.scoring import sequence_logps
    from tandem_rlvr.training.trainer import make_trainer

    tok = C.tokenizer()
    V, G = len(tok), args.group
    B, T, temp = args.prompts * G, args.tokens, 0.6
    base = C.model(V, C.SENIOR, 0)
    ro, rewards = _batch(tok, B, T, V)
    adv, _ = group_advantages(rewards, G, eps=1e-4)
    mask = ro.response_mask_BT * ro.owner_BT
    with torch.no_grad():
        old = (sequence_logps(base, ro, temp) + 0.1 * torch.randn(B, T, generator=torch.Generator().manual_seed(1)))
        old = old * ro.response_mask_BT

    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        base.save_pretrained(str(tmp / "model"))
        tok.save_pretrained(str(tmp / "model"))

        # ours: the real Trainer, fed the batch directly
        cfg = load_config(None, [
            "algo.arm=trlvr", "model.senior=unused", "model.junior=unused", f"algo.group_size={G}",
            f"algo.mini_batch_prompts={args.prompts}", f"train.prompts_per_step={args.prompts}", "algo.lr=1e-6",
            "algo.loss_type=grpo", "algo.clip_eps=0.2", "algo.max_grad_norm=1.0", f"rollout.temperature={temp}",
            f"rollout.max_new_tokens={T}", f"train.out_dir={tmp / 'ours'}", "train.save_every=0", "train.progress=false",
        ])
        ours_tr = make_trainer(cfg, pair=Pair(copy.deepcopy(base).train(), copy.deepcopy(base).eval(), tok),
                          reward_fn=lambda c, g: 0.0, examples=[_Ex(str(i), f"What is {i} plus 1?", str(i + 1)) for i in range(4)])
        rows = torch.arange(B)

        def ours():
            ours_tr.senior.train()
            ours_tr._minibatch(ro, rows, old, None, adv, mask.float())

        import tandem_rlvr.training.trainer as trainer_mod
        from tandem_rlvr.engines.rollout import gqa_attention

        prop_tr = make_trainer(cfg, pair=Pair(copy.deepcopy(base).train(), copy.deepcopy(base).eval(), tok),
                          reward_fn=lambda c, g: 0.0, examples=[_Ex("0", "What is 1 plus 1?", "2")])

        def proposed():
            prop_tr.senior.train()
            saved = trainer_mod.sequence_logps
            trainer_mod.sequence_logps = proposed_sequence_logps
            try:
                with gqa_attention(prop_tr.senior):
                    prop_tr._minibatch(ro, rows, old, None, adv, mask.float())
            finally:
                trainer_mod.sequence_logps = saved

        with torch.no_grad():  # the what-if computes the same log-probs
            a = trainer_mod.sequence_logps(prop_tr.senior, ro, temp)
            with gqa_attention(prop_tr.senior):
                b = proposed_sequence_logps(prop_tr.senior, ro, temp)
            assert torch.allclose(a, b, atol=1e-5), float((a - b).abs().max())

        # TRL 1.16
        targs = GRPOConfig(output_dir=str(tmp / "trl"), report_to=[], beta=0.0, loss_type="grpo",
                           per_device_train_batch_size=B, num_generations=G, max_completion_length=T,
                           use_cpu=True, bf16=False, seed=0, temperature=temp, epsilon=0.2,
                           learning_rate=1e-6, max_grad_norm=1.0, logging_steps=10**9)
        trl_tr = GRPOTrainer(model=str(tmp / "model"), reward_funcs=lambda completions, **kw: [0.0] * len(completions),
                             args=targs, train_dataset=Dataset.from_dict({"prompt": ["hi"] * 4}), processing_class=tok)
        trl_tr.create_optimizer()
        trl_tr.model.train()
        trl_tr.current_gradient_accumulation_steps = 1
        inputs = {"prompt_ids": ro.prompt_ids_BP, "prompt_mask": ro.prompt_mask_BP, "completion_ids": ro.response_ids_BT,
                      "completion_mask": ro.response_mask_BT, "tool_mask": ro.owner_BT, "advantages": adv,
                      "old_per_token_logps": old, "num_items_in_batch": mask.sum()}

        def trl():
            model = trl_tr.model
            loss = trl_tr.compute_loss(model, inputs)
            trl_tr.accelerator.backward(loss)
            trl_tr.accelerator.clip_grad_norm_(model.parameters(), targs.max_grad_norm)
            trl_tr.optimizer.step()
            model.zero_grad(set_to_none=True)

        torch.set_num_threads(int(__import__("os").environ.get("TANDEM_BENCH_THREADS", "1")))
        t = C.interleaved({"ours": ours, "trl": trl, "proposed": proposed}, args.repeats)
    detail = (f"{B} rollouts ({args.prompts}×{G}), prompt {ro.prompt_ids_BP.shape[1]} + completion {T} tokens, "
              f"senior {C.SENIOR} ({C.n_params(base) / 1e6:.2f}M), loss grpo, owner mask; ours "
              f"{C.fmt(t['ours'], 's')}, TRL {C.fmt(t['trl'], 's')}, {len(t['ours'])} repeats")
    detail += f"; proposed {C.fmt(t['proposed'], 's')}"
    C.record("P3", "our GRPO train step ÷ TRL 1.16 GRPOTrainer step (no generation)",
             C.ratios(t["ours"], t["trl"]), "<= 0.8", detail)
    C.record("P3-proposed", "what-if: our step + gqa_attention + logits_to_keep ÷ TRL step",
             C.ratios(t["proposed"], t["trl"]), "<= 0.8", detail)


if __name__ == "__main__":
    main()
