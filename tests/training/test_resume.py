"""Resume after SIGKILL is bit-exact: same senior weights and metrics rows as an uninterrupted run."""

import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from helpers.paths import TESTS
from helpers.run_files import count_metrics_rows as _n_rows, metrics_rows as _rows, write_config


def _run(cfg, *extra, env=None):
    cmd = [sys.executable, "-m", "tandem_rlvr", "train", str(cfg), *extra]
    return subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)


def _env():
    env = dict(os.environ)
    env.update(HF_HUB_OFFLINE="1", TOKENIZERS_PARALLELISM="false", OMP_NUM_THREADS="1")
    env["PYTHONPATH"] = os.pathsep.join([str(TESTS), env.get("PYTHONPATH", "")])
    return env


def _kill_when(proc, predicate, timeout=120):
    t0 = time.time()
    while time.time() - t0 < timeout and proc.poll() is None:
        if predicate():
            proc.send_signal(signal.SIGKILL)
            proc.wait()
            return True
        time.sleep(0.005)
    return False


def test_sigkill_three_times_then_resume_is_bit_exact(tmp_path, model_dirs):
    steps = 8
    (tmp_path / "ref").mkdir()
    (tmp_path / "kill").mkdir()
    reward = {"reward": "helpers.rewards_for_tests:length_reward"}
    ref_cfg = write_config(tmp_path / "ref", model_dirs, data=reward, steps=steps, save_every=1, keep_last=2)
    kill_cfg = write_config(tmp_path / "kill", model_dirs, data=reward, steps=steps, save_every=1, keep_last=2)
    ref = _run(ref_cfg, env=_env())
    assert ref.wait(timeout=600) == 0, ref.stderr.read().decode()[-2000:]

    run = tmp_path / "kill" / "run"
    ckpts = run / "checkpoints"
    rng = random.Random(0)
    killed = 0
    # 1: during a checkpoint write (a .tmp-step-* directory exists)
    p = _run(kill_cfg, env=_env())
    killed += _kill_when(p, lambda: ckpts.exists() and any(d.name.startswith(".tmp-") for d in ckpts.iterdir()))
    # 2 and 3: at a random moment within the step after the resumed run has logged a new one (the moment
    # scaled to this machine's step time, so a fast machine cannot finish the run first)
    ref_log = (tmp_path / "ref" / "run" / "metrics.jsonl").read_text().splitlines()
    step_s = sorted(json.loads(r)["time/step_s"] for r in ref_log)[steps // 2]
    for _ in range(2):
        before = _n_rows(run)
        p = _run(kill_cfg, env=_env())
        delay, seen = rng.uniform(0.0, 0.8) * step_s, []

        def progressed():
            if not seen and _n_rows(run) > before:
                seen.append(time.time())
            return bool(seen) and time.time() - seen[0] > delay

        killed += _kill_when(p, progressed)
    assert killed == 3, "each run was expected to be killed before finishing"
    p = _run(kill_cfg, env=_env())
    assert p.wait(timeout=600) == 0, p.stderr.read().decode()[-2000:]

    ref_rows = _rows(tmp_path / "ref" / "run")
    assert len(ref_rows) == steps and any(r["train/grad_norm"] > 0 for r in ref_rows), "the run must train"
    assert _rows(run) == ref_rows
    a = load_file(str(run / "final" / "model.safetensors"))
    b = load_file(str(tmp_path / "ref" / "run" / "final" / "model.safetensors"))
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    assert not any(d.name.startswith(".tmp-") for d in ckpts.iterdir())
    assert len([d for d in ckpts.iterdir() if d.name.startswith("step-")]) <= 2


def test_existing_run_without_checkpoint_needs_restart(tmp_path, model_dirs):
    from tandem_rlvr.cli import main

    cfg = write_config(tmp_path, model_dirs, steps=1, save_every=0)
    run = tmp_path / "run"
    run.mkdir()
    (run / "metrics.jsonl").write_text('{"step": 1}\n')
    assert main(["train", str(cfg)]) == 2
    assert main(["train", str(cfg), "--restart"]) == 0


def test_a_kill_while_pruning_leaves_no_checkpoint_behind_for_ever(tmp_path, monkeypatch):
    """Pruning renames a checkpoint to .trash-* before deleting it: a kill mid-delete leaves trash the next
    prune removes, never a half-deleted step-N that no longer counts as complete and so is never pruned."""
    import shutil

    from tandem_rlvr.training import checkpoint as ck

    root = tmp_path / "checkpoints"
    for step in (1, 2, 3):
        d = root / f"step-{step}"
        d.mkdir(parents=True)
        (d / ck.MARKER).write_text("")
        (d / "trainer_state.json").write_text("{}")
        (d / "model.safetensors").write_bytes(b"w" * 10)
    real = shutil.rmtree

    def killed(path, *a, **k):  # deletes the marker first, then the process dies
        (Path(path) / ck.MARKER).unlink(missing_ok=True)
        raise KeyboardInterrupt

    monkeypatch.setattr(ck.shutil, "rmtree", killed)
    with pytest.raises(KeyboardInterrupt):
        ck.prune(root, keep_last=2)
    monkeypatch.setattr(ck.shutil, "rmtree", real)
    ck.prune(root, keep_last=2)
    assert sorted(d.name for d in root.iterdir()) == ["step-2", "step-3"]


@pytest.mark.parametrize("damage", ["cut row 2", "not utf-8", "samples"])
def test_a_damaged_log_row_stops_the_resume_in_one_line_and_every_row_stays(tmp_path, model_dirs, capsys, damage):
    """A finished run whose metrics.jsonl row 2 was cut short (rows 3 and 4 intact), holds a byte that is not
    UTF-8, or whose samples.jsonl has a damaged row: the same command resumes at its checkpoint and must not
    drop the intact rows after the damage (it wrote 1 row back of 4, silently) nor crash with a traceback: exit
    2, one line naming the file and the line, the files as they were."""
    from tandem_rlvr.cli import main

    cfg = write_config(tmp_path, model_dirs, steps=4, save_every=2, log_samples=1, log_every=1)
    assert main(["train", str(cfg)]) == 0
    run = tmp_path / "run"
    name = "samples.jsonl" if damage == "samples" else "metrics.jsonl"
    lines = (run / name).read_bytes().splitlines(keepends=True)
    assert len(lines) >= 4
    lines[1] = lines[1][:40] + b"\n" if damage != "not utf-8" else lines[1][:-1] + b"\xff\n"
    (run / name).write_bytes(b"".join(lines))
    def files():  # run.lock is rewritten with the holder's start time
        return {p.name: p.read_bytes() for p in run.iterdir() if p.is_file() and p.name != "run.lock"}

    before = files()
    capsys.readouterr()
    assert main(["train", str(cfg)]) == 2
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert str(run / name) in err and "line 2" in err and "Traceback" not in err
    assert files() == before
