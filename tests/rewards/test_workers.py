"""The verifier workers end with the run, start isolated from the current directory, and are held to
their memory cap (docs/faults.md; tandem_rlvr.rewards.workers)."""

import math
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from helpers.paths import TESTS
from tandem_rlvr.rewards import RewardScorer

HOSTILE = "open({marker!r}, 'w').write(__name__)\nraise ImportError('hostile ' + __name__)\n"


def _state(pid: int) -> str:
    """The process state letter of ``pid`` (Z: dead, not yet reaped), or "" once it is gone."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return ""


@pytest.mark.parametrize("pythonpath", [True, False], ids=["PYTHONPATH", "no-PYTHONPATH"])
def test_workers_ignore_modules_in_the_current_directory(tmp_path, monkeypatch, pythonpath):
    """A sympy.py, math_verify.py and tandem_rlvr.py in the current directory are not what the workers import;
    the package is found with or without PYTHONPATH (the worker puts its source directory first)."""
    marker = tmp_path / "imported"
    for name in ("sympy", "math_verify", "tandem_rlvr"):
        (tmp_path / f"{name}.py").write_text(HOSTILE.format(marker=str(marker)))
    monkeypatch.chdir(tmp_path)
    if not pythonpath:
        monkeypatch.delenv("PYTHONPATH", raising=False)
    with RewardScorer("math", num_workers=1, time_limit=30) as scorer:
        rewards, stats = scorer.score(["so \\boxed{\\frac{1}{2}}", "\\boxed{3}"], ["0.5", "2"])
    assert rewards == [1.0, 0.0] and stats["reward/errors"] == 0, stats
    assert not marker.exists(), f"a worker imported {marker.read_text()} from the current directory"


@pytest.mark.skipif(not Path("/proc/self/statm").exists(), reason="the resident-memory cap reads /proc")
def test_a_check_over_the_memory_cap_is_an_error_and_its_worker_is_replaced():
    """2^(2^27) needs about a hundred MB more than an idle worker: with the cap just above the idle worker's resident
    memory the check is counted as an error (not a silent 0), the worker is replaced, and the next check runs."""
    with RewardScorer("math", num_workers=1, memory_limit_mb=None) as probe:
        probe.start()
        pid = probe._workers[0].proc.pid
        rss = int(Path(f"/proc/{pid}/statm").read_text().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    cap_mb = math.ceil(rss / 2**20) + 16
    with RewardScorer("math", num_workers=1, time_limit=60, memory_limit_mb=cap_mb) as scorer:
        rewards, stats = scorer.score(["\\boxed{2^{2^{27}}}", "\\boxed{2.0}"], ["1", "2"])  # 2.0: checked by a worker
        assert rewards == [0.0, 1.0] and stats["reward/errors"] == 1 and stats["reward/worker_restarts"] == 1, stats
        rewards, stats = scorer.score(["\\boxed{4.0}"], ["4"])
    assert rewards == [1.0] and stats["reward/errors"] == 0, stats


def test_the_parent_reads_a_busy_workers_memory_and_replaces_it_over_the_cap(monkeypatch):
    """The parent's own reading of a busy worker's memory (a check in C code holds the worker's GIL, so the
    worker's guard thread may not run): a worker read as over its cap while checking is killed, its check
    an error, and a new one runs the next check; an idle worker is never read as busy. Here the worker's
    own guard never fires (a 10 GB cap) and the parent is made to read 20 GB for the busy worker."""
    from tandem_rlvr.rewards import scorer as scorer_mod

    reads = []
    monkeypatch.setattr(scorer_mod, "rss_bytes", lambda pid: reads.append(pid) or 20_000 * 2**20)
    with RewardScorer("math", num_workers=1, time_limit=60, memory_limit_mb=10_000) as scorer:
        scorer.start()
        pid = scorer._workers[0].proc.pid
        rewards, stats = scorer.score(["\\boxed{2^{2^{26}}}"], ["1"])  # ~0.5 s of big-integer work
        assert rewards == [0.0] and stats["reward/errors"] == 1 and stats["reward/worker_restarts"] == 1, stats
        assert reads and set(reads) == {pid}
        monkeypatch.setattr(scorer_mod, "rss_bytes", lambda pid: 0)
        rewards, stats = scorer.score(["\\boxed{4.0}"], ["4"])  # not a plain integer: the new worker checks it
        assert rewards == [1.0] and stats["reward/errors"] == 0 and scorer._workers[0].proc.pid != pid, stats


def test_an_answer_already_sent_is_kept_when_the_memory_reading_comes_after_it(monkeypatch):
    """The parent reads a busy worker's memory after its wait: an answer that arrived in between is read, not
    thrown away as an error, even when the memory reads over the cap (the worker's own guard handles it)."""
    from tandem_rlvr.rewards import scorer as scorer_mod

    with RewardScorer("math", num_workers=1, time_limit=60, memory_limit_mb=10_000) as scorer:
        scorer.start()
        w = scorer._workers[0]

        def late_reading(pid):  # the reading lands once the answer is in the pipe
            end = time.monotonic() + 10
            while not w.conn.poll() and time.monotonic() < end:
                time.sleep(0.001)
            return 20_000 * 2**20

        monkeypatch.setattr(scorer_mod, "rss_bytes", late_reading)
        rewards, stats = scorer.score(["\\boxed{2^{2^{25}}}"], ["2^{2^{25}}"])  # longer than the first 20 ms wait
    assert rewards == [1.0] and stats["reward/errors"] == 0 and stats["reward/worker_restarts"] == 0, stats


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="reads process states from /proc")
def test_the_watchdog_kills_a_stuck_verifier_worker(tmp_path):
    """A worker stuck in C code (its own timer cannot stop it) does not outlive the watchdog's exit 124."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(TESTS), os.environ.get("PYTHONPATH", "")]))
    with open(tmp_path / "err.txt", "w") as err:  # a file: a surviving worker would hold a pipe open
        p = subprocess.Popen([sys.executable, str(TESTS / "helpers" / "stuck_verifier.py"), str(tmp_path / "dump.txt")],
                             env=env, stdout=subprocess.PIPE, stderr=err, text=True)
    pid = int(p.stdout.readline())
    try:
        assert p.wait(timeout=120) == 124, (tmp_path / "err.txt").read_text()[-2000:]
        t0 = time.monotonic()
        while _state(pid) not in ("", "Z") and time.monotonic() - t0 < 10:
            time.sleep(0.05)
        assert _state(pid) in ("", "Z"), f"verifier worker {pid} outlived the watchdog's exit"
    finally:
        if _state(pid) not in ("", "Z"):
            os.kill(pid, 9)
