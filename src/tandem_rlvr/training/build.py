"""Assembly of a training run: the one place that turns a :class:`~tandem_rlvr.config.Config` into the
parts a run works with (accelerator, models, optimizer, handoff schedule, rollout engine, data, reward).

:func:`build_run` makes them in the order they depend on each other (the run directory before anything
is loaded, the schedule from the senior's vocabulary, FSDP sharding before the optimizer, the engine from
the unwrapped senior) and returns a :class:`RunParts`; :class:`~tandem_rlvr.training.trainer.Trainer`
receives the parts and makes nothing itself (:func:`~tandem_rlvr.training.trainer.make_trainer` does both).
"""

from __future__ import annotations

import functools
import logging
import math
import os
import random
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from tandem_rlvr import preflight
from tandem_rlvr.config import LR_DECAYS, Config
from tandem_rlvr.context import engine_len
from tandem_rlvr.engines.handoff import Schedule, make_schedule
from tandem_rlvr.engines.schedules import config_params
from tandem_rlvr.errors import TandemError
from tandem_rlvr.rewards import import_reward
from tandem_rlvr.training import dist, fsdp, preempt, rundir
from tandem_rlvr.training.arms import arm_plan
from tandem_rlvr.training.engine_spec import training_engine

__all__ = ["RunParts", "build_run", "run_schedule", "seed_everything"]


@dataclass
class RunParts:
    """What a run is made of. ``senior`` is the trained model as the optimizer sees it (DDP-prepared, or
    FSDP-sharded: ``sharded``); ``pair`` holds the frozen junior and the tokenizer(s); ``schedule`` is the
    trlvr arm's handoff schedule (``none`` for the solo arms), the only copy of ``handoff.p`` the run
    reads; ``prompts`` are the prompts that fit the context, ``prompt_example[i]`` the example of
    prompt ``i``; ``reward_fn`` an in-process ``reward(completion, gold)`` or None (the config's verifier
    in worker processes); ``resume_from`` the checkpoint to resume from (None: a fresh run); ``lock`` the run
    directory's lock (:mod:`tandem_rlvr.runlock`; the main process holds it, None elsewhere)."""

    acc: object
    pair: object
    senior: torch.nn.Module
    sharded: bool
    opt: torch.optim.Optimizer
    lr_sched: torch.optim.lr_scheduler.LRScheduler
    schedule: Schedule
    engine: object
    eos: list[int]
    examples: list
    prompts: list[list[int]]
    prompt_example: list[int]
    context: int
    reward_fn: Callable | None
    resume_from: Path | None
    text_metrics: Callable | None = None
    lock: object | None = None


def run_schedule(cfg: Config, tokenizer, vocab_size: int) -> Schedule:
    """The handoff schedule of ``cfg``'s arm (trlvr: ``handoff.*``; grpo and kl_reg: ``none``)."""
    return make_schedule(arm_plan(cfg).schedule, tokenizer, p=cfg.handoff.p, **config_params(cfg.handoff),
                         vocab_size=vocab_size)


def build_run(cfg: Config, *, plan: preflight.RunPlan | None = None, pair=None, reward_fn=None, examples=None,
              restart: bool = False, text_metrics=None, vllm_engine=None) -> RunParts:
    """Every part of the run ``cfg`` describes. ``plan``: what :func:`~tandem_rlvr.preflight.check_train` returned
    for ``cfg`` (None: the checks run here first); its data, tokenized prompts and context check are used, not
    made again. ``pair``/``examples`` replace loading from the config (their prompts are fitted here);
    ``reward_fn(completion, gold)`` replaces the verifier (in-process); ``text_metrics(texts) -> dict``
    adds rollout metrics; ``vllm_engine`` replaces vLLM's engines (tests); ``restart`` empties the run
    directory instead of resuming from it. The main process holds the run directory's lock from here on
    (``RunParts.lock``)."""
    if plan is None:
        plan = preflight.check_train(cfg, models=pair is None, data=examples is None, reward=reward_fn is None)
    acc = _accelerator(cfg)
    lock, resume_from = _prepare_run_dir(acc, cfg, restart)
    try:
        return _build_parts(cfg, acc, lock, resume_from, plan, pair, reward_fn, examples, text_metrics, vllm_engine)
    except BaseException:
        if lock is not None:
            lock.release()
        raise


