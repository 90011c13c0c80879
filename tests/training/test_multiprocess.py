"""Two CPU processes (gloo DDP via `accelerate launch`) give the same run as one process.

Tolerance: senior weights within 1e-6 (float32 reduction order differs); metrics rows equal within
1e-6, except token-weighted diagnostics (`train/ratio_mean`, `train/clip_frac*`) which are averaged
over processes and compared within 1e-3. Every run here has the one-process update's shared prompts and
left-out zero-advantage rows off (`TANDEM_RLVR_FASTPATH_OFF=SHARED_PROMPTS_UPDATE,SKIP_ZERO_ADVANTAGE`): a
wrapped model takes one forward per backward, so a run of several processes always takes the per-chunk path
over every row, and the one-process reference must take it too (the two paths' own gradients are checked
against it in tests/training/test_trainer_update.py; skipped rows would also change the diagnostics above).
"""

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import load_file

from helpers.paths import TESTS
from helpers.failures import fatal_section
from helpers.processes import APPROX, free_port
from helpers.run_files import write_config

def _launch(cfg, n_proc, mixed_precision="no"):
    env = dict(os.environ, HF_HUB_OFFLINE="1", OMP_NUM_THREADS="1", TOKENIZERS_PARALLELISM="false",
               PYTHONFAULTHANDLER="1",  # an abort prints every thread's Python stack
               TANDEM_RLVR_FASTPATH_OFF="SHARED_PROMPTS_UPDATE,SKIP_ZERO_ADVANTAGE")  # the path a wrapped model takes (docstring)
    env["PYTHONPATH"] = os.pathsep.join([str(TESTS), env.get("PYTHONPATH", "")])
    if n_proc == 1:
        cmd = [sys.executable, "-m", "tandem_rlvr", "train", str(cfg)]
    else:
        launcher = shutil.which("accelerate", path=str(Path(sys.executable).parent)) or "accelerate"
        cmd = [launcher, "launch", "--multi_gpu", "--num_processes", str(n_proc), "--num_machines", "1",
               "--mixed_precision", mixed_precision, "--dynamo_backend", "no", "--main_process_port", str(free_port()),
               "-m", "tandem_rlvr", "train", str(cfg)]
    res = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, fatal_section(res.stderr)


def _run(tmp_path, model_dirs, name, n_proc, mixed_precision="no", **train):
    import yaml

    d = tmp_path / name
    d.mkdir()
    cfg = write_config(d, model_dirs, data={"reward": "helpers.rewards_for_tests:length_reward"}, steps=2, save_every=0, **train)
    c = yaml.safe_load(cfg.read_text())
    c["algo"]["loss_type"] = "dapo"
    c["algo"]["micro_batch"] = 4  # two micro-batches per mini-batch on one process: gradient accumulation
    c["rollout"]["batch_size"] = 4  # one generation chunk per process and mini-batch in both runs
    cfg.write_text(yaml.safe_dump(c))
    _launch(cfg, n_proc, mixed_precision)
    return d / "run"


def _rows(run: Path) -> list[dict]:
    return [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]


def _assert_same_run(one: Path, other: Path, n_proc: int, weight_tol: float = 1e-6) -> None:
    rows = {1: _rows(one), n_proc: _rows(other)}
    assert [r["dist/num_processes"] for r in rows[n_proc]] == [n_proc] * 2
    assert len(rows[1]) == len(rows[n_proc]) == 2
    for a, b in zip(rows[1], rows[n_proc]):
        for k, v in a.items():
            if k.startswith(("time/", "dist/")):
                continue
            assert b[k] == pytest.approx(v, abs=1e-3 if k in APPROX else 1e-6), k
    wa = load_file(str(one / "final" / "model.safetensors"))
    wb = load_file(str(other / "final" / "model.safetensors"))
    assert wa.keys() == wb.keys()
    assert max((wa[k] - wb[k]).abs().max().item() for k in wa) < weight_tol
    assert any(r["train/grad_norm"] > 0 for r in rows[1])


@pytest.fixture(scope="module")
def one_process_run(tmp_path_factory, model_dirs):
    return _run(tmp_path_factory.mktemp("p1"), model_dirs, "p1", 1)


@pytest.mark.skipif(not torch.distributed.is_available(), reason="torch.distributed unavailable")
def test_two_processes_equal_one(tmp_path, model_dirs, one_process_run):
    _assert_same_run(one_process_run, _run(tmp_path, model_dirs, "p2", 2), 2)


