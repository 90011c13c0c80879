"""The demo's plans (sizes of a ``quick`` or ``full`` run, per built-in world), its runs and the
training config of one run.

A demo trains the arms ``grpo``, ``trlvr`` and ``kl_reg`` (one run per β of the KL sweep) from the same
warm start, same steps, per seed; :func:`train_config` is the config each run trains with.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from pathlib import Path

from tandem_rlvr.config import load_config, set_dotted
from tandem_rlvr.world.registry import DEFAULT_WORLD, WORLDS, get_world

__all__ = ["FULL", "PLANS", "QUICK", "SHORTHAND_FULL", "SHORTHAND_QUICK", "SOURCES", "DemoPlan", "plans", "run_names",
           "split_run", "style_rate", "train_config", "with_changes"]


@dataclass(frozen=True)
class DemoPlan:
    """Sizes of one demo run (``quick`` or ``full``)."""

    seeds: int = 5
    steps: int = 20
    prompts_per_step: int = 8
    group_size: int = 8
    max_new_tokens: int = 112  # the longest plain solution of the test split (6 operations) is ~105 tokens
    eval_problems: int = 48
    eval_n: int = 4
    curve_ps: tuple = (1.0, 0.75, 0.5, 0.25)
    lr: float = 1e-4
    kl_betas: tuple = (0.01, 0.1, 1.0)  # the kl_reg ablation's sweep, from too weak to too strong
    val_every: int = 5  # senior-alone validation every this many steps (0: off)
    val_problems: int = 32
    val_n: int = 4
    select: str = "pass@4"  # the evaluated checkpoint: best validation pass@K (the paper's); "" = the final step
    loss_type: str = "dapo"  # token mean over the step's loss tokens (the paper's configs); "grpo": per-sequence mean
    overrides: dict = field(default_factory=dict)


FULL = DemoPlan()
QUICK = DemoPlan(seeds=1, steps=6, prompts_per_step=8, group_size=4, eval_problems=16, eval_n=2,
                 curve_ps=(1.0, 0.5), val_every=3, val_problems=8, val_n=2, select="pass@2")


def plans(world: str = DEFAULT_WORLD) -> tuple[DemoPlan, DemoPlan]:
    """``(full, --quick)`` plans of a built-in world: :data:`FULL` and :data:`QUICK` with the sizes its record
    changes (:attr:`tandem_rlvr.world.registry.World.demo_plan`); an unknown world is an
    :class:`~tandem_rlvr.world.registry.UnknownWorldError` naming the known ones."""
    changes = dict(get_world(world, "demo world").demo_plan)
    if not changes:
        return FULL, QUICK
    return replace(FULL, **changes), replace(QUICK, **changes)


def with_changes(plan: DemoPlan, *, seeds: int | None = None, budget: int | None = None,
                 kl_betas=None) -> DemoPlan:
    """``plan`` with the command line's changes (None: keep the plan's): ``seeds`` per run, the token
    ``budget`` (``max_new_tokens`` of the training rollouts, the validation and the evaluation) and the KL-Reg
    sweep's ``kl_betas`` (empty: no ``kl_reg`` runs, only ``grpo`` and ``trlvr``). The values are checked by
    :func:`tandem_rlvr.preflight.check_demo`."""
    changes = {"seeds": seeds, "max_new_tokens": budget, "kl_betas": None if kl_betas is None else tuple(kl_betas)}
    changes = {k: v for k, v in changes.items() if v is not None}
    return replace(plan, **changes) if changes else plan


PLANS = {name: plans(name) for name in WORLDS}  # (full, --quick) per world
SHORTHAND_FULL, SHORTHAND_QUICK = PLANS["shorthand"]  # ``--world shorthand`` (meant for ``--junior self``)
SOURCES = {name: w.source for name, w in WORLDS.items()}  # each world's data source: load_examples("<source>/<split>")


def style_rate(world: str):
    """The world's compressed-style detector over texts (the report's "jargon rate" row): the arithmetic
    world's jargon, the shorthand world's shorthand (:meth:`tandem_rlvr.world.registry.World.style_rate`)."""
    return get_world(world).style_rate()


def run_names(plan: DemoPlan) -> list[str]:
    """The trained runs of one seed: ``grpo``, ``trlvr`` and ``kl_reg@β`` for every β of the sweep."""
    return ["grpo", "trlvr", *(f"kl_reg@{float(b):g}" for b in plan.kl_betas)]


def split_run(name: str) -> tuple[str, float]:
    """``(arm, kl_beta)`` of a run name from :func:`run_names`."""
    arm, _, beta = name.partition("@")
    return arm, float(beta) if beta else 0.0


def train_config(run: str, seed: int, out_dir: Path, plan: DemoPlan, senior_dir: str, junior_dir: str | None,
                 progress: bool = True, world: str = DEFAULT_WORLD):
    """The demo's training config for one run (:func:`run_names`) and seed (the same for every run but
    ``algo.arm`` and ``algo.kl_beta``)."""
    arm, beta, source = *split_run(run), get_world(world).source
    base = {
        "model": {"senior": senior_dir, **({"junior": junior_dir} if junior_dir else {"self_paired": True})},
        "algo": {"arm": arm, "group_size": plan.group_size, "loss_type": plan.loss_type, "lr": plan.lr,
                 "mini_batch_prompts": plan.prompts_per_step // 2, "kl_beta": beta,
                 "micro_batch": 8},  # length-sorted chunks of 8 rollouts skip most padding: ~25% faster updates on a CPU
        "handoff": {"schedule": "word", "p": 0.5, "max_gap": 32},
        "rollout": {"max_new_tokens": plan.max_new_tokens, "temperature": 0.6, "max_prompt_tokens": 256},
        "train": {"steps": plan.steps, "prompts_per_step": plan.prompts_per_step, "save_every": 0,
                  "seed": seed, "out_dir": str(out_dir), "progress": progress},
        "data": {"train": f"{source}/train", "reward": "math", "reward_workers": 1},
        "val": {"data": f"{source}/val", "every": plan.val_every, "n": plan.val_n, "limit": plan.val_problems,
                "select": plan.select or "pass@1"},
    }
    for dotted, value in plan.overrides.items():
        set_dotted(base, dotted, value)
    return load_config(base=base)