def _build_parts(cfg, acc, lock, resume_from, plan, pair, reward_fn, examples, text_metrics, vllm_engine) -> RunParts:
    from tandem_rlvr.models import eos_ids, junior_eos_ids, load_pair

    if cfg.mini_batch_prompts() % acc.num_processes:
        raise TandemError(f"algo.mini_batch_prompts={cfg.mini_batch_prompts()} must be divisible by the "
                          f"number of processes ({acc.num_processes}) so each owns whole prompt groups")
    note = dist.chunk_note(cfg.rollout.batch_size, cfg.algo.group_size, cfg.mini_batch_prompts(), acc.num_processes)
    if note and acc.is_main_process:
        logging.getLogger(__name__).warning(note)
    seed_everything(cfg.train.seed)
    plan = _usable_plan(cfg, plan, pair, examples)
    pair = pair if pair is not None else load_pair(cfg.model)
    plan = plan if plan.fitted else preflight.fit_pair_prompts(cfg, pair, plan.examples)
    examples = plan.examples
    eos = eos_ids(pair.tokenizer, pair.senior)
    junior_eos = list(pair.junior_eos) or junior_eos_ids(pair.tokenizer, pair.senior, pair.junior)
    prompt_example, prompts, context = plan.prompt_example, plan.prompts, plan.context
    reward_fn = reward_fn if reward_fn is not None else import_reward(cfg.data.reward)
    schedule = run_schedule(cfg, pair.tokenizer, pair.senior.get_output_embeddings().weight.shape[0])
    senior, opt, lr_sched = _senior_and_optimizer(cfg, acc, pair)
    if hasattr(pair.junior, "to"):
        pair.junior.to(acc.device)
    engine = training_engine(cfg, pair, acc.unwrap_model(senior), schedule, eos_token_ids=eos, junior_eos_token_ids=junior_eos,
                             hold_casts=acc.mixed_precision != "no",
                             num_processes=acc.num_processes, vllm_engine=vllm_engine,
                             max_model_len=engine_len(cfg, context))
    engine.check(schedule)
    return RunParts(acc=acc, pair=pair, senior=senior, sharded=cfg.train.fsdp != "off", opt=opt, lr_sched=lr_sched,
                    schedule=schedule, engine=engine, eos=eos, examples=examples, prompts=prompts,
                    prompt_example=prompt_example, context=context, reward_fn=reward_fn, resume_from=resume_from, text_metrics=text_metrics,
                    lock=lock)


def _usable_plan(cfg: Config, plan: preflight.RunPlan, pair=None, examples=None) -> preflight.RunPlan:
    """The part of ``plan`` a run built with these ``pair``/``examples`` can use: all of it where they are None
    (the plan then read and fitted what the config names), else its examples (``examples`` where given),
    unfitted (the builder fits them on the given pair). The validation problems the plan read are the ones the
    run validates on (:func:`~tandem_rlvr.evaluation.validation.use_val_examples`)."""
    from tandem_rlvr.data import train_examples
    from tandem_rlvr.evaluation.validation import use_val_examples

    if plan.val_examples is not None:
        use_val_examples(cfg, plan.val_examples)
    if pair is None and (examples is None or examples is plan.examples) and plan.fitted:
        return plan
    examples = examples if examples is not None else plan.examples if plan.examples is not None else train_examples(cfg)
    return preflight.RunPlan(examples=examples, val_examples=plan.val_examples)