@pytest.mark.skipif(not torch.distributed.is_available(), reason="torch.distributed unavailable")
@pytest.mark.parametrize("mode", ["full", pytest.param("zero2", marks=pytest.mark.slow)])  # zero2: slow suite (cost)
def test_fsdp_sharded_senior_equals_one_process(tmp_path, model_dirs, one_process_run, mode):
    """FSDP2 over 2 gloo processes: same metrics and final weights as 1 unsharded process; the rollouts
    run on gathered weights, so each process may stop decoding at its own step."""
    _assert_same_run(one_process_run, _run(tmp_path, model_dirs, f"fsdp-{mode}", 2, fsdp=mode), 2)


def test_sharded_launchers_are_refused_with_a_clear_message():
    from accelerate.utils import DistributedType

    from tandem_rlvr.training.dist import check_supported
    from tandem_rlvr.errors import TandemError

    for ok in (DistributedType.NO, DistributedType.MULTI_CPU, DistributedType.MULTI_GPU):
        check_supported(ok)
    for bad in (DistributedType.FSDP, DistributedType.DEEPSPEED):
        with pytest.raises(TandemError, match=f"{bad.value} is not supported.*accelerate/ddp"):
            check_supported(bad)


@pytest.mark.skipif(not torch.distributed.is_available(), reason="torch.distributed unavailable")
@pytest.mark.slow  # two 2-process launches (~25 s): the slow suite; resume itself is tested in one process by default
def test_fsdp_run_resumes_from_its_gathered_checkpoint_and_validates(tmp_path, model_dirs):
    """A sharded run's checkpoints (full weights and optimizer state gathered to the main process) bring
    a resumed run to the same end as an uninterrupted one; validation runs on gathered weights and
    writes best/."""
    import yaml

    runs = {}
    for name, steps in (("straight", [3]), ("resumed", [2, 3])):
        d = tmp_path / name
        d.mkdir()
        cfg = write_config(d, model_dirs, data={"reward": "helpers.rewards_for_tests:length_reward"}, save_every=1, fsdp="full")
        c = yaml.safe_load(cfg.read_text())
        c["val"] = {"data": c["data"]["train"], "every": 2, "n": 1, "limit": 4}
        for s in steps:  # the second launch of "resumed" continues from its step-2 checkpoint
            c["train"]["steps"] = s
            cfg.write_text(yaml.safe_dump(c))
            _launch(cfg, 2)
        runs[name] = d / "run"
    a, b = _rows(runs["straight"]), _rows(runs["resumed"])
    assert [r["step"] for r in b] == [1, 2, 3] and "val/pass@1" in b[1]
    for k, v in a[-1].items():
        if not k.startswith(("time/", "dist/")):
            assert b[-1][k] == pytest.approx(v, abs=1e-6), k
    wa = load_file(str(runs["straight"] / "final" / "model.safetensors"))
    wb = load_file(str(runs["resumed"] / "final" / "model.safetensors"))
    assert max((wa[k] - wb[k]).abs().max().item() for k in wa) < 1e-6
    assert (runs["resumed"] / "best" / "model.safetensors").exists()
    assert (runs["resumed"] / "checkpoints" / "step-3" / "train_state.pt").exists()


def test_fsdp_on_one_process_is_refused(tmp_path, model_dirs):
    from tandem_rlvr.config import load_config
    from tandem_rlvr.errors import TandemError
    from tandem_rlvr.training.trainer import make_trainer

    cfg = load_config(write_config(tmp_path, model_dirs, fsdp="full"))
    with pytest.raises(TandemError, match="train.fsdp=full shards the senior over processes, but this is one process"):
        make_trainer(cfg)


@pytest.mark.skipif(not torch.distributed.is_available(), reason="torch.distributed unavailable")
@pytest.mark.slow  # a third 2-process FSDP launch: the slow suite
def test_fsdp_bf16_gathers_and_computes_in_bf16_and_keeps_fp32_weights(tmp_path, model_dirs, one_process_run):
    """With accelerate's bf16 setting the sharded senior computes in bf16 (FSDP2 mixed precision) and
    keeps float32 master weights: the run trains, and ends near (not at) the float32 run."""
    run = _run(tmp_path, model_dirs, "fsdp-bf16", 2, mixed_precision="bf16", fsdp="full")
    rows = _rows(run)
    assert len(rows) == 2 and all(np.isfinite(r["train/loss"]) and r["train/grad_norm"] > 0 for r in rows)
    w16 = load_file(str(run / "final" / "model.safetensors"))
    w32 = load_file(str(one_process_run / "final" / "model.safetensors"))
    assert all(v.dtype == torch.float32 for v in w16.values())
    gap = max((w16[k] - w32[k]).abs().max().item() for k in w32)
    assert 0 < gap < 5e-2, gap  # bf16 rounding moves the run; 4 AdamW updates of lr 1e-3 bound the distance
