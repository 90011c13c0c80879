"""Bad inputs fail with one clear message naming the culprit (key, file, column, model path), or are
skipped and counted; never a bare traceback, never a hang.

Covers the config (load_config), the data loaders, model loading, degenerate model outputs (empty
responses, no EOS) and the command line (``tandem_rlvr.cli.main`` returns 2 with one stderr line).
Non-finite losses and gradients are in tests/test_nonfinite.py.
"""

from __future__ import annotations

import copy
import json
import logging
import signal

import pytest
import yaml
from conftest import CORPUS, bias_token, make_tiny_model
from test_cli_train import write_config

from tandem_rlvr import data as data_mod
from tandem_rlvr.cli import main
from tandem_rlvr.config import ConfigError, load_config
from tandem_rlvr.data import (
    PLAIN_PROMPT_TEMPLATE,
    DataError,
    load_examples,
    render_prompt,
)
from tandem_rlvr.models import (
    ModelLoadError,
    Pair,
    freeze,
    load_causal_lm,
    load_pair,
    load_tokenizer,
)

TEST_SECONDS = 60


@pytest.fixture(autouse=True)
def _no_hang():
    """Fail (instead of hanging the suite) if one case runs for over a minute."""

    def boom(*_):
        raise TimeoutError(f"test ran over {TEST_SECONDS} s: a hang?")

    old = signal.signal(signal.SIGALRM, boom)
    signal.alarm(TEST_SECONDS)
    yield
    signal.alarm(0)
    signal.signal(signal.SIGALRM, old)


def _cli(capsys, argv):
    """Run the CLI; return (exit code, stderr) and check the error is one line without a traceback."""
    rc = main(argv)
    err = capsys.readouterr().err
    assert "Traceback" not in err, err
    return rc, err


def _one_error_line(err: str) -> str:
    """The single error line, which ends stderr (progress bars of model loading may precede it)."""
    lines = [ln for ln in err.replace("\r", "\n").splitlines() if ln.strip()]
    errors = [ln for ln in lines if ln.startswith("tandem-rlvr")]
    assert len(errors) == 1 and lines[-1] == errors[0], lines
    return errors[0]


# ------------------------------------------------------------------------------------------------
# config

OK = ["model.senior=s", "model.junior=j", "train.prompts_per_step=4", "algo.group_size=4",
      "algo.mini_batch_prompts=2"]


@pytest.mark.parametrize(
    ("overrides", "match"),
    [
        (["algo.lrr=1e-5"], r"unknown config key 'algo\.lrr'.*valid keys here:.*\blr\b"),
        (["foo.bar=1"], r"unknown config key 'foo'"),
        (["train.steps=abc"], r"'train\.steps' must be int, got 'abc'"),
        (["train.steps=1.5"], r"'train\.steps' must be int, got 1\.5"),
        (["algo.lr=fast"], r"'algo\.lr' must be float, got 'fast'"),
        (["model.self_paired=maybe"], r"'model\.self_paired' must be bool"),
        (["algo=3"], r"'algo' must be a mapping"),
        (["handoff.p=1.5"], r"'handoff\.p' must be in \[0, 1\], got 1\.5"),
        (["handoff.p=-0.1"], r"'handoff\.p' must be in \[0, 1\]"),
        (["handoff.p=.nan"], r"'handoff\.p' must be in \[0, 1\], got nan"),
        (["algo.group_size=1"], r"'algo\.group_size' must be >= 2"),
        (["algo.mini_batch_prompts=3"], r"'algo\.mini_batch_prompts' must be 0 \(all prompts of the step\) or divide train\.prompts_per_step \(4\), got 3"),
        (["rollout.batch_size=6"], r"'rollout\.batch_size' must be 0 or a multiple of algo\.group_size"),
        (["algo.arm=kl_reg"], r"'algo\.kl_beta' must be > 0 for the kl_reg arm"),
        (["algo.kl_beta=0.1"], r"'algo\.kl_beta' is only used by the kl_reg arm"),
        (["model.junior=null"], r"'model\.junior' is required unless model\.self_paired is true"),
        (["model.self_paired=true"], r"'model\.junior' must be empty when model\.self_paired is true"),
        (["model.dtype=int8"], r"'model\.dtype' must be float32, bfloat16 or float16"),
        (["train.max_nonfinite=0"], r"'train\.max_nonfinite' must be >= 1"),  # 0 stopped every run after step 1
        (["algo.max_grad_norm=-1"], r"'algo\.max_grad_norm' must be >= 0"),  # a negative norm flips gradients
        (["algo.lr=.inf"], r"'algo\.lr' must be a finite number > 0"),
        (["data.reward_timeout_s=.inf"], r"'data\.reward_timeout_s' must be > 0"),
        (["data.reward=nope"], r"'data\.reward' must be math, gsm8k, boxed_exact or package\.module:function"),
        (["val.every=5"], r"'val\.data' is required when val\.every > 0"),
        (["algo.lr"], r"override 'algo\.lr' is not of the form dotted\.key=value"),
        (["train.fsdp=zero3"], r"'train\.fsdp' must be off, full or zero2, got 'zero3'"),
        (["train.fsdp=full", "model.lora_r=8"], r"'train\.fsdp' shards full fine-tuning only: a LoRA senior"),
        (["rollout.vllm_sleep=level1"], r"'rollout\.vllm_sleep' must be off, kv, weights, got 'level1'"),
    ],
)
def test_config_errors_name_the_key(overrides, match):
    with pytest.raises(ConfigError, match=match):
        load_config(None, OK + overrides)