def _accelerator(cfg: Config):
    """The run's accelerator; without a GPU, ``cpu=True`` lets accelerate/torchrun run gloo DDP over CPU processes.
    ``model.mixed_precision`` (empty: the accelerate launch config's) is checked against the machine first."""
    from accelerate import Accelerator

    cuda = torch.cuda.is_available()
    check_mixed_precision(cfg, cuda)
    acc = Accelerator(log_with=cfg.train.trackers or None, project_dir=cfg.train.out_dir, cpu=not cuda,
                      mixed_precision=ACCELERATE_MP.get(cfg.model.mixed_precision, cfg.model.mixed_precision),
                      kwargs_handlers=preempt.process_group_kwargs(cfg))
    dist.check_supported(acc.distributed_type)
    if cfg.train.fsdp != "off" and acc.num_processes < 2:
        raise TandemError(f"train.fsdp={cfg.train.fsdp} shards the senior over processes, but this is one process: "
                          "launch with accelerate launch --config_file \"$(tandem-rlvr config-show --path accelerate/ddp)\" "
                          "(or torchrun), "
                          "or set train.fsdp=off")
    return acc


ACCELERATE_MP = {"": None, "off": "no"}  # model.mixed_precision -> Accelerator(mixed_precision=...); None: the launch's


def check_mixed_precision(cfg: Config, cuda: bool) -> None:
    """The run's mixed precision (``model.mixed_precision``, else the launch config's ``ACCELERATE_MIXED_PRECISION``)
    where it would silently not apply or fail at the first update: fp16 without a CUDA GPU (accelerate then runs in
    fp32), over weights that are not float32 (the loss scaler refuses fp16 gradients) or under ``train.fsdp`` (the
    sharded senior's optimizer gets no loss scaling)."""
    key = "model.mixed_precision" if cfg.model.mixed_precision else "the accelerate launch config's mixed_precision"
    mp = cfg.model.mixed_precision or os.environ.get("ACCELERATE_MIXED_PRECISION", "no")
    if mp == "fp16" and not cuda:
        raise TandemError(f"{key} is fp16, which needs a CUDA GPU (none here: accelerate would run in float32); "
                          "use bf16 or no")
    if mp == "fp16" and cfg.model.dtype != "float32":  # the launch config's (the run config's is refused earlier)
        raise TandemError(f"{key} is fp16, which needs float32 weights (accelerate's loss scaler cannot unscale "
                          f"half-precision gradients), but model.dtype is {cfg.model.dtype}: set model.dtype=float32, or bf16 "
                          "or no mixed precision")
    if mp == "fp16" and cfg.train.fsdp != "off":
        raise TandemError(f"{key} is fp16, which train.fsdp={cfg.train.fsdp} does not support (no loss scaling for "
                          "the sharded senior); use bf16")
    if cuda and mp in ("no", "off") and cfg.model.dtype == "float32":
        logging.getLogger(__name__).warning(
            "the senior trains in float32 compute on a GPU (model.dtype=float32, no mixed precision from %s): "
            "set model.mixed_precision=bf16 for bf16 compute over the float32 weights (faster, half the activations)",
            key)


def _prepare_run_dir(acc, cfg: Config, restart: bool):
    """The main process locks and prepares the run directory (:func:`~tandem_rlvr.training.rundir.open_run`);
    every process learns the outcome from it: its error (a refusal, or any other failure, stops them all with its
    message; the main process raises its own exception) or the checkpoint it chose to resume from (the other
    processes never look for one themselves). Returns ``(lock or None, resume_from)``."""
    from accelerate.utils import broadcast_object_list

    run_dir, outcome, lock, failure = Path(cfg.train.out_dir), [None, None], None, None  # [error, resume_from]
    if acc.is_main_process:
        try:
            lock, resume_from = rundir.open_run(run_dir, cfg, restart)
            outcome = [None, None if resume_from is None else str(resume_from)]
        except Exception as e:
            failure, outcome = e, [str(e) if isinstance(e, TandemError) else f"the main process failed to prepare the "
                                   f"run directory {str(run_dir)!r} ({type(e).__name__}: {e})", None]
    if acc.num_processes > 1:
        broadcast_object_list(outcome)
    if failure is not None:
        raise failure
    if outcome[0] is not None:
        raise TandemError(outcome[0])
    return lock, None if outcome[1] is None else Path(outcome[1])


