"""Tandem rollouts and our rewards inside TRL's ``GRPOTrainer`` (tested with TRL 1.16.0; docs/trl.md).

TRL 1.16's ``GRPOTrainer(rollout_func=...)`` (experimental on TRL's side) calls ``rollout_func(prompts,
trainer)`` once per generation batch, with or without vLLM, with one prompt per completion (its sampler has
already repeated each prompt ``num_generations`` times). The function returns ``prompt_ids``,
``completion_ids`` and ``logprobs`` (lists per row); an extra ``env_mask`` (1 = train on the token) is
multiplied into ``completion_mask`` for the loss, the same slot TRL's tool loop uses for tool output.
The model still reads every token (the attention mask is ``completion_mask``).

:func:`make_tandem_rollout` returns such a function: each completion is co-written by the trainer's
current model (the senior, the weights TRL trains) and a frozen ``junior`` through the in-process engine
(:mod:`tandem_rlvr.engines.rollout`), under a handoff schedule (:func:`~tandem_rlvr.engines.handoff.make_schedule`).
The owner mask goes out as ``env_mask``, after the fail-closed ownership check of every step
(:func:`~tandem_rlvr.training.ownership.check_ownership`); a trainer configuration under which TRL 1.16
would drop ``env_mask`` (tools, environments) is refused, so a lost mask never turns the run into plain GRPO.

:func:`reward` makes a built-in reward (``math``, ``gsm8k``, ``boxed_exact``) a TRL reward function. The
other way round (a TRL-style reward named in our config) is :func:`tandem_rlvr.rewards.registry.import_reward`.

``trl`` is optional (``pip install 'tandem-rlvr[trl]'``): it is imported only when a rollout runs.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Sequence
from typing import Any

import torch

from tandem_rlvr.engines.base import PromptBatch
from tandem_rlvr.engines.handoff import Schedule, make_schedule
from tandem_rlvr.engines.inprocess import InProcessEngine
from tandem_rlvr.engines.types import Rollout, Sampling
from tandem_rlvr.errors import TandemError
from tandem_rlvr.models import junior_eos_ids
from tandem_rlvr.seeds import derive_seed
from tandem_rlvr.training.ownership import check_ownership

__all__ = ["TESTED_TRL_VERSIONS", "TandemRollout", "make_tandem_rollout", "prompt_ids_like_trl", "require_trl",
           "reward", "trl_batch"]

TESTED_TRL_VERSIONS = ("1.16.0",)  # rollout_func's contract (and where env_mask goes) was read from these


def require_trl():
    """The ``trl`` package, or one clear error saying how to install it."""
    try:
        import trl  # the installed TRL, not this module: absolute import
    except ImportError as e:
        raise TandemError(f"tandem_rlvr.trl needs TRL: pip install 'tandem-rlvr[trl]' "
                          f"(trl=={TESTED_TRL_VERSIONS[-1]}); importing it failed: {e}") from None
    if trl.__version__ not in TESTED_TRL_VERSIONS:
        warnings.warn(f"tandem_rlvr.trl was tested with TRL {', '.join(TESTED_TRL_VERSIONS)}, not {trl.__version__}; "
                      "its rollout_func is experimental and may have changed", UserWarning, stacklevel=3)
    return trl


def trl_batch(rollout: Rollout, schedule: Schedule, budget: int) -> tuple[dict[str, list], dict[str, float]]:
    """Check ``rollout``'s ownership mask against ``schedule``'s record (raises :class:`TandemError`); then
    the dict TRL's ``rollout_func`` returns: per row, ``prompt_ids`` (without padding), ``completion_ids``
    and the senior's ``logprobs`` up to the row's end, and ``env_mask`` = the owner mask (1 = senior);
    and the step's coin metrics with ``rollout/senior_token_frac``. ``budget``: the max new tokens."""
    metrics = check_ownership(rollout, schedule, budget)
    prompts = PromptBatch(rollout.prompt_ids_BP.cpu(), rollout.prompt_mask_BP.cpu()).rows()
    n_B = rollout.response_mask_BT.long().sum(-1).tolist()
    ids, owner, logps = (x.cpu().tolist() for x in (rollout.response_ids_BT, rollout.owner_BT, rollout.senior_logps_BT))
    if min(n_B, default=0) < 1:
        raise TandemError("the tandem rollout returned an empty completion; refusing to train on it")
    batch = {"prompt_ids": prompts, "completion_ids": [r[:n] for r, n in zip(ids, n_B)],
             "logprobs": [r[:n] for r, n in zip(logps, n_B)], "env_mask": [r[:n] for r, n in zip(owner, n_B)]}
    return batch, {**metrics, "rollout/senior_token_frac": rollout.senior_token_frac()}