@pytest.mark.parametrize("fsdp", ["full", "zero2"])
@pytest.mark.parametrize("schedule", ["none", "word", "step"])
def test_every_sharding_validates_with_the_vllm_engine(fsdp, schedule):
    cfg = load_config(None, OK + [f"train.fsdp={fsdp}", "rollout.engine=vllm", f"handoff.schedule={schedule}",
                                  "rollout.vllm_sleep=weights"])
    assert (cfg.train.fsdp, cfg.rollout.engine, cfg.rollout.vllm_sleep) == (fsdp, "vllm", "weights")


def test_sharding_with_a_bridged_junior_is_refused_with_its_reason():
    with pytest.raises(ConfigError, match=r"'train\.fsdp' is not tested with a junior that reads another tokenizer"):
        load_config(None, OK + ["train.fsdp=full", "model.bridge=true", "handoff.schedule=step"])


def test_config_file_problems_name_the_file(tmp_path):
    missing = tmp_path / "nope.yaml"
    with pytest.raises(ConfigError, match=rf"config file '{missing}' does not exist"):
        load_config(missing)
    bad = tmp_path / "bad.yaml"
    bad.write_text("model: {senior: x\n  junior: [\n")
    with pytest.raises(ConfigError, match=r"'.*bad\.yaml' is not valid YAML: .* at line 2, column \d+") as e:
        load_config(bad)
    assert "\n" not in str(e.value)  # PyYAML's multi-line report is reduced to one line
    latin = tmp_path / "latin1.yaml"
    latin.write_bytes("model:\n  senior: caf\xe9\n".encode("latin-1"))
    with pytest.raises(ConfigError, match=r"latin1\.yaml' is not valid UTF-8"):
        load_config(latin)
    listed = tmp_path / "list.yaml"
    listed.write_text("- 1\n- 2\n")
    with pytest.raises(ConfigError, match=r"list\.yaml' must hold a mapping at the top level"):
        load_config(listed)
    nested = tmp_path / "nested.yaml"
    nested.write_text(yaml.safe_dump({"model": {"senior": "s", "junior": "j"}, "algo": {"clip": 0.2}}))
    with pytest.raises(ConfigError, match=r"unknown config key 'algo\.clip'"):
        load_config(nested)


# ------------------------------------------------------------------------------------------------
# data


