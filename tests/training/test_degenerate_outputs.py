"""A training step on degenerate outputs: empty responses score 0 and count as no box, responses without EOS
are cut at the budget and reported unfinished, a user reward that returns NaN is a clear error."""

from __future__ import annotations

import pytest

from helpers.time_guard import no_hang  # noqa: F401 (autouse: a case over a minute fails instead of hanging)
from helpers.tiny_models import bias_token, make_tiny_model
from tandem_rlvr import data as data_mod
from tandem_rlvr.config import load_config
from tandem_rlvr.models import Pair, freeze

EX = [data_mod.Example(str(i), f"What is {i} plus 1?", str(i + 1)) for i in range(6)]


def _one_step(tmp_path, tokenizer, eos_bias, *extra):
    from tandem_rlvr.training.trainer import make_trainer

    cfg = load_config(None, ["model.senior=u", "model.junior=u", "algo.arm=grpo", "train.steps=1",
                             "train.prompts_per_step=2", "algo.group_size=2", "algo.mini_batch_prompts=2",
                             "rollout.max_new_tokens=6", f"train.out_dir={tmp_path / 'run'}", "train.save_every=0",
                             "train.progress=false", "data.reward=math", "data.reward_workers=1", *extra])
    senior = bias_token(make_tiny_model(len(tokenizer), 0), tokenizer.eos_token_id, eos_bias)
    junior = freeze(bias_token(make_tiny_model(len(tokenizer), 1), tokenizer.eos_token_id, eos_bias))
    tr = make_trainer(cfg, pair=Pair(senior, junior, tokenizer), examples=EX)
    with tr._scorer() as scorer:
        tr.scorer = scorer
        return tr.train_step(0)


def test_empty_completions_score_zero_and_count_as_no_box(tmp_path, tokenizer):
    from tandem_rlvr.rewards import RewardScorer

    with RewardScorer("math", num_workers=1) as scorer:  # no box: decided without a worker
        values, stats = scorer.score(["", "   ", "\n"], ["1", "1", "1"])
    assert values == [0.0, 0.0, 0.0] and stats["reward/no_box"] == 3
    row = _one_step(tmp_path, tokenizer, eos_bias=100.0)  # both models emit EOS at once: empty texts
    assert row["rollout/response_len"] == 1.0 and row["rollout/finished_frac"] == 1.0
    assert row["reward/mean"] == 0.0 and row["reward/no_box"] == row["reward/n"] == 4
    assert row["train/loss"] == 0.0 and row["train/nonfinite_run"] == 0


def test_no_eos_truncates_at_the_budget_and_reports_unfinished(tmp_path, tokenizer):
    row = _one_step(tmp_path, tokenizer, eos_bias=-1e4)  # EOS never sampled
    assert row["rollout/response_len"] == 6.0  # every response cut at rollout.max_new_tokens
    assert row["rollout/finished_frac"] == 0.0  # < 1: reported as unfinished
    assert row["reward/n"] == 4 and row["reward/no_box"] == 4 and row["reward/mean"] == 0.0  # 6 random tokens: no box


def test_non_finite_user_reward_is_a_clear_error(tmp_path, tokenizer):
    from tandem_rlvr.training.trainer import TandemError, make_trainer

    cfg = load_config(None, ["model.senior=u", "model.junior=u", "algo.arm=grpo", "train.prompts_per_step=2",
                             "algo.group_size=2", "algo.mini_batch_prompts=2", "rollout.max_new_tokens=4",
                             f"train.out_dir={tmp_path / 'run'}", "train.progress=false"])

    def nan_reward(completion, gold):
        return float("nan")

    tr = make_trainer(cfg, pair=Pair(make_tiny_model(len(tokenizer), 0), freeze(make_tiny_model(len(tokenizer), 1)),
                                tokenizer), examples=EX, reward_fn=nan_reward)
    with pytest.raises(TandemError, match=r"reward function 'nan_reward' returned a non-finite reward for 4 of 4"):
        tr.train_step(0)
