"""Two CPU processes (gloo DDP via `accelerate launch`) give the same run as one process.

Tolerance: senior weights within 1e-6 (float32 reduction order differs); metrics rows equal within
1e-6, except token-weighted diagnostics (`train/ratio_mean`, `train/clip_frac*`) which are averaged
over processes and compared within 1e-3.
"""

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from test_cli_train import write_config

APPROX = ("train/ratio_mean", "train/clip_frac", "train/clip_frac_low", "train/clip_frac_high")


def _launch(cfg, n_proc):
    env = dict(os.environ, HF_HUB_OFFLINE="1", OMP_NUM_THREADS="1", TOKENIZERS_PARALLELISM="false")
    env["PYTHONPATH"] = os.pathsep.join([str(Path(__file__).parent), env.get("PYTHONPATH", "")])
    if n_proc == 1:
        cmd = [sys.executable, "-m", "tandem_rlvr", "train", str(cfg)]
    else:
        launcher = shutil.which("accelerate", path=str(Path(sys.executable).parent)) or "accelerate"
        cmd = [launcher, "launch", "--multi_gpu", "--num_processes", str(n_proc), "--num_machines", "1",
               "--mixed_precision", "no", "--dynamo_backend", "no", "--main_process_port", "29533",
               "-m", "tandem_rlvr", "train", str(cfg)]
    res = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, res.stderr[-3000:]


@pytest.mark.skipif(not torch.distributed.is_available(), reason="torch.distributed unavailable")
def test_two_processes_equal_one(tmp_path, model_dirs):
    runs = {}
    for n in (1, 2):
        d = tmp_path / f"p{n}"
        d.mkdir()
        cfg = write_config(d, model_dirs, data={"reward": "rewards_for_tests:length_reward"},
                           steps=2, save_every=0)
        import yaml

        c = yaml.safe_load(cfg.read_text())
        c["algo"]["loss_type"] = "dapo"
        c["rollout"]["batch_size"] = 4  # one generation chunk per process and mini-batch in both runs
        cfg.write_text(yaml.safe_dump(c))
        _launch(cfg, n)
        runs[n] = d / "run"
    rows = {n: [json.loads(x) for x in (runs[n] / "metrics.jsonl").read_text().splitlines()] for n in runs}
    assert [r["dist/num_processes"] for r in rows[2]] == [2, 2]
    assert len(rows[1]) == len(rows[2]) == 2
    for a, b in zip(rows[1], rows[2]):
        for k, v in a.items():
            if k.startswith(("time/", "dist/")) or "seconds" in k:
                continue
            assert b[k] == pytest.approx(v, abs=1e-3 if k in APPROX else 1e-6), k
    wa = load_file(str(runs[1] / "final" / "model.safetensors"))
    wb = load_file(str(runs[2] / "final" / "model.safetensors"))
    assert max((wa[k] - wb[k]).abs().max().item() for k in wa) < 1e-6
    assert any(r["train/grad_norm"] > 0 for r in rows[1])


def test_sharded_launchers_are_refused_with_a_clear_message():
    from accelerate.utils import DistributedType

    from tandem_rlvr.dist import check_supported
    from tandem_rlvr.errors import TandemError

    for ok in (DistributedType.NO, DistributedType.MULTI_CPU, DistributedType.MULTI_GPU):
        check_supported(ok)
    for bad in (DistributedType.FSDP, DistributedType.DEEPSPEED):
        with pytest.raises(TandemError, match=f"{bad.value} is not supported.*ddp.yaml"):
            check_supported(bad)
