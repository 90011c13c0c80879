"""The context check (tandem_rlvr.context): a run that does not fit its models' context is refused before
the first forward, on every engine; prompts that cannot fit are skipped and counted; model.max_context overrides."""

from __future__ import annotations

import contextlib
import json
import logging
from types import SimpleNamespace

import pytest
import yaml
from helpers.tiny_models import make_tiny_model

from tandem_rlvr.cli import main
from tandem_rlvr.context import ModelContext, fit_context, model_context
from tandem_rlvr.errors import ConfigError

# ------------------------------------------------------------------------------------- pure rules


def test_model_context_reads_the_config_then_the_tokenizer_then_the_override():
    cfg = SimpleNamespace(max_position_embeddings=512)
    assert model_context("senior", "m", cfg).limit == 512
    assert model_context("senior", "m", cfg).source == "max_position_embeddings"
    yarn = SimpleNamespace(max_position_embeddings=4096, rope_parameters={"rope_type": "yarn", "factor": 4.0,
                                                                          "original_max_position_embeddings": 2048})
    assert model_context("senior", "m", yarn).limit == 8192  # vLLM derives the same
    llama3 = SimpleNamespace(max_position_embeddings=131072, rope_scaling={"rope_type": "llama3", "factor": 8.0})
    assert model_context("senior", "m", llama3).limit == 131072  # already the extended length
    tok = SimpleNamespace(model_max_length=300)
    got = model_context("junior", "j", SimpleNamespace(), tok)
    assert (got.limit, got.source) == (300, "the tokenizer's model_max_length")
    assert model_context("junior", "j", None, SimpleNamespace(model_max_length=int(1e30))).limit is None
    over = model_context("senior", "m", cfg, override=2048)
    assert over.limit == 2048 and over.overridden


def _ctx(limit, role="senior"):
    return ModelContext(role, f"{role}-path", limit, "max_position_embeddings")


def test_a_budget_that_fits_no_prompt_names_model_limit_keys_and_the_largest_value():
    lens = [40, 55, 70]
    with pytest.raises(ConfigError) as e:
        fit_context([(_ctx(512), lens)], 600, budget_key="rollout.max_new_tokens", prompt_key="rollout.max_prompt_tokens",
                    max_prompt_tokens=1024)
    msg = str(e.value)
    assert "senior 'senior-path' reads 512 tokens (max_position_embeddings)" in msg
    assert "rollout.max_new_tokens=600" in msg and "rollout.max_new_tokens <= 472" in msg  # 512 - shortest prompt
    assert "<= 442 keeps every prompt" in msg and "rollout.max_prompt_tokens=1024" in msg and "model.max_context" in msg
    assert "\n" not in msg


def test_prompts_that_do_not_fit_are_skipped_counted_and_the_engine_sized(caplog):
    lens = [10, 200, 30, 120]
    with caplog.at_level(logging.WARNING, logger="tandem_rlvr.context"):
        plan = fit_context([(_ctx(512), lens), (_ctx(400, "junior"), lens)], 300, budget_key="rollout.max_new_tokens")
    assert plan.keep == [0, 2] and plan.skipped == 2  # 120 + 300 > 400 (junior); 200 + 300 > 400
    assert plan.engine_len == 30 + 300
    assert "skipped 2 of 4 prompts" in caplog.text and "junior" in caplog.text
    # every prompt fits: nothing skipped, the engine as long as the longest prompt needs, capped at the limit
    plan = fit_context([(_ctx(512), lens)], 300, budget_key="b")
    assert plan.keep == [0, 1, 2, 3] and plan.skipped == 0 and plan.engine_len == 500
    # an unknown limit is not checked
    plan = fit_context([(ModelContext("senior", "m", None, "unknown"), lens)], 10_000, budget_key="b")
    assert plan.keep == [0, 1, 2, 3] and plan.engine_len == 10_200


def test_each_model_is_measured_on_its_own_prompt_lengths():
    # the junior's tokenizer makes prompt 1 longer than the senior's does
    plan = fit_context([(_ctx(512), [10, 20]), (_ctx(512, "junior"), [10, 300])], 250, budget_key="b")
    assert plan.keep == [0]


# ------------------------------------------------------------------- a model of 512 positions, end to end


@pytest.fixture(scope="module")
def short_model(tmp_path_factory, tokenizer):
    """A small Llama-shaped model whose config says max_position_embeddings: 512 (senior and junior)."""
    d = tmp_path_factory.mktemp("llama512")
    m = make_tiny_model(len(tokenizer), seed=3, arch="llama")
    assert m.config.max_position_embeddings == 512
    m.generation_config.eos_token_id = tokenizer.eos_token_id
    m.save_pretrained(str(d))
    tokenizer.save_pretrained(str(d))
    return d


