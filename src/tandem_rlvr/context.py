"""The context check: does every model of a run read as far as the run writes?

A run reaches ``longest prompt + response budget`` positions. A rotary model past its trained length
computes positions it never saw, a learned-position model indexes out of range, and vLLM refuses an
engine longer than the model: each is a silent wrong result or a late traceback. So before the first
forward, :func:`fit_context` compares, for every model of the run (its own prompt lengths, on its own
tokenizer), the context the run reaches with what the model reads (:func:`model_context`):

* the response budget leaves no room for any prompt: a one-line error naming the model, its limit,
  the keys and their values, and the largest budget that fits;
* only some prompts are too long for the full budget: they are skipped and counted (one log line);
* ``model.max_context`` (eval: ``--max-context``) states the limit instead, for a model extended with
  rope scaling whose config does not say so: the run goes on with a warning.

The engines are sized from the same number (:attr:`ContextPlan.engine_len`). Torch-free.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Sequence

from tandem_rlvr.errors import ConfigError

log = logging.getLogger(__name__)

__all__ = ["ModelContext", "ContextPlan", "model_context", "fit_context", "UNKNOWN_LIMIT"]

UNKNOWN_LIMIT = 10**9  # tokenizers without a limit report ~1e30 (transformers' VERY_LARGE_INTEGER)
# rope types whose factor stretches max_position_embeddings (vLLM derives the same); llama3 and
# longrope configs already state the extended length in max_position_embeddings
_STRETCHING_ROPE = ("linear", "dynamic", "yarn")


@dataclass(frozen=True)
class ModelContext:
    """What one model of the run reads: ``limit`` positions (None: unknown), decided by ``source``."""

    role: str
    name: str
    limit: int | None
    source: str
    overridden: bool = False

    def describe(self) -> str:
        return f"the {self.role} {self.name!r} reads {self.limit} tokens ({self.source})"


@dataclass
class ContextPlan:
    """The outcome of :func:`fit_context`: which prompts stay, and the context the engines need."""

    keep: list[int]  # indices of the prompts that fit every model with the full response budget
    engine_len: int  # longest kept prompt + budget, capped at the smallest known limit
    skipped: int = 0  # prompts that fit max_prompt_tokens but not a model's context
    limits: list[ModelContext] = field(default_factory=list)


def _rope_factor(cfg) -> tuple[float, str]:
    """A stretching rope scaling declared in the config: (factor, rope type), else (1.0, "")."""
    for key in ("rope_parameters", "rope_scaling"):
        rope = getattr(cfg, key, None)
        if isinstance(rope, dict) and rope.get("factor"):
            kind = str(rope.get("rope_type") or rope.get("type") or "")
            if kind in _STRETCHING_ROPE:
                return float(rope["factor"]), kind
    return 1.0, ""


def model_context(role: str, name: str, config=None, tokenizer=None, override: int = 0) -> ModelContext:
    """The positions a model reads: ``override`` if > 0; else its config's ``max_position_embeddings``
    (times a declared linear/dynamic/yarn rope factor, from ``original_max_position_embeddings`` where
    given); else the tokenizer's ``model_max_length``; else unknown (no check, said once in the log)."""
    if override and override > 0:
        return ModelContext(role, name, int(override), "model.max_context, set by the user", overridden=True)
    cfg = config.get_text_config() if config is not None and hasattr(config, "get_text_config") else config
    mpe = getattr(cfg, "max_position_embeddings", None) if cfg is not None else None
    if isinstance(mpe, (int, float)) and mpe > 0:
        factor, kind = _rope_factor(cfg)
        if factor > 1:
            base = (cfg.rope_parameters if isinstance(getattr(cfg, "rope_parameters", None), dict)
                    else cfg.rope_scaling).get("original_max_position_embeddings") or mpe
            return ModelContext(role, name, int(base * factor), f"max_position_embeddings with {kind} rope x{factor:g}")
        return ModelContext(role, name, int(mpe), "max_position_embeddings")
    tml = getattr(tokenizer, "model_max_length", None) if tokenizer is not None else None
    if isinstance(tml, int) and 0 < tml < UNKNOWN_LIMIT:
        return ModelContext(role, name, tml, "the tokenizer's model_max_length")
    return ModelContext(role, name, None, "unknown: no max_position_embeddings or model_max_length")


