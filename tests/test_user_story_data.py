"""The user story of issue 40 item 2, offline: in a fresh directory, a "Hub" dataset (in the local datasets
cache) whose prompt column holds chat messages, and a ``reward.py`` beside the config YAML; the config loads,
the checks before the first forward pass pass (models, data, reward, context), and the prompts and the
reward are the ones the user wrote."""

from __future__ import annotations

from helpers.hub_cache import cache_hub_dataset, use_cache
from tandem_rlvr.config import load_config
from tandem_rlvr.data import encode_prompts, render_prompt, train_examples
from tandem_rlvr.evaluation.validation import val_examples
from tandem_rlvr.preflight import check_train
from tandem_rlvr.rewards import import_reward

REWARD_PY = '''
import re


def last_number(completion, gold, **kwargs):
    """1.0 when the completion's last number is the gold answer."""
    numbers = re.findall(r"-?\\d+", completion)
    return 1.0 if numbers and numbers[-1] == str(gold).strip() else 0.0
'''

CONFIG_YAML = """\
model:
  senior: {senior}
  junior: {junior}
algo: {{arm: trlvr, group_size: 2, mini_batch_prompts: 2, lr: 1.0e-3}}
handoff: {{schedule: word, p: 0.5}}
rollout: {{max_new_tokens: 8, max_prompt_tokens: 200, temperature: 1.0}}
train: {{steps: 1, prompts_per_step: 2, save_every: 0, out_dir: run, progress: false}}
data:
  train: myorg/chat-math
  train_split: train
  prompt_key: messages
  answer_key: answer
  system_prompt: Answer with a number.
  chat_template_kwargs: {{enable_thinking: false}}
  reward: reward.py:last_number
  reward_workers: 1
val: {{data: myorg/chat-math, split: test, every: 1, n: 2, limit: 2, max_new_tokens: 8}}
"""


def _rows(n, offset=0):
    return [{"messages": [{"role": "user", "content": f"What is {i} + {i}?"}], "answer": str(2 * i)}
            for i in range(offset, offset + n)]


def _story_dir(tmp_path, monkeypatch, model_dirs):
    """The user's fresh directory (returned, and the current one from here on): config.yaml and reward.py, and the "Hub"
    dataset in a local datasets cache."""
    cache = tmp_path / "hf-cache"
    cache_hub_dataset(cache, "myorg/chat-math", {"train": _rows(4), "test": _rows(2, offset=10)})
    use_cache(monkeypatch, cache)
    exp = tmp_path / "exp"
    exp.mkdir()
    (exp / "reward.py").write_text(REWARD_PY, encoding="utf-8")
    (exp / "config.yaml").write_text(CONFIG_YAML.format(senior=model_dirs[0], junior=model_dirs[1]), encoding="utf-8")
    monkeypatch.chdir(exp)
    return exp


def test_hub_chat_dataset_and_reward_file_beside_the_config(tmp_path, monkeypatch, model_dirs, tokenizer):
    _story_dir(tmp_path, monkeypatch, model_dirs)

    cfg = load_config("config.yaml")
    check_train(cfg)  # what `tandem-rlvr train` checks before the first forward: models, data, reward, context
    examples = train_examples(cfg)
    assert [(e.problem, e.answer) for e in examples] == [(f"What is {i} + {i}?", str(2 * i)) for i in range(4)]
    want = tokenizer.apply_chat_template(
        [{"role": "system", "content": "Answer with a number."}, {"role": "user", "content": "What is 1 + 1?"}],
        add_generation_prompt=True, tokenize=False, enable_thinking=False)
    assert render_prompt(tokenizer, examples[1].problem) == want
    assert "Solve the following" not in want  # a chat prompt is used as written: no suffix
    assert [e.answer for e in val_examples(cfg)] == ["20", "22"]
    reward = import_reward(cfg.data.reward)
    assert (reward("so it is 2", "2"), reward("so it is 3", "2")) == (1.0, 0.0)
    _, ids = encode_prompts(tokenizer, examples, max_prompt_tokens=cfg.rollout.max_prompt_tokens)
    assert len(ids) == 4


def test_one_training_step_from_the_story_config(tmp_path, monkeypatch, model_dirs, tokenizer):
    """`tandem-rlvr train config.yaml` in that directory trains one step and validates, on the chat prompts."""
    import json

    import yaml

    from tandem_rlvr import data
    from tandem_rlvr.cli import main

    exp = _story_dir(tmp_path, monkeypatch, model_dirs)
    rendered = []
    original = data.render_prompt
    monkeypatch.setattr(data, "render_prompt", lambda tok, p: rendered.append(original(tok, p)) or rendered[-1])

    assert main(["train", "config.yaml"]) == 0
    rows = [json.loads(x) for x in (exp / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows if "train/loss" in r] == [1] and any("val/pass@1" in r for r in rows)
    saved = yaml.safe_load((exp / "run" / "config.yaml").read_text())["data"]
    assert saved["reward"] == f"{exp / 'reward.py'}:last_number" and saved["prompt_key"] == "messages"
    system_first = tokenizer.apply_chat_template(
        [{"role": "system", "content": "Answer with a number."}, {"role": "user", "content": "What is 0 + 0?"}],
        add_generation_prompt=True, tokenize=False)
    assert system_first in rendered  # the training prompts were the chat messages, system prompt first
    assert not any("Solve the following" in r for r in rendered)
