"""The trainer holds no formula: loss weights come from core, loss types from one list, and
``Trainer.rewards`` works on a fresh trainer (no state that only ``train()`` sets)."""

import pytest
from helpers.trainers import EXAMPLES, base_models  # noqa: F401 (fixture)
from helpers.trainers import trainer_config as _cfg

from tandem_rlvr.training import core
from tandem_rlvr.config import ConfigError, load_config
from tandem_rlvr.models import Pair
from tandem_rlvr.names import LOSS_TYPES
from tandem_rlvr.training.trainer import Trainer, make_trainer


def test_loss_types_are_one_list():
    assert core.LOSS_TYPES is LOSS_TYPES
    for t in LOSS_TYPES:
        load_config(None, ["model.senior=s", "model.junior=j", f"algo.loss_type={t}"])
    with pytest.raises(ConfigError, match="algo.loss_type.*grpo, dapo, token_mean, dr_grpo"):
        load_config(None, ["model.senior=s", "model.junior=j", "algo.loss_type=ppo"])


@pytest.mark.parametrize("loss_type", LOSS_TYPES)
def test_chunk_weights_add_up_to_the_mini_batch(loss_type):
    chunks = [3, 3, 2]
    w = [core.chunk_weight(loss_type, n, sum(chunks), num_processes=4) for n in chunks]
    if loss_type in ("dapo", "token_mean"):  # already divided by the global token count: undo DDP's mean
        assert all(x == (4.0, 1.0) for x in w) and core.process_scale(loss_type, 4) == 4
    else:  # per-sequence means: each chunk weighted by its share of rows
        assert sum(x[0] for x in w) == pytest.approx(1.0) and all(a == b for a, b in w)
        assert core.process_scale(loss_type, 4) == 1
    with pytest.raises(ValueError, match="unknown loss_type"):
        core.chunk_weight("ppo", 1, 2)


def test_rewards_work_before_train(tmp_path, tokenizer, base_models):  # noqa: F811
    s, j = base_models
    tr = make_trainer(_cfg(tmp_path, "grpo", "data.reward=boxed_exact", "data.reward_workers=1"),
                 pair=Pair(s, j, tokenizer), examples=EXAMPLES)
    idx = [0, 1]  # prompts 0 and 1: answers "1" and "2"
    vals, _ = tr.rewards(["so \\boxed{1}", "so \\boxed{3}"], idx)
    assert vals.tolist() == [1.0, 0.0]
