"""Training TRLVR with a junior of another tokenizer through the text bridge."""

import copy

import pytest
import torch

from tandem_rlvr.config import ConfigError, load_config
from tandem_rlvr.models import ModelLoadError, Pair, freeze, load_pair
from tandem_rlvr.training.trainer import make_trainer
from helpers.tiny_models import CORPUS, GLUE_NL, bias_token, make_tiny_model
from helpers.trainers import EXAMPLES, length_reward


@pytest.fixture(scope="module")
def other_junior_dir(tmp_path_factory):
    from tandem_rlvr.world.tokenizer import build_tokenizer

    d = tmp_path_factory.mktemp("other_junior")
    tok = build_tokenizer(CORPUS, vocab_size=280, pattern=GLUE_NL, out_dir=d)
    make_tiny_model(len(tok), 5, 32).save_pretrained(str(d))
    return d


def _cfg(tmp_path, senior, junior, *extra):
    return load_config(None, [
        f"model.senior={senior}", f"model.junior={junior}", "model.bridge=true", "algo.arm=trlvr",
        "handoff.schedule=alternate", "algo.group_size=4", "algo.mini_batch_prompts=2", "algo.lr=1e-3",
        "train.prompts_per_step=4", "train.steps=2", "train.save_every=0", "train.progress=false",
        "rollout.max_new_tokens=24", "rollout.temperature=1.0", f"train.out_dir={tmp_path / 'run'}",
        "algo.senior_frac_band=[0.0,1.0]", *extra])


def test_bridge_needs_step_schedules_and_a_separate_junior(tmp_path, model_dirs, other_junior_dir):
    with pytest.raises(ConfigError, match="model.bridge"):
        _cfg(tmp_path, model_dirs[0], other_junior_dir, "handoff.schedule=word")
    with pytest.raises(ConfigError, match="model.bridge"):
        _cfg(tmp_path, model_dirs[0], other_junior_dir, "algo.arm=kl_reg", "algo.kl_beta=0.1")
    plain = load_config(None, [f"model.senior={model_dirs[0]}", f"model.junior={other_junior_dir}"])
    with pytest.raises(ModelLoadError, match="model.bridge: true"):
        load_pair(plain.model)


def test_trlvr_trains_through_the_bridge(tmp_path, model_dirs, other_junior_dir):
    cfg = _cfg(tmp_path, model_dirs[0], other_junior_dir)
    pair = load_pair(cfg.model)
    assert pair.junior_tokenizer is not None and len(pair.junior_tokenizer) != len(pair.tokenizer)
    nl = pair.tokenizer.encode("\n", add_special_tokens=False)[0]
    bias_token(pair.senior, nl, 5.0)  # short steps, so that handoffs happen within the budget
    jnl = pair.junior_tokenizer.encode(".\n\n", add_special_tokens=False)[0]
    bias_token(pair.junior, jnl, 4.0)
    junior_before = copy.deepcopy(pair.junior.state_dict())
    senior_before = copy.deepcopy(pair.senior.state_dict())
    tr = make_trainer(cfg, pair=pair, reward_fn=length_reward, examples=EXAMPLES)
    rollout, _ = tr.rollout(0)
    owned = rollout.owner_BT[rollout.response_mask_BT.bool()]
    assert (owned == 0).any() and (owned == 1).any(), "both authors should write"
    tr.train()
    assert all(torch.equal(junior_before[k], v) for k, v in pair.junior.state_dict().items())
    assert any(not torch.equal(senior_before[k], v) for k, v in pair.senior.state_dict().items())
    import json

    rows = [json.loads(x) for x in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert 0.0 < rows[-1]["rollout/senior_token_frac"] < 1.0
    assert "kl/senior_junior" not in rows[-1]  # no shared vocabulary: no per-token KL


def test_a_bridged_run_tokenizes_each_prompt_once_per_tokenizer(tmp_path, model_dirs, other_junior_dir, monkeypatch):
    """The context check measures every prompt on the senior's and the junior's tokenizer before any weights
    load; the builder uses those ids (preflight's RunPlan) instead of tokenizing the prompts again."""
    from collections import Counter

    import tandem_rlvr.data as data
    from helpers.run_files import write_data

    rendered, render = Counter(), data.render_prompt
    monkeypatch.setattr(data, "render_prompt", lambda tok, problem: rendered.update([(len(tok), problem)]) or render(tok, problem))
    cfg = _cfg(tmp_path, model_dirs[0], other_junior_dir, f"data.train={write_data(tmp_path / 'train.jsonl', n=5)}")
    tr = make_trainer(cfg)
    tr.lock.release()
    sizes = {len(tr.pair.tokenizer), len(tr.pair.junior_tokenizer)}
    assert len(sizes) == 2 and len(tr.prompts) == 5
    assert rendered == Counter({(n, f"What is {i} plus 1?"): 1 for n in sizes for i in range(5)})
