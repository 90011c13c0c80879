"""The verifier workers and signals (tandem_rlvr.rewards.workers): a preemption signal sent to the whole process
group (SLURM's SIGTERM, SIGUSR1) is the parent's to act on, so the checks in flight complete and score right;
the workers stay in the parent's process group (a group SIGKILL still ends them) and die with a parent killed
outright even while stuck in C code. Each case runs in a process of its own session, so a signal to its group
reaches nothing else."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="reads process states from /proc")

# As the trainer does (RunGuard: a flag only), with the signals sent to the group right after the 3rd and the 6th
# check were handed to the one worker, i.e. while it checks them or is about to.
GROUP_SIGNALS = r"""
import json, os, signal, sys
from tandem_rlvr.rewards import RewardScorer, workers
got = []
for s in (signal.SIGTERM, signal.SIGUSR1):
    signal.signal(s, lambda n, f: got.append(n))
send, sent = workers.Worker.send, []
def send_then_signal(self, msg):
    ok = send(self, msg)
    sent.append(msg)
    if len(sent) in (3, 6):
        os.killpg(os.getpgid(0), signal.SIGTERM if len(sent) == 3 else signal.SIGUSR1)
    return ok
comps = [f"so \\boxed{{\\frac{{{i}}}{{{i + 1}}}}}" for i in range(1, 11)]
golds = [f"{i}/{i + 1}" if i % 2 else f"{i + 1}/{i}" for i in range(1, 11)]
with RewardScorer("math", num_workers=1, time_limit=60.0) as sc:
    sc.start()
    pid = sc._workers[0].proc.pid
    same_group = os.getpgid(pid) == os.getpgid(0)
    workers.Worker.send = send_then_signal
    rewards, stats = sc.score(comps, golds)
    workers.Worker.send = send
    same_worker = sc._workers[0].proc is not None and sc._workers[0].proc.pid == pid
print(json.dumps({"got": got, "rewards": rewards, "errors": stats.get("reward/errors", 0.0),
                  "restarts": stats["reward/worker_restarts"], "same_group": same_group, "same_worker": same_worker,
                  "pid": pid}))
"""

# A parent whose one worker is stuck in C code (9^(9^9): hours; its own timer cannot stop it).
STUCK = r"""
import threading, time
from tandem_rlvr.rewards import RewardScorer
sc = RewardScorer("math", num_workers=1, time_limit=600)
sc.start()
print(sc._workers[0].proc.pid, flush=True)
threading.Thread(target=sc.score, args=(["\\boxed{9^{9^{9}}}"], ["1"]), daemon=True).start()
time.sleep(600)
"""


def _state(pid: int) -> str:
    """The process state letter of ``pid`` (R running, S sleeping, Z dead and not yet reaped), "" once gone."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return ""


def test_a_preemption_signal_to_the_process_group_does_not_kill_the_checks_in_flight():
    out = subprocess.run([sys.executable, "-c", GROUP_SIGNALS], capture_output=True, text=True, timeout=120,
                         start_new_session=True)
    assert out.returncode == 0, out.stderr[-3000:]
    r = json.loads(out.stdout.strip().splitlines()[-1])
    assert r["got"] == [signal.SIGTERM, signal.SIGUSR1], "both signals reached the parent (its group)"
    assert r["same_group"], "the worker stays in its parent's process group (a group SIGKILL ends it)"
    assert r["rewards"] == [1.0 if i % 2 else 0.0 for i in range(1, 11)], r
    assert r["errors"] == 0 and r["restarts"] == 0 and r["same_worker"], r
    assert _state(r["pid"]) in ("", "Z"), "closing the scorer still ends its worker"


def test_a_worker_stuck_in_c_code_dies_with_a_parent_killed_outright():
    """SIGKILL to the parent alone (the OOM killer): the kernel ends its busy worker (no EOF can reach it)."""
    p = subprocess.Popen([sys.executable, "-c", STUCK], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                         text=True, start_new_session=True)
    pid = int(p.stdout.readline())
    try:
        busy, end = 0, time.monotonic() + 60
        while busy < 10 and time.monotonic() < end:  # running for 0.5 s on end: in the check, not between
            busy = busy + 1 if _state(pid) == "R" else 0
            time.sleep(0.05)
        assert busy == 10, "the worker never started its check"
        p.kill()
        p.wait(timeout=30)
        end = time.monotonic() + 10
        while _state(pid) not in ("", "Z") and time.monotonic() < end:
            time.sleep(0.05)
        assert _state(pid) in ("", "Z"), f"verifier worker {pid} outlived its SIGKILLed parent"
    finally:
        p.kill()
        if _state(pid) not in ("", "Z"):
            os.kill(pid, signal.SIGKILL)
