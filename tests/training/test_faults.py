"""What a cluster throws at a long run: preemption signals, a damaged newest checkpoint, a full disk,
a vanished peer, a hung step (docs/faults.md)."""

import json
import logging
import os
import random
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import torch
import yaml
from safetensors.torch import load_file

from helpers.paths import TESTS
from helpers.processes import free_port as _free_port
from helpers.run_files import count_metrics_rows as _n_rows, metrics_rows as _rows, write_config
from tandem_rlvr import integrity
from tandem_rlvr.training import checkpoint, preempt
from tandem_rlvr.cli import main

REWARD = {"reward": "helpers.rewards_for_tests:length_reward"}


def _env(**extra):
    env = dict(os.environ, HF_HUB_OFFLINE="1", TOKENIZERS_PARALLELISM="false", OMP_NUM_THREADS="1",
               PYTHONFAULTHANDLER="1", **extra)  # an abort prints every thread's Python stack
    env["PYTHONPATH"] = os.pathsep.join([str(TESTS), env.get("PYTHONPATH", "")])
    return env


def _cfg(d: Path, model_dirs, steps=6, data=REWARD, **train):
    d.mkdir(parents=True, exist_ok=True)
    return write_config(d, model_dirs, data=data, steps=steps, **{"save_every": 2, "keep_last": 2, **train})


def _assert_same_end(run, ref):
    ref_rows = _rows(ref)
    assert any(r["train/grad_norm"] > 0 for r in ref_rows), "the reference run must train"
    assert _rows(run) == ref_rows
    a, b = load_file(str(Path(run) / "final" / "model.safetensors")), load_file(str(Path(ref) / "final" / "model.safetensors"))
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def _wait_rows(proc_alive, run, more_than, delay, timeout=300):
    """Wait until ``run`` logged more than ``more_than`` rows, then ``delay`` seconds; False if it ended first."""
    t0 = time.time()
    while time.time() - t0 < timeout and proc_alive():
        if _n_rows(run) > more_than:
            time.sleep(delay)
            return proc_alive()
        time.sleep(0.01)
    return False


def _checkpoint_named(stderr: str) -> Path:
    line = [x for x in stderr.splitlines() if x.startswith("tandem-rlvr train: preempted")][-1]
    return Path(line.split("with checkpoint ")[1].split(";")[0])


@pytest.fixture(scope="module")
def reference(tmp_path_factory, model_dirs):
    """An uninterrupted 6-step run (in-process)."""
    d = tmp_path_factory.mktemp("ref")
    assert main(["train", str(_cfg(d, model_dirs))]) == 0
    return d / "run"


