"""The learning-rate schedule: a linear warm-up, then constant (the paper's), linear or cosine decay to 0 at the
run's last step (``algo.warmup_steps``, ``algo.lr_decay``); by hand, and as the trainer logs it."""

from __future__ import annotations

import math

import pytest

from tandem_rlvr.training.build import lr_factor


def test_the_factor_by_hand():
    # 2 warm-up steps of 10: 1/2, 2/2, then over the 8 steps after them 1 -> 0 at step 10
    assert [lr_factor(s, warmup=2, total=10, decay="linear") for s in range(11)] == pytest.approx(
        [0.5, 1.0, 1.0, 7 / 8, 6 / 8, 5 / 8, 4 / 8, 3 / 8, 2 / 8, 1 / 8, 0.0])
    cosine = [lr_factor(s, warmup=2, total=10, decay="cosine") for s in range(2, 11)]
    assert cosine == pytest.approx([0.5 * (1 + math.cos(math.pi * k / 8)) for k in range(9)])
    assert cosine[4] == pytest.approx(0.5) and cosine[-1] == pytest.approx(0.0, abs=1e-12)
    assert [lr_factor(s, warmup=0, total=3, decay="constant") for s in range(5)] == [1.0] * 5
    assert [lr_factor(s, warmup=4, total=3, decay="constant") for s in range(6)] == [0.25, 0.5, 0.75, 1.0, 1.0, 1.0]
    assert lr_factor(0, warmup=0, total=1, decay="linear") == 1.0  # a one-step run takes its step
    assert lr_factor(9, warmup=0, total=10, decay="linear") == pytest.approx(0.1)  # the last step is not wasted
    with pytest.raises(ValueError, match="lr decay"):
        lr_factor(3, warmup=0, total=10, decay="step")


_C = [0.5 * (1 + math.cos(math.pi * k / 4)) for k in range(4)]  # cosine over the 4 steps after the warm-up


@pytest.mark.parametrize("decay,want", [("linear", [0.5, 1.0, 1.0, 0.75, 0.5, 0.25]), ("cosine", [0.5, 1.0, *_C]),
                                        ("constant", [0.5, 1.0, 1.0, 1.0, 1.0, 1.0])])
def test_the_trainer_steps_with_it(tmp_path, tokenizer, decay, want):
    """A 6-step run with a 2-step warm-up logs ``train/lr`` = lr × the factor of each step."""
    import copy
    from types import SimpleNamespace

    from helpers.tiny_models import make_tiny_model
    from tandem_rlvr.config import load_config
    from tandem_rlvr.models import Pair, freeze
    from tandem_rlvr.training.trainer import make_trainer

    examples = [SimpleNamespace(id=str(i), problem=f"What is {i} plus 1?", answer=str(i + 1)) for i in range(4)]
    cfg = load_config(None, ["algo.arm=grpo", "model.senior=unused", "model.junior=unused", "train.steps=6",
                             "train.prompts_per_step=2", "algo.group_size=2", "rollout.max_new_tokens=4",
                             f"train.out_dir={tmp_path}", "algo.lr=1e-2", "algo.warmup_steps=2",
                             f"algo.lr_decay={decay}", "train.save_every=0", "train.progress=false"])
    senior = make_tiny_model(len(tokenizer), 0, 32)
    tr = make_trainer(cfg, pair=Pair(senior, freeze(copy.deepcopy(senior)), tokenizer),
                      reward_fn=lambda completion, gold: float(len(completion) % 2), examples=examples)
    got = [tr.train_step(step)["train/lr"] for step in range(6)]
    assert got == pytest.approx([1e-2 * w for w in want])


def test_an_unknown_decay_is_a_config_error():
    from tandem_rlvr.config import load_config
    from tandem_rlvr.errors import ConfigError

    with pytest.raises(ConfigError, match="lr_decay"):
        load_config(None, ["model.senior=unused", "algo.lr_decay=step"])