def prompt_ids_like_trl(tokenizer, prompts: list, trainer) -> list[list[int]]:
    """The prompts as TRL 1.16 tokenizes them itself: chat messages through the trainer's chat template
    (with the generation prompt), plain text through the tokenizer."""
    if prompts and isinstance(prompts[0], list):
        out = tokenizer.apply_chat_template(
            conversation=prompts, chat_template=getattr(trainer, "chat_template", None), add_generation_prompt=True,
            tokenize=True, return_dict=True, **(getattr(trainer, "chat_template_kwargs", None) or {}))
        return [list(r) for r in out["input_ids"]]
    return [list(r) for r in tokenizer(text=list(prompts))["input_ids"]]


def _sampling(trainer) -> Sampling:
    """The trainer's decoding settings; the ones our engine does not implement are refused, not ignored."""
    if getattr(trainer, "min_p", None) is not None or float(getattr(trainer, "repetition_penalty", 1.0) or 1.0) != 1.0:
        raise TandemError("tandem rollouts do not implement GRPOConfig.min_p / repetition_penalty; leave them unset")
    if getattr(trainer.args, "generation_kwargs", None):
        raise TandemError("tandem rollouts ignore GRPOConfig.generation_kwargs; leave it unset")
    return Sampling(max_new_tokens=int(trainer.max_completion_length), temperature=float(trainer.temperature),
                    top_p=float(trainer.top_p), top_k=int(trainer.top_k or 0))


def _refuse_dropped_mask(trainer) -> None:
    """TRL 1.16 reads ``env_mask`` only when the trainer has no tools; with tools it would train every token."""
    if getattr(trainer, "tools", None) or getattr(trainer, "environment_factories", None):
        raise TandemError("GRPOTrainer has tools or an environment_factory: TRL 1.16 then drops the rollout's env_mask "
                          "and would train on the junior's tokens; tandem rollouts need a trainer without them")


class TandemRollout:
    """TRL's ``rollout_func``: co-writes each completion with the frozen junior; see the module docstring.

    ``last`` holds the :class:`Rollout` of the latest call (owner mask, rounds, junior share) and
    ``last_metrics`` its coin metrics (``rollout/coins``, ``rollout/senior_coin_frac``, ``rollout/senior_token_frac``).
    """

    def __init__(self, junior, tokenizer, schedule: Schedule, *, max_rounds: int | None, mode: str, seed: int):
        self.junior, self.tokenizer, self.schedule = junior, tokenizer, schedule
        self.max_rounds, self.mode, self.seed = max_rounds, mode, int(seed)
        self.last: Rollout | None = None
        self.last_metrics: dict[str, float] = {}
        self.calls = 0

    def __call__(self, prompts: list, trainer) -> dict[str, list]:
        from trl.models import unwrap_model_for_generation

        _refuse_dropped_mask(trainer)
        sampling = _sampling(trainer)
        acc = trainer.accelerator
        ids = prompt_ids_like_trl(self.tokenizer, prompts, trainer)
        batch = PromptBatch.left_padded(ids, self.tokenizer.pad_token_id, device=acc.device)
        # a new seed per call and process, from the trainer's seeded RNG (a run with the same GRPOConfig.seed repeats)
        seed = derive_seed(int(torch.randint(0, 2**31 - 1, (1,)).item()), self.seed, int(acc.process_index))
        args = trainer.args
        with unwrap_model_for_generation(trainer.model_wrapped, acc,
                                         gather_deepspeed3_params=args.ds3_gather_for_generation,
                                         gradient_checkpointing_kwargs=args.gradient_checkpointing_kwargs) as senior:
            self._junior_to(senior)
            was_training = senior.training
            senior.eval()
            try:
                engine = InProcessEngine(senior, self.junior, eos_token_ids=trainer.eos_token_ids,
                                         pad_token_id=self.tokenizer.pad_token_id, mode=self.mode,
                                         junior_eos_token_ids=junior_eos_ids(self.tokenizer, senior, self.junior))
                rollout = engine.generate(batch, self.schedule, sampling, seed=seed, max_rounds=self.max_rounds)
            finally:
                senior.train(was_training)
        out, self.last_metrics = trl_batch(rollout, self.schedule, sampling.max_new_tokens)
        self.last, self.calls = rollout, self.calls + 1
        return out

    def _junior_to(self, senior) -> None:
        device = next(senior.parameters()).device
        if next(self.junior.parameters()).device != device:
            self.junior.to(device)