def test_sigterm_and_sigusr1_stop_with_a_checkpoint_and_resume_equals_uninterrupted(tmp_path, model_dirs, reference,
                                                                                     monkeypatch):
    rng = random.Random(17)
    # paced reward (same values as the reference's): steps last long enough that both signals land mid-run
    cfg = _cfg(tmp_path, model_dirs, data={"reward": "helpers.rewards_for_tests:paced_length_reward"})
    run = tmp_path / "run"
    # 1: SIGTERM from outside at a random moment after the first step, a second one 20 ms later
    p = subprocess.Popen([sys.executable, "-m", "tandem_rlvr", "train", str(cfg)], env=_env(),
                         stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    assert _wait_rows(lambda: p.poll() is None, run, 0, rng.uniform(0, 0.5)), "the run ended before the signal"
    p.send_signal(signal.SIGTERM)
    time.sleep(0.02)
    p.send_signal(signal.SIGTERM)
    err = p.communicate(timeout=300)[1]
    assert p.returncode == 143, err[-2000:]
    ckpt = _checkpoint_named(err)
    assert "received SIGTERM" in err and ckpt.is_dir() and integrity.damage(ckpt) is None
    assert not [d for d in (run / "checkpoints").iterdir() if d.name.startswith(".tmp-")]
    stopped_at = int(ckpt.name.split("-")[1])
    assert _n_rows(run) == stopped_at, "the rows logged are those of the checkpoint"
    assert json.loads((run / "preempted.json").read_text())["signal"] == "SIGTERM"

    # 2: SIGUSR1 at a random moment of the resumed run (in-process), and SIGTERM again while it saves
    sent = []
    real_checksums = integrity.write_checksums

    def checksums_then_signal(path):
        if sent:  # the preemption checkpoint: a second signal lands while it is being written
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(0.01)
        real_checksums(path)

    def signal_later():  # once the run's handlers are in place (never to pytest's defaults)
        t0 = time.time()
        while not callable(signal.getsignal(signal.SIGUSR1)) and time.time() - t0 < 300:
            time.sleep(0.005)
        time.sleep(rng.uniform(0, 0.6))
        if callable(signal.getsignal(signal.SIGUSR1)):
            sent.append(True)
            os.kill(os.getpid(), signal.SIGUSR1)

    monkeypatch.setattr(integrity, "write_checksums", checksums_then_signal)
    timer = threading.Thread(target=signal_later, daemon=True)
    timer.start()
    code = main(["train", str(cfg)])
    timer.join()
    assert sent and code == 143
    assert integrity.damage(checkpoint.newest_intact_checkpoint(run)) is None
    monkeypatch.setattr(integrity, "write_checksums", real_checksums)
    # 3: run to the end: same rows (but time/) and weights as the uninterrupted run
    assert main(["train", str(cfg)]) == 0
    assert not (run / "preempted.json").exists()
    _assert_same_end(run, reference)


# -- damaged checkpoints -------------------------------------------------------------------------

def _flip(path: Path):
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0x01
    path.write_bytes(bytes(data))


def _truncate(path: Path):
    data = path.read_bytes()
    path.write_bytes(data[: len(data) - 100])


@pytest.mark.parametrize("damage, name", [(_flip, "model.safetensors"), (_truncate, "model.safetensors"),
                                          (_flip, "train_state.pt"), (_truncate, "train_state.pt")])
def test_damaged_file_is_named(tmp_path, reference, damage, name):
    import shutil

    run = tmp_path / "run"
    shutil.copytree(reference, run)
    ckpts = checkpoint.newest_intact_checkpoint(run), sorted((run / "checkpoints").glob("step-*"))
    newest = ckpts[1][-1]
    assert ckpts[0] == newest and integrity.damage(newest) is None
    damage(newest / name)
    why = integrity.damage(newest)
    assert why is not None and str(newest / name) in why
    assert ("truncated" in why) == (damage is _truncate), why
    assert checkpoint.newest_intact_checkpoint(run) == ckpts[1][-2]
    assert (run / "checkpoints" / f"damaged-{newest.name}" / name).exists()


@pytest.mark.parametrize("damage, name", [(_flip, "model.safetensors"), (_truncate, "train_state.pt")])
def test_resume_skips_a_damaged_newest_checkpoint_and_ends_equal(tmp_path, model_dirs, reference, damage, name, caplog):
    caplog.set_level(logging.INFO)
    cfg = _cfg(tmp_path, model_dirs)
    run = tmp_path / "run"
    assert main(["train", str(cfg), "train.steps=4"]) == 0  # checkpoints step-2 and step-4
    damage(run / "checkpoints" / "step-4" / name)
    assert main(["train", str(cfg)]) == 0
    assert f"checkpoint step-4 is damaged: {run / 'checkpoints' / 'step-4' / name}" in caplog.text
    assert "resumed from" in caplog.text and "step-2 at step 2" in caplog.text
    _assert_same_end(run, reference)


def test_a_run_whose_every_checkpoint_is_damaged_is_refused_not_retrained(tmp_path, model_dirs, capsys):
    """The only checkpoint (``keep_last`` 1) fails its checksums: nothing to resume from. The command refuses
    (exit 2, one line naming the damaged checkpoint and --restart) and the run's metrics and models stay."""
    cfg = _cfg(tmp_path, model_dirs)
    run = tmp_path / "run"
    assert main(["train", str(cfg), "train.steps=4", "train.keep_last=1"]) == 0
    _flip(run / "checkpoints" / "step-4" / "model.safetensors")
    metrics = (run / "metrics.jsonl").read_text()
    final = (run / "final" / "model.safetensors").read_bytes()
    capsys.readouterr()
    assert main(["train", str(cfg), "train.keep_last=1"]) == 2
    err = capsys.readouterr().err
    assert "cannot be resumed" in err and "damaged-step-4" in err and "--restart" in err
    assert (run / "metrics.jsonl").read_text() == metrics
    assert (run / "final" / "model.safetensors").read_bytes() == final


# -- full disks --------------------------------------------------------------------------------

def _enospc(*_a, **_k):
    import errno

    raise OSError(errno.ENOSPC, "No space left on device")


def test_disk_full_while_checkpointing_keeps_the_previous_one(tmp_path, model_dirs, monkeypatch, capsys):
    """An injected ENOSPC in the middle of a checkpoint (after the weights were written)."""
    from tandem_rlvr.training import checkpoint

    cfg = _cfg(tmp_path, model_dirs, steps=4)
    run = tmp_path / "run"
    real_save = torch.save

    def save_then_full(obj, path, *a, **k):
        if Path(path).parent.name == ".tmp-step-4":
            Path(path).write_bytes(b"half")
            _enospc()
        real_save(obj, path, *a, **k)

    monkeypatch.setattr(checkpoint.torch, "save", save_then_full)
    assert main(["train", str(cfg)]) == 2
    err = capsys.readouterr().err
    assert "disk full while writing checkpoint step-4" in err and ".tmp-step-4" in err and "free there" in err
    assert "needed" in err and "step-2 is intact" in err
    assert sorted(d.name for d in (run / "checkpoints").iterdir()) == ["step-2"]
    assert integrity.damage(run / "checkpoints" / "step-2") is None
    assert len(_rows(run)) == 4


def test_disk_full_result_file_and_metrics_row_leave_the_old_contents(tmp_path, monkeypatch):
    from tandem_rlvr import io

    path = tmp_path / "eval.json"
    io.atomic_write_json(path, {"ok": 1})

    def half_then_full(f):
        f.write("{\"half")
        f.flush()
        _enospc()

    with pytest.raises(integrity.DiskFull, match=r"disk full while writing file .*eval.json: .* free there, about .* needed"):
        io.atomic_write(path, half_then_full)
    assert json.loads(path.read_text()) == {"ok": 1} and [p.name for p in tmp_path.iterdir()] == ["eval.json"]

    rows = tmp_path / "metrics.jsonl"
    io.append_jsonl(rows, {"step": 1})
    real_write = os.write
    monkeypatch.setattr(io.os, "write", lambda fd, b: (real_write(fd, bytes(b)[:5]), _enospc()))
    with pytest.raises(integrity.DiskFull, match="metrics.jsonl.*rows before it are intact"):
        io.append_jsonl(rows, {"step": 2, "train/loss": 0.5})
    assert rows.read_text() == '{"step": 1}\n'


def test_streamed_jsonl_is_atomic_and_names_a_full_disk(tmp_path, monkeypatch):
    """``io.AtomicJsonl`` (the evaluation's chains files): the rows appear all at once under the final name; an
    error in the block keeps the old file and leaves no temporary; a full disk is the named DiskFull."""
    from tandem_rlvr import io

    path = tmp_path / "chains" / "b.jsonl"
    with io.AtomicJsonl(path) as sink:
        sink.write({"a": "é"})
        assert not path.exists()
        sink.write({"b": 2})
    assert path.read_text(encoding="utf-8") == '{"a": "é"}\n{"b": 2}\n' and path.stat().st_mode & 0o777 == io.file_mode()
    with pytest.raises(RuntimeError, match="stop"):
        with io.AtomicJsonl(path) as sink:
            sink.write({"c": 3})
            raise RuntimeError("stop")
    assert path.read_text(encoding="utf-8") == '{"a": "é"}\n{"b": 2}\n' and os.listdir(path.parent) == ["b.jsonl"]
    monkeypatch.setattr(io.os, "fsync", _enospc)
    with pytest.raises(integrity.DiskFull, match=r"disk full while writing file .*b.jsonl: .* previous version of the file is intact"):
        with io.AtomicJsonl(path) as sink:
            sink.write({"d": 4})
    assert path.read_text(encoding="utf-8") == '{"a": "é"}\n{"b": 2}\n' and os.listdir(path.parent) == ["b.jsonl"]


def _mount_tmpfs(where: Path, size: int) -> bool:
    where.mkdir()
    res = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(where)], capture_output=True)
    return res.returncode == 0