def _write(tmp_path, model, problems, **rollout):
    data = tmp_path / "train.jsonl"
    data.write_text("".join(json.dumps({"problem": p, "answer": "1"}) + "\n" for p in problems))
    cfg = {"model": {"senior": str(model), "junior": str(model)},
           "algo": {"arm": "trlvr", "group_size": 2, "lr": 1e-3},
           "rollout": {"temperature": 1.0, **rollout},
           "train": {"steps": 1, "prompts_per_step": 2, "save_every": 0, "out_dir": str(tmp_path / "run"), "progress": False},
           "data": {"train": str(data), "reward": "boxed_exact", "reward_workers": 1}}
    path = tmp_path / "cfg.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return path


PROBLEMS = [f"What is {i} plus 1?" for i in range(48)]


@pytest.mark.parametrize("engine", ["hf", "vllm"])
def test_a_budget_past_the_models_context_is_refused_before_any_weights_load(tmp_path, short_model, capsys,
                                                                            monkeypatch, engine):
    import tandem_rlvr.models as models

    def no_weights(*a, **k):
        raise AssertionError("weights were loaded before the context check")

    monkeypatch.setattr(models, "load_causal_lm", no_weights)
    cfg = _write(tmp_path, short_model, PROBLEMS)
    assert main(["train", str(cfg), "rollout.max_new_tokens=600", f"rollout.engine={engine}"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0, err
    assert "reads 512 tokens (max_position_embeddings)" in err and "rollout.max_new_tokens=600" in err
    assert "rollout.max_new_tokens <= " in err and "model.max_context" in err
    largest = int(err.split("rollout.max_new_tokens <= ")[1].split()[0])
    assert 400 < largest < 512  # 512 minus the shortest prompt


def test_prompts_that_cannot_fit_are_skipped_and_counted(tmp_path, short_model, caplog):
    from tandem_rlvr.config import load_config
    from tandem_rlvr.training.trainer import make_trainer

    long_problem = "What is " + " plus ".join(str(i % 10) for i in range(150)) + "?"
    cfg = load_config(_write(tmp_path, short_model, PROBLEMS[:6] + [long_problem] * 2, max_new_tokens=200), [])
    with caplog.at_level(logging.WARNING):
        tr = make_trainer(cfg)
    assert len(tr.prompts) == 6 and tr.context.skipped == 2
    assert max(len(p) for p in tr.prompts) + 200 <= 512 and tr.context.engine_len <= 512
    assert "skipped 2 of 8 prompts" in caplog.text


def test_max_context_lets_an_over_long_run_go_on_with_a_warning(tmp_path, short_model, caplog):
    cfg = _write(tmp_path, short_model, PROBLEMS[:4], max_new_tokens=520)
    with caplog.at_level(logging.WARNING):
        assert main(["train", str(cfg), "model.max_context=1024", "handoff.p=1.0"]) == 0
    assert "model.max_context" in caplog.text and "nothing checks that it does" in caplog.text
    assert (tmp_path / "run" / "final").is_dir()


def test_eval_refuses_a_junior_that_cannot_read_the_seniors_chains(tmp_path, model_dirs, tokenizer, capsys):
    senior, _ = model_dirs
    junior = tmp_path / "junior64"
    m = make_tiny_model(len(tokenizer), seed=4)
    m.config.max_position_embeddings = 64
    m.save_pretrained(str(junior))
    tokenizer.save_pretrained(str(junior))
    bench = tmp_path / "bench.jsonl"
    bench.write_text("".join(json.dumps({"problem": p, "answer": "1"}) + "\n" for p in PROBLEMS[:3]))
    args = ["eval", "--senior", str(senior), "--junior", str(junior), "--benchmark", str(bench), "--n", "1",
            "--max-new-tokens", "100", "--no-curve", "--out", str(tmp_path / "ev"), "--no-progress"]
    assert main(args) == 2
    err = capsys.readouterr().err
    assert f"the junior {str(junior)!r} reads 64 tokens" in err
    assert "its prompts alone do not fit" in err and "--context <= 64" in err  # no negative --max-new-tokens
    assert not (tmp_path / "ev" / "eval.json").exists()


def test_a_dependency_refusing_an_engine_is_one_line_naming_our_keys(monkeypatch):
    from tandem_rlvr.engines import vllm_backend as vb

    class FakeLLM:
        def __init__(self, **kw):
            raise ValueError("1 validation error for ModelConfig\n  Value error, User-specified max_model_len (1056) "
                             "is greater than the derived max_model_len (max_position_embeddings=512.0 ...)")

    monkeypatch.setattr(vb, "_require_vllm", lambda: SimpleNamespace(LLM=FakeLLM))
    monkeypatch.setattr(vb, "_on_cpu", lambda: False)
    monkeypatch.setattr(vb, "engine_env", lambda *a: contextlib.nullcontext())
    with pytest.raises(vb.EngineSetupError) as e:
        vb.make_llm("some/model", max_model_len=1056)
    msg = str(e.value)
    assert "\n" not in msg and "max_model_len=1056" in msg and "User-specified max_model_len (1056)" in msg
    assert "rollout.max_prompt_tokens" in msg and "model.max_context" in msg