def make_tandem_rollout(junior, tokenizer, *, schedule: str = "word", p: float = 0.5, max_gap: int = 32,
                        chunk_size: int = 16, max_rounds: int | None = None, mode: str = "lockstep",
                        seed: int = 0) -> TandemRollout:
    """A ``rollout_func`` for TRL's ``GRPOTrainer``: the trainer's model and the frozen ``junior`` co-write
    every completion under handoff ``schedule`` (``word``, ``bernoulli``, ``step``, ``chunk``, ``alternate``
    or ``none``) with senior probability ``p``; see docs/trl.md.

    ``junior`` shares the senior's tokenizer (``tokenizer``, also the one the trainer gets) and output
    vocabulary; it is put in eval mode with gradients off and moved to the senior's device. ``max_gap`` /
    ``chunk_size``: as in ``handoff`` of our config; ``max_rounds`` ends a completion before its
    ``max_rounds + 1``-th turn; ``mode``: ``lockstep`` or ``catchup`` (same tokens).
    """
    require_trl()
    vocab = junior.get_output_embeddings().weight.shape[0]
    sched = make_schedule(schedule, tokenizer, p=p, max_gap=max_gap, chunk_size=chunk_size, vocab_size=vocab)
    if tokenizer.pad_token_id is None:
        raise TandemError("the tokenizer has no pad token; set tokenizer.pad_token (TRL needs one as well)")
    junior.eval()
    junior.requires_grad_(False)
    return TandemRollout(junior, tokenizer, sched, max_rounds=max_rounds, mode=mode, seed=seed)


def reward(name: str, *, answer_column: str = "answer", time_limit: float | None = None) -> Callable[..., list[float]]:
    """Built-in reward ``name`` (``math``, ``gsm8k``, ``boxed_exact``) as a TRL reward function.

    TRL calls it as ``f(prompts=, completions=, completion_ids=, **columns)``; the gold answers are the
    dataset column ``answer_column``. Completions may be strings or conversational message lists. Each
    check runs on the shared scorer, at most ``time_limit`` seconds (default 2; a timeout scores 0).
    """
    from tandem_rlvr.rewards import REWARD_FNS, score_batch

    if name not in REWARD_FNS:
        raise TandemError(f"unknown reward {name!r}; valid: {', '.join(sorted(REWARD_FNS))}")

    def reward_func(completions: Sequence[Any], **columns: Any) -> list[float]:
        if answer_column not in columns:
            have = sorted(k for k in columns if k not in ("prompts", "completion_ids", "trainer_state", "log_extra",
                                                          "log_metric", "environments"))
            raise TandemError(f"reward {name!r}: the dataset has no column {answer_column!r} for the gold answers "
                              f"(columns: {', '.join(have) or 'none'}); pass answer_column=")
        golds = columns[answer_column]
        scores, _ = score_batch(list(completions), list(golds), reward=name, time_limit=time_limit)
        return [float(s) for s in scores]

    reward_func.__name__ = f"{name}_reward"  # TRL logs each reward under its function's name
    return reward_func