def test_disk_full_on_a_real_small_tmpfs(tmp_path, model_dirs, capsys):
    """A tmpfs with room for the run and one checkpoint (needs mount rights; skipped without them)."""
    probe = tmp_path / "probe"
    assert main(["train", str(_cfg(probe, model_dirs, steps=1, save_every=1))]) == 0
    one = integrity.dir_bytes(probe / "run" / "checkpoints" / "step-1")
    small = tmp_path / "small"
    if not _mount_tmpfs(small, one + one // 2 + (64 << 10)):
        pytest.skip("cannot mount a tmpfs here (needs root / CAP_SYS_ADMIN)")
    try:
        cfg = _cfg(tmp_path / "cfg", model_dirs, steps=3, save_every=1, out_dir=str(small / "run"))
        assert main(["train", str(cfg)]) == 2
        err = capsys.readouterr().err
        assert "disk full while writing" in err and "free there" in err and str(small / "run") in err
        ckpts = sorted(d.name for d in (small / "run" / "checkpoints").iterdir())
        assert ckpts == ["step-1"] and integrity.damage(small / "run" / "checkpoints" / "step-1") is None
        assert [r["step"] for r in _rows(small / "run")] in ([1], [1, 2])
    finally:
        subprocess.run(["umount", str(small)], check=False)


# -- multi-process: preemption of one rank, a vanished rank --------------------------------------

def _ranks(cfg: Path, logs: Path, *extra, tag: str = "", entry=("-m", "tandem_rlvr"), **env_extra) -> list:
    """Two gloo processes started directly (as srun would), rank 0 hosting the rendezvous store."""
    port, procs = _free_port(), []
    for r in range(2):
        env = _env(RANK=str(r), LOCAL_RANK=str(r), WORLD_SIZE="2", LOCAL_WORLD_SIZE="2", MASTER_ADDR="127.0.0.1",
                   MASTER_PORT=str(port), **env_extra)
        err = open(logs / f"rank{r}{tag}.err", "w")
        procs.append(subprocess.Popen([sys.executable, *entry, "train", str(cfg), *extra], env=env,
                                      stdout=subprocess.DEVNULL, stderr=err))
    return procs


def _two_proc_cfg(d: Path, model_dirs, **train):
    cfg = _cfg(d, model_dirs, **train)
    c = yaml.safe_load(cfg.read_text())
    c["algo"]["loss_type"] = "dapo"
    c["rollout"]["batch_size"] = 4
    c["algo"]["senior_frac_band"] = [0.0, 1.0]  # tiny random models: a chunk of 4 rollouts may stray from p
    cfg.write_text(yaml.safe_dump(c))
    return cfg


@pytest.mark.slow
@pytest.mark.skipif(not torch.distributed.is_available(), reason="torch.distributed unavailable")
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGUSR1], ids=["SIGTERM", "SIGUSR1"])
def test_two_processes_one_signalled_both_stop_and_resume_equals_uninterrupted(tmp_path, model_dirs, sig):
    rng = random.Random(int(sig))
    ref_cfg, cfg = _two_proc_cfg(tmp_path / "ref", model_dirs), _two_proc_cfg(tmp_path / "pre", model_dirs)
    assert [p.wait(timeout=600) for p in _ranks(ref_cfg, tmp_path / "ref")] == [0, 0]
    run = tmp_path / "pre" / "run"
    procs = _ranks(cfg, tmp_path / "pre")
    assert _wait_rows(lambda: all(p.poll() is None for p in procs), run, rng.randrange(3), rng.uniform(0, 0.5))
    victim = rng.randrange(2)
    procs[victim].send_signal(sig)
    assert [p.wait(timeout=300) for p in procs] == [143, 143], (tmp_path / "pre" / "rank0.err").read_text()[-2000:]
    errs = [(tmp_path / "pre" / f"rank{r}.err").read_text() for r in range(2)]
    assert f"this process received {sig.name}" in errs[victim] and f"a peer process received {sig.name}" in errs[1 - victim]
    assert integrity.damage(_checkpoint_named(errs[0])) is None
    assert [p.wait(timeout=600) for p in _ranks(cfg, tmp_path / "pre", tag="-resumed")] == [0, 0]
    _assert_same_end(run, tmp_path / "ref" / "run")