def fit_context(models: Sequence[tuple[ModelContext, Sequence[int]]], budget: int, *, budget_key: str,
                prompt_key: str | None = None, max_prompt_tokens: int | None = None,
                override_key: str = "model.max_context", what: str = "run") -> ContextPlan:
    """Keep the prompts (indices into each model's ``prompt_lens``, one length per prompt on the model's
    own tokenizer) that every model reads whole with ``budget`` response tokens.

    Raises :class:`ConfigError` when no prompt fits a model; logs one line for the prompts it skips and
    one warning per overridden limit. Prompts over ``max_prompt_tokens`` are not this check's concern
    (the caller skips and counts them): pass only the ones within it.
    """
    n = len(models[0][1]) if models else 0
    keep = set(range(n))
    for ctx, lens in models:
        if len(lens) != n:
            raise ValueError(f"fit_context: {ctx.role} has {len(lens)} prompt lengths, expected {n}")
        if ctx.overridden:
            log.warning("%s: the %s %r is taken to read %d tokens (%s); nothing checks that it does", what, ctx.role,
                        ctx.name, ctx.limit, override_key)
        if ctx.limit is None:
            log.info("%s: the %s %r states no context length (%s); not checked", what, ctx.role, ctx.name, ctx.source)
            continue
        fits = {i for i in range(n) if lens[i] + budget <= ctx.limit}
        if n and not fits:
            raise ConfigError(_too_long(ctx, lens, budget, budget_key, prompt_key, max_prompt_tokens, override_key))
        keep &= fits
    kept = sorted(keep)
    skipped = n - len(kept)
    if skipped:
        tight = min((c for c, _ in models if c.limit is not None), key=lambda c: c.limit)
        log.warning("%s: skipped %d of %d prompts whose prompt + %s=%d exceeds a model's context (smallest: %s)",
                    what, skipped, n, budget_key, budget, tight.describe())
    limits = [c.limit for c, _ in models if c.limit is not None]
    longest = max((lens[i] for _, lens in models for i in kept), default=0)
    engine_len = longest + budget if not limits else min(longest + budget, min(limits))
    return ContextPlan(keep=kept, engine_len=engine_len, skipped=skipped, limits=[c for c, _ in models])


def _too_long(ctx: ModelContext, lens, budget, budget_key, prompt_key, max_prompt_tokens, override_key) -> str:
    shortest, longest = min(lens), max(lens)
    fit_any, fit_all = ctx.limit - shortest, ctx.limit - longest
    msg = (f"{ctx.describe()}, but {budget_key}={budget} leaves no room for a prompt (the shortest has {shortest} "
           f"tokens): set {budget_key} <= {fit_any}" if fit_any >= 1 else
           f"{ctx.describe()}, but even the shortest prompt has {shortest} tokens: no {budget_key} fits")
    if fit_any >= 1 and fit_all >= 1 and fit_all < fit_any:
        msg += f" ({budget_key} <= {fit_all} keeps every prompt)"
    if prompt_key and max_prompt_tokens is not None:
        msg += f"; {prompt_key}={max_prompt_tokens}"
    return msg + f"; if the model reads more than its config says (rope scaling), set {override_key}"


def engine_len(cfg, plan: ContextPlan) -> int:
    """The context a training run's vLLM engine needs: the run's (longest kept prompt + budget) and, when it
    validates there, any validation prompt within rollout.max_prompt_tokens with the validation budget,
    capped at the models' limits."""
    if not cfg.val.every:
        return plan.engine_len
    need = cfg.rollout.max_prompt_tokens + (cfg.val.max_new_tokens or cfg.rollout.max_new_tokens)
    limits = [c.limit for c in plan.limits if c.limit is not None]
    return max(plan.engine_len, min([need, *limits]))
