"""Names the configuration checks, torch-free: the loss types, the FSDP modes, the rewards, the sleep modes.

The handoff schedules are registered in :mod:`tandem_rlvr.engines.schedules` (each defined once, with its
level, parameters and rule; the configuration takes their names from there). What the loss types mean
lives in :mod:`tandem_rlvr.training.core`, which takes its list from here.
"""

from __future__ import annotations

LOSS_TYPES = ("grpo", "dapo", "token_mean", "dr_grpo")
TOKEN_MEAN_LOSSES = ("dapo", "token_mean")  # divided by a (global) token count, not per sequence
FSDP_MODES = ("off", "full", "zero2")  # train.fsdp; see tandem_rlvr.training.fsdp
# model.attn_implementation: "" = transformers' default; the others as transformers names them
ATTN_IMPLEMENTATIONS = ("", "eager", "sdpa", "flash_attention_2", "flash_attention_3", "flex_attention")
# model.mixed_precision: "" = the accelerate launch config's; off = accelerate's "no" (YAML reads an unquoted no as off)
MIXED_PRECISION = ("", "off", "bf16", "fp16")
REWARD_KINDS = ("math", "gsm8k", "boxed_exact")  # data.reward's built-in rewards; see tandem_rlvr.rewards
VLLM_SLEEP = ("off", "kv", "weights")  # rollout.vllm_sleep; see tandem_rlvr.engines.vllm_backend.EngineSleep