@pytest.mark.skipif(not torch.distributed.is_available(), reason="torch.distributed unavailable")
def test_two_processes_stop_together_when_one_gets_sigterm(tmp_path, model_dirs):
    """The fast default-run check (the slow test above also resumes and compares)."""
    cfg = _two_proc_cfg(tmp_path, model_dirs, steps=40)
    procs = _ranks(cfg, tmp_path)
    assert _wait_rows(lambda: all(p.poll() is None for p in procs), tmp_path / "run", 0, random.Random(3).uniform(0, 0.5))
    procs[1].send_signal(signal.SIGTERM)
    codes = [p.wait(timeout=300) for p in procs]
    errs = [(tmp_path / f"rank{r}.err").read_text() for r in range(2)]
    assert codes == [143, 143], errs[0][-2000:] + errs[1][-2000:]
    assert "a peer process received SIGTERM" in errs[0] and "this process received SIGTERM" in errs[1]
    ckpts = {_checkpoint_named(e) for e in errs}
    assert len(ckpts) == 1 and integrity.damage(ckpts.pop()) is None


@pytest.mark.skipif(not torch.distributed.is_available(), reason="torch.distributed unavailable")
@pytest.mark.parametrize("sig, timeout", [(signal.SIGKILL, 20), pytest.param(signal.SIGSTOP, 40, marks=pytest.mark.slow)],
                         ids=["SIGKILL", "SIGSTOP"])
