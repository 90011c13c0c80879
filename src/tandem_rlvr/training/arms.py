"""What distinguishes the arms (rollout schedule, trained tokens, KL weight) and the log-probs of a
rollout under a model: the pieces of a step that are not the loop (:mod:`tandem_rlvr.training.trainer`)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from tandem_rlvr.config import Config
from tandem_rlvr.errors import TandemError
from tandem_rlvr.engines.handoff import Schedule
from tandem_rlvr.engines.types import Rollout


@dataclass(frozen=True)
class ArmPlan:
    """What distinguishes the arms: rollout schedule, which tokens are trained, KL weight."""

    schedule: str
    mask_owner: bool
    kl_beta: float


def arm_plan(cfg: Config) -> ArmPlan:
    """trlvr: tandem rollouts, senior tokens only; grpo: solo, all tokens; kl_reg: solo + β·KL."""
    a = cfg.algo
    if a.arm == "trlvr":
        return ArmPlan(cfg.handoff.schedule, True, 0.0)
    if a.arm == "grpo":
        return ArmPlan("none", False, 0.0)
    if a.arm == "kl_reg":
        return ArmPlan("none", False, a.kl_beta)
    raise ValueError(f"unknown arm {a.arm!r}")


def loss_mask(rollout: Rollout, plan: ArmPlan, reduce: Callable[[float], float] = float) -> torch.Tensor:
    """``response_mask * owner`` for tandem arms, ``response_mask`` otherwise; fails closed: no senior token in
    the whole step is an error. ``reduce`` sums a number over the processes (identity in one process): one
    process's rows may hold no senior token while others' do (its loss is then an exact zero)."""
    mask = rollout.response_mask_BT.float()
    if not plan.mask_owner:
        return mask
    if rollout.owner_BT is None:
        raise TandemError("the trlvr arm needs ownership records, but the rollout has none")
    if rollout.owner_BT.shape != mask.shape:
        raise TandemError(f"ownership mask shape {tuple(rollout.owner_BT.shape)} != response shape {tuple(mask.shape)}")
    masked = mask * rollout.owner_BT.float()
    if reduce(float(masked.sum())) == 0:
        raise TandemError("the ownership mask selects no senior token in this step (on any process); refusing to train")
    return masked


def check_senior_frac(frac: float, band: list | None, schedule: Schedule) -> None:
    """Stop when a tandem step's senior token share leaves ``band`` (``algo.senior_frac_band``, when one is
    set); ``schedule`` is the run's handoff schedule (named in the message)."""
    if band is None:
        return
    lo, hi = band
    if not lo <= frac <= hi:
        raise TandemError(
            f"senior token fraction {frac:.3f} is outside algo.senior_frac_band [{lo:.2f}, {hi:.2f}] "
            f"(handoff.schedule={schedule.name}, p={schedule.p}); the handoff is not doing what the config says"
        )