def _jsonl(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return path


def test_data_missing_file_and_empty_file(tmp_path):
    with pytest.raises(DataError, match=r"data: .*missing\.jsonl: no such file"):
        load_examples(str(tmp_path / "missing.jsonl"))
    empty = tmp_path / "empty.jsonl"
    empty.write_text("")
    with pytest.raises(DataError, match=r"empty\.jsonl: no usable row \(the file has no rows\)"):
        load_examples(str(empty))


def test_data_missing_column_lists_the_available_ones(tmp_path):
    f = _jsonl(tmp_path / "q.jsonl", [{"question": "1+1?", "answer": "2"}])
    with pytest.raises(DataError, match=r"q\.jsonl: no column 'problem'; available columns: 'question', 'answer'"):
        load_examples(str(f))


def test_data_empty_answers_are_counted_skips(tmp_path, caplog):
    f = _jsonl(tmp_path / "a.jsonl", [{"problem": "1+1?", "answer": ""}, {"problem": "2+2?", "answer": "  "},
                                      {"problem": "3+3?", "answer": "6"}, {"problem": "4+4?"}])
    with caplog.at_level(logging.WARNING, logger="tandem_rlvr.data"):
        ex = load_examples(str(f))
    assert [e.answer for e in ex] == ["6"]
    assert "a.jsonl: kept 1 rows, skipped 3 (empty answer: 2, missing answer: 1)" in caplog.text
    only_bad = _jsonl(tmp_path / "b.jsonl", [{"problem": "1+1?", "answer": ""}])
    with pytest.raises(DataError, match=r"b\.jsonl: no usable row \(1 rows skipped\)"):
        load_examples(str(only_bad))


def test_data_non_utf8_bytes_name_file_byte_and_line(tmp_path):
    f = tmp_path / "latin.jsonl"
    f.write_bytes(b'{"problem": "ok", "answer": "1"}\n{"problem": "caf\xe9", "answer": "2"}\n')
    with pytest.raises(DataError, match=r"latin\.jsonl: not valid UTF-8 \(byte 49, line 2\)"):
        load_examples(str(f))


def test_data_one_megabyte_problem_is_skipped_and_counted(tmp_path, caplog):
    f = _jsonl(tmp_path / "big.jsonl", [{"problem": "x" * 1_000_000, "answer": "1"}, {"problem": "1+1?", "answer": "2"}])
    with caplog.at_level(logging.WARNING, logger="tandem_rlvr.data"):
        ex = load_examples(str(f))
    assert [e.problem for e in ex] == ["1+1?"]
    assert "skipped 1 (problem over 100000 chars: 1)" in caplog.text


def test_data_bad_json_line_is_named(tmp_path):
    f = tmp_path / "broken.jsonl"
    f.write_text('{"problem": "a", "answer": "1"}\n{"problem": \n')
    with pytest.raises(DataError, match=r"broken\.jsonl: bad JSON on line 2"):
        load_examples(str(f))


# ------------------------------------------------------------------------------------------------
# models


def _save_vision_model(d, kind, tokenizer=None):
    from transformers import CLIPVisionConfig, CLIPVisionModel, ViTConfig, ViTModel

    small = {"hidden_size": 16, "intermediate_size": 32, "num_hidden_layers": 1, "num_attention_heads": 2,
             "image_size": 8, "patch_size": 4}
    model = ViTModel(ViTConfig(**small)) if kind == "vit" else CLIPVisionModel(CLIPVisionConfig(**small))
    model.save_pretrained(str(d))
    if tokenizer is not None:
        tokenizer.save_pretrained(str(d))
    return d


def test_missing_model_paths_are_named(tmp_path, model_dirs):
    senior, junior = model_dirs
    missing = str(tmp_path / "no_such_model")
    cfg = load_config(None, [f"model.senior={missing}", f"model.junior={junior}"])
    with pytest.raises(ModelLoadError, match=rf"senior model path '{missing}' does not exist"):
        load_pair(cfg.model)
    cfg = load_config(None, [f"model.senior={senior}", f"model.junior={missing}"])
    with pytest.raises(ModelLoadError, match=rf"junior model path '{missing}' does not exist"):
        load_pair(cfg.model)
    # a directory without config.json
    (tmp_path / "empty_dir").mkdir()
    with pytest.raises(ModelLoadError, match=r"senior model directory '.*empty_dir' has no config.json"):
        load_causal_lm(str(tmp_path / "empty_dir"))


def test_unknown_hub_name_offline_is_one_line():
    with pytest.raises(ModelLoadError) as e:
        load_tokenizer("no-such-org-xyz/no-such-model", role="junior")
    msg = str(e.value)
    assert "junior tokenizer from 'no-such-org-xyz/no-such-model'" in msg and "not a local path" in msg
    assert "\n" not in msg


@pytest.mark.parametrize("kind", ["vit", "clip_vision"])
def test_non_causal_model_dir_is_refused(tmp_path, tokenizer, kind):
    d = _save_vision_model(tmp_path / kind, kind, tokenizer)
    with pytest.raises(ModelLoadError, match=rf"senior model '{d}' \(model_type='{kind}(_model)?'\) is not a causal LM"):
        load_causal_lm(str(d))


def test_model_dir_without_tokenizer_files_is_named(tmp_path, model_dirs):
    d = _save_vision_model(tmp_path / "vit_only", "vit")
    cfg = load_config(None, [f"model.senior={d}", f"model.junior={model_dirs[1]}"])
    with pytest.raises(ModelLoadError, match=rf"senior model directory '{d}' has no tokenizer files"):
        load_pair(cfg.model)


def test_senior_and_junior_with_different_vocabularies(tmp_path, model_dirs):
    from tandem_rlvr.world.tokenizer import build_tokenizer

    other = tmp_path / "other_vocab"
    corpus = ["alpha beta gamma delta epsilon zeta eta theta iota kappa lambda mu"] * 30 + CORPUS[:2]
    tok2 = build_tokenizer(corpus, vocab_size=300, out_dir=other)
    make_tiny_model(len(tok2), seed=3).save_pretrained(str(other))
    cfg = load_config(None, [f"model.senior={model_dirs[0]}", f"model.junior={other}"])
    with pytest.raises(ModelLoadError, match=rf"tokenizers of senior '{model_dirs[0]}' .* and junior '{other}' .*"
                                             r"are not compatible: \d+ tokens only in the senior's"):
        load_pair(cfg.model)


def test_no_chat_template_falls_back_to_plain_prompt_with_one_warning(tokenizer, monkeypatch, caplog):
    tok = copy.deepcopy(tokenizer)
    tok.chat_template = None
    monkeypatch.setattr(data_mod, "_WARNED_PLAIN", set())
    with caplog.at_level(logging.WARNING, logger="tandem_rlvr.data"):
        a, b = render_prompt(tok, "What is 2?"), render_prompt(tok, "What is 3?")
    assert a == PLAIN_PROMPT_TEMPLATE.format(user_turn=data_mod.build_user_turn("What is 2?"))
    assert b.startswith("Question: What is 3?") and b.endswith("\nAnswer:")
    warnings = [r for r in caplog.records if "no chat template" in r.getMessage()]
    assert len(warnings) == 1  # once per tokenizer, not once per prompt


def test_tokenizer_without_pad_falls_back_to_eos_and_without_either_is_refused(tmp_path, tokenizer):
    from transformers import Qwen2Config

    nopad, neither = tmp_path / "nopad", tmp_path / "neither"
    tok = copy.deepcopy(tokenizer)
    tok.pad_token = None
    for d in (nopad, neither):
        Qwen2Config(vocab_size=len(tokenizer)).save_pretrained(str(d))
    tok.save_pretrained(str(nopad))
    loaded = load_tokenizer(str(nopad))
    assert loaded.pad_token_id == loaded.eos_token_id == tokenizer.eos_token_id
    assert loaded.padding_side == "left"
    tok.eos_token = None
    tok.save_pretrained(str(neither))
    with pytest.raises(ModelLoadError, match=rf"senior tokenizer '{neither}' has neither a pad nor an EOS token"):
        load_tokenizer(str(neither))


# ------------------------------------------------------------------------------------------------
# degenerate outputs: empty responses, no EOS

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


# ------------------------------------------------------------------------------------------------
# the command line


def test_cli_missing_config_file(tmp_path, capsys):
    rc, err = _cli(capsys, ["train", str(tmp_path / "nope.yaml")])
    assert rc == 2
    assert _one_error_line(err) == f"tandem-rlvr train: error: config file '{tmp_path / 'nope.yaml'}' does not exist"


def test_cli_bad_yaml_is_one_line(tmp_path, capsys):
    bad = tmp_path / "bad.yaml"
    bad.write_text("model: {senior: x\n  junior: [\n")
    rc, err = _cli(capsys, ["train", str(bad)])
    assert rc == 2 and "bad.yaml' is not valid YAML" in _one_error_line(err)


def test_cli_bad_override_names_the_key(tmp_path, model_dirs, capsys):
    cfg = write_config(tmp_path, model_dirs)
    rc, err = _cli(capsys, ["train", str(cfg), "algo.group_size=1"])
    assert rc == 2 and "'algo.group_size' must be >= 2" in _one_error_line(err)


def test_cli_unknown_subcommand_returns_2(capsys):
    rc, err = _cli(capsys, ["bogus"])
    assert rc == 2 and "invalid choice: 'bogus'" in err
    rc, err = _cli(capsys, [])
    assert rc == 2 and "required" in err


def test_cli_missing_training_data_file(tmp_path, model_dirs, capsys):
    cfg = write_config(tmp_path, model_dirs, data={"train": str(tmp_path / "gone.jsonl")})
    rc, err = _cli(capsys, ["train", str(cfg)])
    assert rc == 2 and f"data: {tmp_path / 'gone.jsonl'}: no such file" in _one_error_line(err)


def test_cli_missing_column_in_training_data(tmp_path, model_dirs, capsys):
    cfg = write_config(tmp_path, model_dirs, data={"problem_key": "question"})
    rc, err = _cli(capsys, ["train", str(cfg)])
    assert rc == 2 and "no column 'question'; available columns: 'problem', 'answer'" in _one_error_line(err)


def test_cli_non_causal_senior(tmp_path, model_dirs, tokenizer, capsys):
    vit = _save_vision_model(tmp_path / "vit", "vit", tokenizer)
    cfg = write_config(tmp_path, model_dirs)
    rc, err = _cli(capsys, ["train", str(cfg), f"model.senior={vit}"])
    assert rc == 2 and f"senior model '{vit}' (model_type='vit') is not a causal LM" in _one_error_line(err)


def test_cli_out_dir_under_a_file(tmp_path, model_dirs, capsys):
    blocker = tmp_path / "a_file"
    blocker.write_text("x")
    cfg = write_config(tmp_path, model_dirs)
    rc, err = _cli(capsys, ["train", str(cfg), f"train.out_dir={blocker / 'run'}"])
    assert rc == 2 and str(blocker) in _one_error_line(err)


def test_cli_eval_with_a_missing_model(tmp_path, model_dirs, capsys):
    bench = _jsonl(tmp_path / "b.jsonl", [{"problem": "1+1?", "answer": "2"}])
    missing = tmp_path / "no_model"
    base = ["eval", "--benchmark", str(bench), "--out", str(tmp_path / "out"), "--no-progress"]
    rc, err = _cli(capsys, [*base, "--senior", str(model_dirs[0]), "--junior", str(missing)])
    assert rc == 2 and f"junior model path '{missing}' does not exist" in _one_error_line(err)
    rc, err = _cli(capsys, [*base, "--senior", f"mine={missing}", "--junior", str(model_dirs[1])])
    assert rc == 2 and f"'{missing}' does not exist" in _one_error_line(err)
    rc, err = _cli(capsys, [*base, "--senior", str(model_dirs[0]), "--junior", "not-a-dir-or-hub-name"])
    assert rc == 2 and "'not-a-dir-or-hub-name'" in _one_error_line(err)


def test_the_junior_can_be_held_in_another_dtype_than_the_senior(tmp_path, tokenizer):
    """model.junior_dtype: the paper configs train fp32 master weights and keep the frozen junior in bf16."""
    import torch
    from conftest import make_tiny_model

    from tandem_rlvr.models import load_pair

    make_tiny_model(len(tokenizer), 0, 32).save_pretrained(str(tmp_path / "s"))
    tokenizer.save_pretrained(str(tmp_path / "s"))
    for junior, extra in ((None, ["model.self_paired=true"]), (str(tmp_path / "s"), [f"model.junior={tmp_path / 's'}"])):
        cfg = load_config(None, [f"model.senior={tmp_path / 's'}", "model.junior_dtype=bfloat16", *extra])
        pair = load_pair(cfg.model)
        assert next(pair.senior.parameters()).dtype == torch.float32
        assert {p.dtype for p in pair.junior.parameters()} == {torch.bfloat16}
        assert not any(p.requires_grad for p in pair.junior.parameters())
    with pytest.raises(ConfigError, match=r"'model\.junior_dtype' must be empty"):
        load_config(None, OK + ["model.junior_dtype=int8"])