def test_a_vanished_rank_is_named_by_the_survivor_within_the_bound(tmp_path, model_dirs, sig, timeout):
    """SIGKILL: the peer's connections close (gloo fails at once); SIGSTOP: a frozen peer, the timeout applies."""
    cfg = _two_proc_cfg(tmp_path, model_dirs, steps=40, save_every=1)
    procs = _ranks(cfg, tmp_path, f"train.collective_timeout_s={timeout}")
    try:
        assert _wait_rows(lambda: all(p.poll() is None for p in procs), tmp_path / "run", 1, 0.3)
        procs[1].send_signal(sig)
        t0 = time.time()
        code = procs[0].wait(timeout=timeout + 60)
        took = time.time() - t0
    finally:
        procs[1].kill()
    err = (tmp_path / "rank0.err").read_text()
    assert code == 75, err[-2000:]
    assert took < timeout + 20, took  # the bound: the collective timeout, plus 4 s watching the heartbeats
    assert "rank 1 (last heartbeat" in err and "of 2 vanished" in err and f"collective_timeout_s={timeout}" in err
    assert integrity.damage(checkpoint.newest_intact_checkpoint(tmp_path / "run")) is None
    if sig == signal.SIGSTOP:  # silent for 30 s before the 40 s timeout: logged by its ring neighbour
        assert "rank 1 wrote no heartbeat for" in err


# -- a hung step -----------------------------------------------------------------------------------

def test_watchdog_stops_a_stalled_step_with_a_stack_dump(tmp_path, model_dirs):
    cfg = _cfg(tmp_path, model_dirs, steps=3)
    res = subprocess.run([sys.executable, "-m", "tandem_rlvr", "train", str(cfg), "train.watchdog_s=3",
                          "data.reward=helpers.rewards_for_tests:stall_in_step_two"], env=_env(), capture_output=True,
                         text=True, timeout=300)
    assert res.returncode == 124, res.stderr[-2000:]
    m = re.search(r"watchdog: rank 0 made no progress for (\d+) s in the reward and update of step 2 "
                  r"\(train.watchdog_s=3\)", res.stderr)
    assert m and 3 <= int(m.group(1)) < 30, res.stderr[-2000:]
    assert "Thread 0x" in res.stderr and "stall_in_step_two" in res.stderr  # every thread's stack, the culprit in it
    dump = (tmp_path / "run" / "watchdog-rank0.txt").read_text()
    assert "stall_in_step_two" in dump
    assert _n_rows(tmp_path / "run") == 1


def test_fault_config_keys_are_documented_and_checked():
    from tandem_rlvr.config import ConfigError, describe, load_config

    for key in ("train.preempt_exit_code", "train.watchdog_s", "train.collective_timeout_s"):
        assert key in describe()
    for bad in ("train.preempt_exit_code=75", "train.watchdog_s=-1", "train.collective_timeout_s=0"):
        with pytest.raises(ConfigError, match=bad.split("=")[0]):
            load_config(None, ["model.senior=s", "model.self_paired=true", bad])


