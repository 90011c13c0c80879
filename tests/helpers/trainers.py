"""In-process trainers on tiny models: examples, rewards with spread on random models, the two models, and
small configs (the fixtures here are imported by the test modules that use them)."""

from __future__ import annotations

import copy
from dataclasses import dataclass

import pytest

from helpers.tiny_models import make_tiny_model
from tandem_rlvr.config import load_config
from tandem_rlvr.models import Pair, freeze
from tandem_rlvr.training.trainer import make_trainer


@dataclass(frozen=True)
class Ex:
    id: str
    problem: str
    answer: str


def examples(n: int) -> list[Ex]:
    """``n`` problems "What is i plus 1?" with answer i + 1."""
    return [Ex(str(i), f"What is {i} plus 1?", str(i + 1)) for i in range(n)]


EXAMPLES = examples(12)


def length_reward(completion: str, gold: str) -> float:
    """A reward with spread on random models (so advantages are not all zero)."""
    return float(len(completion) % 3 == 0)


def spread_reward(completion: str, gold: str) -> float:
    """Deterministic partial credit with spread on random models (so nearly every group has std > 0)."""
    return (len(completion) % 5) / 4.0


@pytest.fixture(scope="module")
def base_models(tokenizer):
    """A tiny senior (hidden 48) and a frozen tiny junior (hidden 32) on the fixture tokenizer."""
    return make_tiny_model(len(tokenizer), 0, 48), freeze(make_tiny_model(len(tokenizer), 1, 32))


def trainer_config(tmp_path, arm="trlvr", *extra):
    """Two steps of 4 prompts x 4 rollouts x 16 tokens of ``arm`` (kl_reg with kl_beta 0.05 unless given)."""
    over = [f"algo.arm={arm}", "model.senior=unused", "model.junior=unused", "train.steps=2",
            "train.prompts_per_step=4", "algo.group_size=4", "algo.mini_batch_prompts=2",
            "rollout.max_new_tokens=16", f"train.out_dir={tmp_path / arm}", "algo.lr=1e-3",
            "train.save_every=0", "train.progress=false", *extra]
    if arm == "kl_reg" and not any(e.startswith("algo.kl_beta") for e in extra):
        over.append("algo.kl_beta=0.05")
    return load_config(None, over)


def tiny_trainer(cfg, tokenizer, base_models):
    """A trainer of ``cfg`` on copies of the two models, with length_reward on EXAMPLES."""
    s, j = base_models
    return make_trainer(cfg, pair=Pair(copy.deepcopy(s), copy.deepcopy(j), tokenizer),
                   reward_fn=length_reward, examples=EXAMPLES)


def word_trainer(tmp_path, tokenizer, models, *extra):
    """Three steps of 4 prompts x 4 rollouts x 32 tokens with word handoffs at p = 0.5 (seed 0)."""
    cfg = load_config(None, [
        "algo.arm=trlvr", "model.senior=unused", "model.junior=unused", "train.steps=3", "train.prompts_per_step=4",
        "algo.group_size=4", "rollout.max_new_tokens=32", "handoff.schedule=word", "handoff.p=0.5", "train.seed=0",
        f"train.out_dir={tmp_path / 'run'}", "train.save_every=0", "train.progress=false", "algo.lr=1e-3", *extra])
    s, j = models
    return make_trainer(cfg, pair=Pair(copy.deepcopy(s), copy.deepcopy(j), tokenizer), reward_fn=length_reward,
                   examples=EXAMPLES)
