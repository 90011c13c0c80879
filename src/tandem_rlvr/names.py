"""Names the configuration checks, torch-free: the handoff schedules, the loss types, the FSDP modes, the rewards.

What they *mean* lives in :mod:`tandem_rlvr.engines.handoff` (schedules) and :mod:`tandem_rlvr.training.core` (losses),
which take their lists from here. Each schedule's *level* says where its coins fall (what an engine
must be able to hand over at):

- ``solo``: no handoff (``none``);
- ``token``: a coin may fall after any token (``bernoulli``, ``chunk``, ``word``);
- ``step``: coins fall only where a reasoning step ends, at ``"\\n\\n"`` (``step``, ``alternate``).
"""

from __future__ import annotations

LEVELS = {"none": "solo", "bernoulli": "token", "word": "token", "step": "step", "alternate": "step", "chunk": "token"}
SCHEDULES = tuple(LEVELS)
STEP_END = "\n\n"
WORD_MARKERS = ("Ġ", "▁", " ")
NEEDS_TABLE = ("word", "step", "alternate")  # schedules that read the tokens' text
COIN_SCHEDULES = tuple(n for n in SCHEDULES if n not in ("none", "alternate"))  # authors drawn by coins, P(senior) = p


def check_name(name: str) -> None:
    """Raise ``ValueError`` unless ``name`` is a schedule."""
    if name not in LEVELS:
        raise ValueError(f"unknown handoff schedule {name!r}; choose one of {', '.join(SCHEDULES)}")


LOSS_TYPES = ("grpo", "dapo", "token_mean", "dr_grpo")
TOKEN_MEAN_LOSSES = ("dapo", "token_mean")  # divided by a (global) token count, not per sequence
FSDP_MODES = ("off", "full", "zero2")  # train.fsdp; see tandem_rlvr.training.fsdp
# model.attn_implementation: "" = transformers' default; the others as transformers names them
ATTN_IMPLEMENTATIONS = ("", "eager", "sdpa", "flash_attention_2", "flash_attention_3", "flex_attention")
# model.mixed_precision: "" = the accelerate launch config's; off = accelerate's "no" (YAML reads an unquoted no as off)
MIXED_PRECISION = ("", "off", "bf16", "fp16")
REWARD_KINDS = ("math", "gsm8k", "boxed_exact")  # data.reward's built-in rewards; see tandem_rlvr.rewards
VLLM_SLEEP = ("off", "kv", "weights")  # rollout.vllm_sleep; see tandem_rlvr.engines.vllm_backend.EngineSleep