def test_a_process_that_exits_after_a_stop_ignores_late_signals(monkeypatch):
    """The window between the guard's exit and the process's exit: a late SIGTERM must not kill it (-15)."""
    guard = preempt.RunGuard.__new__(preempt.RunGuard)
    guard._old, guard.signum = {}, None
    before = signal.getsignal(signal.SIGTERM)
    for exits, stopped, expect_late in [(True, True, True), (True, False, False), (False, True, False)]:
        monkeypatch.setattr(preempt, "EXIT_AFTER_STOP", exits)
        guard.signum = signal.SIGTERM if stopped else None
        guard._old = {signal.SIGTERM: before}
        guard._uninstall()
        now = signal.getsignal(signal.SIGTERM)
        assert (now is preempt._late_signal) == expect_late, (exits, stopped)
        signal.signal(signal.SIGTERM, before)


# -- every stop ends with its code, whatever threads are still blocked --------------------------------

STOP_ENTRY = TESTS / "helpers" / "stop_entry.py"


@pytest.mark.parametrize("mode", ["hang", "late"])
def test_an_engine_call_left_hung_still_exits_2_with_the_checkpoint_intact(tmp_path, model_dirs, mode):
    """The third rollout times out (EngineFault). ``hang``: the call stays blocked in a non-daemon pool thread, which
    a normal interpreter exit would wait for forever; ``late``: it returns inside C++ code while the interpreter
    finalizes, which aborts a normal exit ("terminate called without an active exception", 134). Either way the
    process ends with 2 and the message, the engine closed before the process group, the last checkpoint intact."""
    cfg = _cfg(tmp_path, model_dirs, steps=4, save_every=1)
    order = tmp_path / "order.txt"
    res = subprocess.run([sys.executable, str(STOP_ENTRY), "train", str(cfg), "rollout.vllm_timeout_s=1"],
                         env=_env(TANDEM_TEST_ENGINE=mode, TANDEM_TEST_AT="3", TANDEM_TEST_ORDER=str(order)),
                         capture_output=True, text=True, timeout=120)
    assert res.returncode == 2, res.stderr[-3000:]
    assert "error: the vLLM engine did not finish the rollout (call 3) within 1 s (rollout.vllm_timeout_s)" in res.stderr
    assert order.read_text().split() == ["engine.close", "close_process_group"]
    run = tmp_path / "run"
    assert [d.name for d in checkpoint.complete_checkpoints(run)] == ["step-1", "step-2"]
    assert integrity.damage(run / "checkpoints" / "step-2") is None and _n_rows(run) == 2


def test_the_watchdog_closes_the_engine_then_the_process_group_and_exits_124(tmp_path, model_dirs):
    """A rollout hung past train.watchdog_s (under a longer rollout.vllm_timeout_s): the watchdog's thread closes the
    engine, then the process group, and exits 124 although the main thread is still blocked in the engine call."""
    cfg = _cfg(tmp_path, model_dirs, steps=4, save_every=1)
    order = tmp_path / "order.txt"
    res = subprocess.run([sys.executable, str(STOP_ENTRY), "train", str(cfg), "rollout.vllm_timeout_s=600",
                          "train.watchdog_s=2"], env=_env(TANDEM_TEST_ENGINE="hang", TANDEM_TEST_AT="2",
                                                          TANDEM_TEST_ORDER=str(order)),
                         capture_output=True, text=True, timeout=120)
    assert res.returncode == 124, res.stderr[-3000:]
    assert "in the rollout of step 2 (train.watchdog_s=2)" in res.stderr
    assert order.read_text().split() == ["engine.close", "close_process_group"]
    assert [d.name for d in checkpoint.complete_checkpoints(tmp_path / "run")] == ["step-1"]


