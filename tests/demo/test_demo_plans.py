"""The demo's plans and training configs, per world, are those it had before the world registry.

``recorded_train_configs.json`` holds, for every world, plan (full, --quick), junior (weak "J", self),
seed (0, 3) and run, the keys of :func:`tandem_rlvr.demo.plan.train_config` whose values differ from the
config's defaults, and each plan's sizes; recorded from the code before the registry, the one change being
the arith world's data source name (``world/train`` then, ``arith/train`` now: the same problems,
tests/world/test_registry.py). The ``dialects`` world, added after the registry, was recorded as the
shorthand world's entries with its own data source (``dialects/train``, ``dialects/val``): the same plan.
Re-recorded once since, for the paper's protocol (issue 38): every plan's ``loss_type`` ``dapo`` (token
mean) and ``select`` (best validation pass@K evaluated), the full plans' validation 32 problems x 4
samples (16 x 2 before); nothing else changed. The demo's table depends on nothing else of its
configuration.
"""

import json
from pathlib import Path

import pytest

from tandem_rlvr.config import Config
from tandem_rlvr.demo.plan import PLANS, plans, run_names, train_config
from tandem_rlvr.world.registry import WORLDS

RECORDED = json.loads((Path(__file__).parent / "recorded_train_configs.json").read_text())


def _flat(d: dict, pre: str = "") -> dict:
    out = {}
    for k, v in d.items():
        if isinstance(v, dict) and v:
            out.update(_flat(v, f"{pre}{k}."))
        else:
            out[f"{pre}{k}"] = list(v) if isinstance(v, tuple) else v
    return out


def _plan_dict(plan) -> dict:
    return {k: list(v) if isinstance(v, tuple) else v for k, v in plan.__dict__.items()}


@pytest.mark.parametrize("world", list(WORLDS))
def test_each_worlds_plans_and_configs_are_the_recorded_ones(world):
    default = _flat(Config().to_dict())
    assert PLANS[world] == plans(world)
    seen = 0
    for kind, plan in zip(("full", "quick"), plans(world)):
        assert _plan_dict(plan) == RECORDED[f"{world} {kind} plan"]
        for junior in ("J", None):
            for seed in (0, 3):
                for run in run_names(plan):
                    cfg = _flat(train_config(run, seed, Path("OUT"), plan, "S", junior, progress=False,
                                             world=world).to_dict())
                    changed = {k: v for k, v in cfg.items() if default.get(k, object()) != v}
                    assert changed == RECORDED[f"{world} {kind} {junior or 'self'} {seed} {run}"], (world, kind, run)
                    seen += 1
    assert seen == sum(1 for k in RECORDED if k.startswith(f"{world} ") and not k.endswith(" plan"))


def test_every_recorded_world_is_still_built_in():
    assert {k.split()[0] for k in RECORDED} == set(WORLDS)
