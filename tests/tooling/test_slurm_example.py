"""examples/slurm/train.sbatch: valid bash, the exit code and marker the trainer uses, a launch line that
accelerate's and tandem-rlvr's parsers accept, and the requeue decision, run with stand-ins for srun,
scontrol and accelerate (no SLURM here): preempted (exit 143, or the launcher's 1 with a fresh
preempted.json) -> scontrol requeue; done, a config problem or a stale marker -> no requeue."""

from __future__ import annotations

import os
import re
import shlex
import signal
import subprocess
import sys
import time

import pytest

from helpers.paths import ROOT
from tandem_rlvr.config import TrainConfig, load_config
from tandem_rlvr.training import preempt

SCRIPT = ROOT / "examples" / "slurm" / "train.sbatch"
TEXT = SCRIPT.read_text(encoding="utf-8")

FAKES = {
    # srun: run the task once, as node 0 (its own options dropped)
    "srun": 'while [ "${1#--}" != "$1" ]; do shift; done\nSLURM_NODEID=0 exec "$@"\n',
    "scontrol": 'if [ "$1" = show ]; then echo node1; echo node2; else echo "scontrol $*" >>"$FAKE_LOG"; fi\n',
    # accelerate: log the launch, then behave as the run would (FAKE_RC, FAKE_MARKER=1: write preempted.json)
    "accelerate": ('printf "%s\\n" "$@" >"$FAKE_ARGS"\n'
                   'while [ -n "${FAKE_HOLD:-}" ] && [ ! -e "$FAKE_HOLD" ]; do sleep 0.05; done\n'
                   'mkdir -p "$OUT_DIR"\n'
                   '[ "${FAKE_MARKER:-0}" = 1 ] && echo \'{"signal": "SIGUSR1"}\' >"$OUT_DIR/preempted.json"\n'
                   'exit "${FAKE_RC:-0}"\n'),
    "tandem-rlvr": f'exec {shlex.quote(sys.executable)} -m tandem_rlvr "$@"\n',
}