def lr_factor(step: int, *, warmup: int, total: int, decay: str = "constant") -> float:
    """The learning rate of RL step ``step`` (0-based) as a fraction of ``algo.lr``: ``(step + 1) / warmup``
    during the warm-up, then ``constant`` 1, or ``linear`` / ``cosine`` from 1 after the warm-up down to 0 at
    step ``total`` (the run's last step, ``total - 1``, takes a last small step rather than none)."""
    if warmup > 0 and step < warmup:
        return (step + 1) / warmup
    if decay == "constant":
        return 1.0
    span = max(total - warmup, 1)
    done = min(max(step - warmup, 0), span) / span  # 0 at the first step after the warm-up, 1 at step ``total``
    if decay == "linear":
        return 1.0 - done
    if decay == "cosine":
        return 0.5 * (1.0 + math.cos(math.pi * done))
    raise ValueError(f"unknown lr decay {decay!r}; expected one of {', '.join(LR_DECAYS)}")


def _senior_and_optimizer(cfg: Config, acc, pair):
    """The senior as trained (FSDP-sharded before the optimizer sees it, else DDP-prepared with it), AdamW
    and the learning-rate schedule (:func:`lr_factor`). ``model.gradient_checkpointing`` (the senior only,
    before it is sharded)."""
    if getattr(cfg.model, "gradient_checkpointing", False):
        from tandem_rlvr.models import enable_gradient_checkpointing

        enable_gradient_checkpointing(pair.senior)
    if cfg.train.fsdp != "off":  # FSDP2 by hand (see tandem_rlvr.training.fsdp); the optimizer then sees the shards
        pair.senior = fsdp.shard(pair.senior.to(acc.device), cfg.train.fsdp, mixed_precision=str(acc.mixed_precision))
    params = [p for p in pair.senior.parameters() if p.requires_grad]
    opt = make_adamw(params, lr=cfg.algo.lr, weight_decay=cfg.algo.weight_decay)
    lr_sched = torch.optim.lr_scheduler.LambdaLR(opt, functools.partial(
        lr_factor, warmup=cfg.algo.warmup_steps, total=cfg.train.steps, decay=cfg.algo.lr_decay))
    junior_autocast(acc, pair.junior)  # under FSDP too: a float32 junior would otherwise compute in float32 on the GPU
    if cfg.train.fsdp != "off":
        return pair.senior, opt, lr_sched
    senior, opt = acc.prepare(pair.senior, opt)
    return senior, opt, lr_sched


def make_adamw(params: list, *, lr: float, weight_decay: float) -> torch.optim.AdamW:
    """AdamW over ``params``; fused where every parameter is on a CUDA device. PyTorch's default there
    (``foreach``) allocates a float32 copy of the second moments at every step (``_foreach_sqrt``), 16 GB for an
    unsharded 4B model, just when the update's memory peaks; the fused kernel allocates none and takes FSDP's
    sharded (DTensor) parameters. The CPU keeps the default, so CPU runs' numbers do not change."""
    fused = bool(params) and all(p.device.type == "cuda" for p in params)
    return torch.optim.AdamW(params, lr=lr, weight_decay=weight_decay, **({"fused": True} if fused else {}))


def junior_autocast(acc, junior) -> None:
    """Run the frozen junior's forwards under the senior's mixed precision (accelerate autocasts only the model it
    prepares). A float32 self-paired junior then computes what the senior computes, so the drift metrics and
    KL-Reg's term start at 0, not at a precision offset (a review measured 1.4e-3 nats at step 0 under bf16), and
    the junior's matrix products run in bf16 on the GPU. No-op without mixed precision, for the self-paired LoRA
    junior (the senior's own forward with the adapter off) and where already done."""
    if acc.mixed_precision == "no" or junior is None or not isinstance(junior, torch.nn.Module):
        return
    forward = junior.forward
    if getattr(forward, "_tandem_autocast", False):
        return

    @functools.wraps(forward)
    def autocast_forward(*args, **kwargs):
        with acc.autocast():
            return forward(*args, **kwargs)

    autocast_forward._tandem_autocast = True
    junior.forward = autocast_forward


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)
