"""The config (``load_config``): errors name the key or the file, and settings read as written: YAML's words
for booleans, values the config adapts to a small run, a junior held in another dtype than the senior."""

from __future__ import annotations

import pytest
import yaml

from helpers.time_guard import no_hang  # noqa: F401 (autouse: a case over a minute fails instead of hanging)
from tandem_rlvr.config import ConfigError, load_config

BASE = ["model.senior=s", "model.junior=j"]

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
        (["model.dtype=int8"], r"'model\.dtype' must be one of float32, bfloat16, float16, got 'int8'"),
        (["train.max_nonfinite=0"], r"'train\.max_nonfinite' must be >= 1"),  # 0 stopped every run after step 1
        (["algo.max_grad_norm=-1"], r"'algo\.max_grad_norm' must be a finite number >= 0, got -1\.0 \(0 = off\)"),  # a negative norm flips gradients
        (["algo.lr=.inf"], r"'algo\.lr' must be a finite number > 0"),
        (["data.reward_timeout_s=.inf"], r"'data\.reward_timeout_s' must be a finite number > 0, got inf"),
        (["data.reward=nope"], r"'data\.reward' must be math, gsm8k, boxed_exact or package\.module:function"),
        (["val.every=5"], r"'val\.data' is required when val\.every > 0"),
        (["algo.lr"], r"override 'algo\.lr' is not of the form dotted\.key=value"),
        (["train.fsdp=zero3"], r"'train\.fsdp' must be one of off, full, zero2, got 'zero3'"),
        (["train.fsdp=full", "model.lora_r=8"], r"'train\.fsdp' shards full fine-tuning only: a LoRA senior"),
        (["rollout.vllm_sleep=level1"], r"'rollout\.vllm_sleep' must be one of off, kv, weights, got 'level1'"),
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


def test_the_junior_can_be_held_in_another_dtype_than_the_senior(tmp_path, tokenizer):
    """model.junior_dtype: the paper configs train fp32 master weights and keep the frozen junior in bf16."""
    import torch
    from helpers.tiny_models import make_tiny_model

    from tandem_rlvr.models import load_pair

    make_tiny_model(len(tokenizer), 0, 32).save_pretrained(str(tmp_path / "s"))
    tokenizer.save_pretrained(str(tmp_path / "s"))
    for junior, extra in ((None, ["model.self_paired=true"]), (str(tmp_path / "s"), [f"model.junior={tmp_path / 's'}"])):
        cfg = load_config(None, [f"model.senior={tmp_path / 's'}", "model.junior_dtype=bfloat16", *extra])
        pair = load_pair(cfg.model)
        assert next(pair.senior.parameters()).dtype == torch.float32
        assert {p.dtype for p in pair.junior.parameters()} == {torch.bfloat16}
        assert not any(p.requires_grad for p in pair.junior.parameters())
    with pytest.raises(ConfigError, match=r"'model\.junior_dtype' must be one of '', float32, bfloat16, float16"):
        load_config(None, OK + ["model.junior_dtype=int8"])


# -- settings as written: YAML's words, a small step's mini-batch -------------------------------------


def test_default_mini_batch_adapts_to_a_small_step():
    cfg = load_config(None, [*BASE, "train.prompts_per_step=4"])
    assert cfg.algo.mini_batch_prompts == 0 and cfg.mini_batch_prompts() == 4
    assert load_config(None, [*BASE, "train.prompts_per_step=4", "algo.mini_batch_prompts=2"]).mini_batch_prompts() == 2
    with pytest.raises(ConfigError, match="algo.mini_batch_prompts"):
        load_config(None, [*BASE, "train.prompts_per_step=4", "algo.mini_batch_prompts=3"])
    for arm in ("trlvr", "grpo", "kl_reg"):  # the paper configs keep their explicit 8
        assert load_config(f"paper/{arm}").mini_batch_prompts() == 8


@pytest.mark.parametrize("word", ["off", "false", "no", "Off", "FALSE"])
def test_fsdp_off_in_overrides_and_files(tmp_path, word):
    assert load_config(None, [*BASE, f"train.fsdp={word}"]).train.fsdp == "off"
    f = tmp_path / "c.yaml"
    f.write_text(f"model: {{senior: s, junior: j}}\ntrain:\n  fsdp: {word}\n")
    assert load_config(f).train.fsdp == "off"


def test_word_values_and_booleans_as_typed():
    assert load_config(None, [*BASE, "handoff.schedule=none"]).handoff.schedule == "none"
    cfg = load_config(None, [*BASE, "train.progress=off", "algo.normalize_std=no", "model.trust_remote_code='yes'"])
    assert (cfg.train.progress, cfg.algo.normalize_std, cfg.model.trust_remote_code) == (False, False, True)
    assert load_config(None, [*BASE, "train.trackers=tensorboard"]).train.trackers == ["tensorboard"]
    assert load_config(None, [*BASE, "train.steps=1e3"]).train.steps == 1000
    with pytest.raises(ConfigError, match="train.fsdp.*YAML reads yes/on/true"):
        load_config(None, [*BASE, "train.fsdp=on"])
    with pytest.raises(ConfigError, match="train.fsdp"):
        load_config(None, [*BASE, "train.fsdp=maybe"])


def test_one_reading_of_a_dotted_key_for_the_command_line_and_the_demo_plan():
    from tandem_rlvr.config import parse_overrides, set_dotted

    tree = {"algo": {"lr": 1.0, "arm": "grpo"}}
    assert set_dotted(tree, "algo.lr", 2e-5) is tree
    assert set_dotted(tree, " handoff.p", 0.3) == {"algo": {"lr": 2e-5, "arm": "grpo"}, "handoff": {"p": 0.3}}
    assert parse_overrides(["algo.lr=0.5", "handoff.p=0.3", "algo.arm=grpo"]) == {
        "algo": {"lr": 0.5, "arm": "grpo"}, "handoff": {"p": 0.3}}