def test_the_script_is_valid_bash():
    r = subprocess.run(["bash", "-n", str(SCRIPT)], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr


def test_it_uses_the_trainers_exit_code_marker_and_signals():
    code = re.search(r"^PREEMPT_EXIT_CODE=(\d+)", TEXT, re.M)
    assert code and int(code.group(1)) == TrainConfig().preempt_exit_code
    marker = re.search(r"^MARKER=(\S+)", TEXT, re.M)
    assert marker and marker.group(1) == preempt.MARKER
    sig = re.search(r"^#SBATCH --signal=(B:)?(\w+)@(\d+)", TEXT, re.M)
    assert sig and not sig.group(1), "the steps get the signal, not the batch shell"
    assert getattr(signal, f"SIG{sig.group(2)}") in preempt.SIGNALS
    forwarded = re.search(r"TORCHELASTIC_SIGNALS_TO_HANDLE=(\S+)", TEXT).group(1).split(",")
    assert f"SIG{sig.group(2)}" in forwarded and "SIGTERM" in forwarded
    assert int(re.search(r"TORCH_ELASTIC_SHUTDOWN_TIMEOUT=(\d+)", TEXT).group(1)) < int(sig.group(3))
    assert re.search(r"^#SBATCH --requeue$", TEXT, re.M)


def _run(tmp_path, *, rc=0, marker=False, args=(), hold=None, env_extra=None):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    for name, body in FAKES.items():
        (bin_dir / name).write_text("#!/usr/bin/env bash\n" + body)
        (bin_dir / name).chmod(0o755)
    env = {**os.environ, "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}",
           "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT / "src"), os.environ.get("PYTHONPATH")])),
           "SLURM_JOB_ID": "4242", "SLURM_JOB_NODELIST": "node[1-2]", "SLURM_JOB_NUM_NODES": "2",
           "OUT_DIR": str(tmp_path / "runs" / "trlvr"), "FAKE_LOG": str(tmp_path / "log"),
           "FAKE_ARGS": str(tmp_path / "args"), "FAKE_RC": str(rc), "FAKE_MARKER": str(int(marker)),
           "FAKE_HOLD": str(hold or ""), "TMPDIR": str(tmp_path), **(env_extra or {})}
    return subprocess.Popen(["bash", str(SCRIPT), *args], cwd=tmp_path, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)


def _requeues(tmp_path) -> list[str]:
    log = tmp_path / "log"
    return log.read_text().splitlines() if log.exists() else []


def test_the_launch_line_is_one_accelerate_and_tandem_rlvr_accept(tmp_path):
    from accelerate.commands.launch import launch_command_parser

    p = _run(tmp_path, args=["train.seed=1"])
    out, _ = p.communicate(timeout=120)
    assert p.returncode == 0, out
    argv = (tmp_path / "args").read_text().splitlines()
    assert argv[0] == "launch"
    launch = launch_command_parser().parse_args(argv[1:])
    assert launch.config_file.endswith("tandem_rlvr/configs/accelerate/ddp_2nodes.yaml")
    assert (launch.num_machines, launch.machine_rank, launch.num_processes) == (2, 0, 8)
    assert launch.main_process_ip == "node1" and launch.module
    assert launch.training_script == "tandem_rlvr" and launch.training_script_args[:2] == ["train", "paper/trlvr"]
    overrides = launch.training_script_args[2:]
    assert overrides == [f"train.out_dir={tmp_path / 'runs' / 'trlvr'}", "train.seed=1"]
    assert load_config("paper/trlvr", overrides).train.seed == 1
    assert _requeues(tmp_path) == [] and "run ended with exit 0" in out
    assert not list((tmp_path / "runs").glob(".tandem-start.*")), "the start stamp is removed"


@pytest.mark.parametrize(("rc", "marker", "requeued", "exit_code"), [
    (143, False, True, 0),   # the run's own exit code (srun without a launcher passes it through)
    (1, True, True, 0),      # the launcher's 1, and the run's fresh preempted.json
    (2, False, False, 2),    # a problem to fix: not requeued
    (1, False, False, 1),    # a crash: not requeued
])
def test_the_requeue_decision(tmp_path, rc, marker, requeued, exit_code):
    (tmp_path / "runs" / "trlvr").mkdir(parents=True)
    p = _run(tmp_path, rc=rc, marker=marker)
    out, _ = p.communicate(timeout=120)
    assert p.returncode == exit_code, out
    assert _requeues(tmp_path) == (["scontrol requeue 4242"] if requeued else []), out


def test_a_stale_marker_from_an_earlier_start_is_no_preemption(tmp_path):
    run = tmp_path / "runs" / "trlvr"
    run.mkdir(parents=True)
    (run / "preempted.json").write_text("{}")
    old = time.time() - 3600
    os.utime(run / "preempted.json", (old, old))
    p = _run(tmp_path, rc=1)
    out, _ = p.communicate(timeout=120)
    assert p.returncode == 1 and _requeues(tmp_path) == [], out


def test_max_requeues_stops_the_loop(tmp_path):
    p = _run(tmp_path, rc=143, env_extra={"SLURM_RESTART_COUNT": "20"})
    out, _ = p.communicate(timeout=120)
    assert p.returncode == 143 and _requeues(tmp_path) == [] and "MAX_REQUEUES=20 reached" in out, out


def test_a_sigterm_to_the_batch_shell_waits_for_the_runs_checkpoint(tmp_path):
    hold = tmp_path / "release"
    p = _run(tmp_path, rc=1, marker=True, hold=hold)
    try:
        deadline = time.monotonic() + 60
        while not (tmp_path / "args").exists():  # the run has started
            assert time.monotonic() < deadline and p.poll() is None
            time.sleep(0.05)
        p.send_signal(signal.SIGTERM)  # a preemption signals this shell too
        time.sleep(0.3)
        assert p.poll() is None, "the batch shell died with the run still checkpointing"
    finally:
        hold.write_text("")  # the stand-in run ends whatever happened (no process left behind)
    out, _ = p.communicate(timeout=120)
    assert p.returncode == 0 and _requeues(tmp_path) == ["scontrol requeue 4242"], out
    assert "SIGTERM: waiting for the run to checkpoint" in out
