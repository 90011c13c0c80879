"""scripts/gpu_check.py's options: --paper-step is one GPU's share of a step of configs/paper/trlvr.yaml on both engines."""

import importlib.util

import pytest

from helpers.paths import ROOT


@pytest.fixture(scope="module")
def gpu_check():
    spec = importlib.util.spec_from_file_location("gpu_check", ROOT / "scripts" / "gpu_check.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_paper_step_is_a_paper_step_per_gpu_on_both_engines(gpu_check, tmp_path):
    from tandem_rlvr.config import load_config

    args = gpu_check.parse_args(["--paper-step"])
    assert args.random_4b and gpu_check.engines(args) == ["hf", "vllm"]
    paper = load_config(ROOT / "configs" / "paper" / "trlvr.yaml")
    cfg = gpu_check.make_config(args, "trlvr", "m", tmp_path, "vllm")
    per_gpu = paper.train.prompts_per_step * paper.algo.group_size // 2  # two GPUs
    assert args.prompts * args.group_size == per_gpu == 64
    r, pr = cfg.rollout, paper.rollout
    assert (r.max_new_tokens, r.temperature, r.engine) == (pr.max_new_tokens, pr.temperature, "vllm")
    assert (r.vllm_memory, r.vllm_sleep) == (pr.vllm_memory, pr.vllm_sleep)
    assert (cfg.handoff.schedule, cfg.handoff.p, cfg.handoff.max_gap) == ("word", 0.5, 32)
    assert cfg.algo.micro_batch == paper.algo.micro_batch == 1


def test_a_run_without_a_model_is_refused(gpu_check):
    with pytest.raises(SystemExit):
        gpu_check.parse_args([])