@pytest.mark.slow
@pytest.mark.skipif(not torch.distributed.is_available(), reason="torch.distributed unavailable")
def test_two_processes_with_a_late_engine_call_both_exit_2(tmp_path, model_dirs):
    """Both ranks' third rollout times out and returns during finalization: each closes its engine, then the process
    group (an error exit, not only success or preemption), and exits 2 without an abort or a traceback."""
    cfg = _two_proc_cfg(tmp_path, model_dirs, steps=4, save_every=1)
    procs = _ranks(cfg, tmp_path, "rollout.vllm_timeout_s=1", entry=(str(STOP_ENTRY),), TANDEM_TEST_ENGINE="late",
                   TANDEM_TEST_AT="3", TANDEM_TEST_ORDER=str(tmp_path / "order.txt"))
    codes = [p.wait(timeout=300) for p in procs]
    errs = [(tmp_path / f"rank{r}.err").read_text() for r in range(2)]
    assert codes == [2, 2], errs[0][-2000:] + errs[1][-2000:]
    for err in errs:
        assert "within 1 s (rollout.vllm_timeout_s)" in err and "Traceback" not in err and "terminate" not in err
        assert "the rollout (call 3)" in err  # the late call, after two steps and their checkpoints
    for r in range(2):
        assert (tmp_path / f"order.txt.rank{r}").read_text().split() == ["engine.close", "close_process_group"]
    assert integrity.damage(checkpoint.newest_intact_checkpoint(tmp_path / "run")) is None


class _Recorder:
    """Stand-ins for the closing steps of a run: each appends its name."""

    def __init__(self, monkeypatch, fault=None):
        from tandem_rlvr.engines.inprocess import InProcessEngine
        from tandem_rlvr.training import dist

        self.calls = []
        real_close, real_group, real_sync = InProcessEngine.close, dist.close_process_group, InProcessEngine.sync_senior
        monkeypatch.setattr(InProcessEngine, "close", lambda eng: (self.calls.append("engine.close"), real_close(eng)))
        monkeypatch.setattr(dist, "close_process_group", lambda: (self.calls.append("close_process_group"), real_group()))
        pushes = []

        def sync(eng, model):  # the push after step 2's update raises
            pushes.append(1)
            if fault is not None and len(pushes) == 2:
                raise fault
            real_sync(eng, model)

        monkeypatch.setattr(InProcessEngine, "sync_senior", sync)


@pytest.mark.parametrize("fault", [None, "tandem", "unexpected"])
def test_the_engine_is_closed_before_the_process_group_on_every_exit(tmp_path, model_dirs, monkeypatch, fault):
    """A finished run, a TandemError stop (exit 2) and an unexpected exception (raised in-process) each close the
    rollout engine, then the process group, once."""
    from tandem_rlvr.errors import TandemError

    exc = {None: None, "tandem": TandemError("the engine went away"), "unexpected": KeyError("boom")}[fault]
    rec = _Recorder(monkeypatch, exc)
    argv = ["train", str(_cfg(tmp_path, model_dirs, steps=2))]
    if fault == "unexpected":
        with pytest.raises(KeyError, match="boom"):
            main(argv)
    else:
        assert main(argv) == (0 if fault is None else 2)
    assert rec.calls == ["engine.close", "close_process_group"]


def test_a_closing_step_that_hangs_ends_the_process_with_the_decided_code(monkeypatch, capfd):
    """An engine whose close never returns: after the bound, the process ends with the code already decided (the
    hard exit is a stand-in here, which returns: the closing then goes on), naming the step."""
    from types import SimpleNamespace

    from tandem_rlvr.training import dist, watchdog

    release, exits, groups = threading.Event(), [], []
    monkeypatch.setattr(watchdog, "hard_exit", lambda code: (exits.append(code), release.set()))
    monkeypatch.setattr(dist, "close_process_group", lambda: groups.append(1))
    end = watchdog.RunEnd()
    end.trainer = SimpleNamespace(cfg=SimpleNamespace(train=SimpleNamespace(trackers=[])),
                                  acc=SimpleNamespace(is_main_process=True),
                                  engine=SimpleNamespace(close=lambda: release.wait(60)))
    closing = threading.Thread(target=end.close, args=(2,), kwargs={"wait_s": 0.2}, daemon=True)
    closing.start()
    closing.join(10)
    assert exits == [2] and not closing.is_alive()
    assert "closing the rollout engine did not finish within 0.2 s; ending the process with exit code 2" in capfd.readouterr().err
    assert end.closed == ["the rollout engine", "the process group"] and groups == [1]  # the stand-in exit returned
