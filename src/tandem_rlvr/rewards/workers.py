"""The verifier worker processes behind :class:`tandem_rlvr.rewards.RewardScorer`.

Worker side: a loop that answers ``(job_id, gold, pred, soft_limit)`` with math-verify, its own
timeouts off, stopped by an interval timer after the soft limit (a ``BaseException`` so that
math-verify's handlers do not swallow it) and by a memory cap: a thread ends the worker (exit code
:data:`MEMORY_EXIT`) once its resident memory passes the cap, so the check counts as an error and the
parent starts a new worker; the parent also reads a busy worker's memory (that thread cannot run while a
check holds the GIL in C code). An address space of twice the cap, at least the cap + 1 GiB, is a hard
limit far behind it (math-verify swallows the ``MemoryError`` of a failed allocation, so that alone would
score 0 unnoticed). A worker ignores SIGINT, SIGTERM and SIGUSR1: sent to the whole process group (Ctrl-C, SLURM's
preemption), they are the parent's to act on, which finishes the checks in flight and closes the workers; on
Linux a worker started by the parent's main thread is SIGKILLed by the kernel when the parent dies.
Parent side: :class:`Worker`, one killable process (a fresh interpreter by default, which imports only
this module, started without the current directory on its ``sys.path``) with its connection, the
bounded-time reaping used at shutdown, and :func:`kill_all`, which ends every live worker of this
process (a hard exit: the watchdog's, or a stop with threads still blocked). The scheduling and the
hard limit live in the scorer.
"""

from __future__ import annotations

import functools
import logging
import multiprocessing
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from multiprocessing import connection as mp_connection
from pathlib import Path
from typing import Any

# -- worker side ---------------------------------------------------------------------------------


class _SoftTimeout(BaseException):
    """Raised by a worker's SIGALRM handler (a BaseException, so math-verify does not swallow it)."""


_ALARM = {"fired": False}  # set by the handler: a timeout swallowed by a bare except still counts


def _on_alarm(signum: int, frame: Any) -> None:
    _ALARM["fired"] = True
    raise _SoftTimeout()


@functools.lru_cache(maxsize=1)
def _extraction_config() -> tuple:
    from math_verify import ExprExtractionConfig, LatexExtractionConfig

    return (LatexExtractionConfig(boxed_match_priority=0), ExprExtractionConfig())


def _parse_boxed(answer: str) -> list:
    from math_verify import parse

    return parse("\\boxed{" + answer + "}", extraction_config=_extraction_config(), parsing_timeout=None)


_parse_gold = functools.lru_cache(maxsize=4096)(_parse_boxed)  # G rollouts share one gold


def _verify_pair(gold: str, pred: str) -> bool:
    """math-verify equivalence of two answer strings (gold first); no timeout of its own."""
    from math_verify import verify

    gold_parsed = _parse_gold(gold)
    pred_parsed = _parse_boxed(pred) if gold_parsed else []
    return bool(pred_parsed) and bool(verify(gold_parsed, pred_parsed, timeout_seconds=None))


def gold_is_text(gold: str) -> bool:
    """True when math-verify reads ``gold`` only as text (no math expression): Unicode math such as ``√2``,
    ``½``, ``90°`` or ``x²``. Only the same text matches such a gold; ``\\sqrt{2}`` scores 0 against ``√2``."""
    return all(isinstance(x, str) for x in _parse_gold(gold))


def _run_job(gold: str, pred: str, soft_limit: float) -> tuple[str, float]:
    """One check inside a worker: (status, score) with status ok / gold_text (scored, but the gold was read only
    as text, :func:`gold_is_text`) / timeout / error."""
    _ALARM["fired"] = False
    try:
        try:
            signal.setitimer(signal.ITIMER_REAL, soft_limit)
            ok = _verify_pair(gold, pred)
            text = gold_is_text(gold)  # cached: the parse above
        finally:
            signal.setitimer(signal.ITIMER_REAL, 0)
        if _ALARM["fired"]:
            return "timeout", 0.0
        return ("gold_text" if text else "ok"), 1.0 if ok else 0.0
    except _SoftTimeout:
        return "timeout", 0.0
    except Exception:  # noqa: BLE001 - a check never raises; MemoryError, RecursionError included
        return "error", 0.0


MEMORY_EXIT = 86  # a worker's exit code when its memory passed the cap (it exits; the parent replaces it)
MEMORY_POLL_S = 0.01


def _rss_bytes(fd: int) -> int:
    return int(os.pread(fd, 128, 0).split()[1]) * os.sysconf("SC_PAGE_SIZE")


HAS_PROC = os.path.exists("/proc/self/statm")  # Linux: resident memory can be read per process


def rss_bytes(pid: int) -> int | None:
    """Resident memory of process ``pid`` in bytes (Linux ``/proc``); None where it cannot be read."""
    try:
        fd = os.open(f"/proc/{pid}/statm", os.O_RDONLY)
    except OSError:
        return None
    try:
        return _rss_bytes(fd)
    except (OSError, ValueError, IndexError):
        return None
    finally:
        os.close(fd)


def _guard_memory(cap: int) -> None:
    """Exit the worker (:data:`MEMORY_EXIT`) once its resident memory passes ``cap`` bytes (Linux). A thread of
    the worker: it cannot run while a check holds the GIL in C code (a big integer power), so the parent
    also reads a busy worker's memory (``RewardScorer._over_memory``)."""
    try:
        fd = os.open("/proc/self/statm", os.O_RDONLY)
        _rss_bytes(fd)
    except (OSError, ValueError, IndexError):
        return  # no /proc: the address-space limit alone
    while True:
        if _rss_bytes(fd) > cap:
            os._exit(MEMORY_EXIT)
        time.sleep(MEMORY_POLL_S)


def _cap_memory(memory_limit_mb: int | None) -> None:
    if not memory_limit_mb:
        return
    cap = int(memory_limit_mb) * 1024 * 1024
    # The cap is enforced on resident memory (the guard thread and the parent's reads): a check over it is an
    # error. The address-space limit is only a backstop for one allocation too large to be watched growing, set
    # well above the cap: an allocation it refuses raises a MemoryError that math-verify turns into "not equal"
    # (a 0, not an error), so a limit near the cap would make a check over the cap a silent 0 by chance.
    backstop = max(2 * cap, cap + (1 << 30))
    try:
        import resource

        resource.setrlimit(resource.RLIMIT_AS, (backstop, backstop))
    except (ImportError, ValueError, OSError):
        pass
    threading.Thread(target=_guard_memory, args=(cap,), name="memory-cap", daemon=True).start()


# Ctrl-C and the preemption signals that SLURM & co. send to the whole process group are the parent's business:
# it finishes the step (the checks in flight included) and closes the workers itself.
IGNORED_SIGNALS = ("SIGINT", "SIGTERM", "SIGUSR1")
PR_SET_PDEATHSIG = 1  # linux/prctl.h


def _die_with_parent(parent_pid: int | None) -> None:
    """Linux: have the kernel SIGKILL this worker when the thread that started it ends (``PR_SET_PDEATHSIG``;
    ``parent_pid`` is given only for a worker started by a main thread, which lives as long as its process), so a
    worker busy in C code does not outlive a parent killed outright, now that it ignores the group's SIGTERM."""
    if parent_pid is None:
        return
    try:
        import ctypes

        if ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0) != 0:
            return
    except (OSError, AttributeError):  # not Linux: an idle worker still ends at its connection's EOF
        return
    if os.getppid() != parent_pid:  # the parent died before the prctl
        os._exit(0)


def _worker_setup(memory_limit_mb: int | None, parent_pid: int | None = None) -> None:
    for name in IGNORED_SIGNALS:
        if hasattr(signal, name):
            signal.signal(getattr(signal, name), signal.SIG_IGN)
    _die_with_parent(parent_pid)
    signal.signal(signal.SIGALRM, _on_alarm)
    _cap_memory(memory_limit_mb)
    logging.getLogger("math_verify").setLevel(logging.ERROR)  # "timeout disabled" notices
    _verify_pair("1", "1")  # import math-verify and its LaTeX parser once, before reporting ready


def _worker_main(conn: Any, memory_limit_mb: int | None, parent_pid: int | None = None) -> None:
    """Worker loop: report ready, then answer (job_id, gold, pred, soft_limit) until None or EOF."""
    _worker_setup(memory_limit_mb, parent_pid)
    conn.send(("ready", os.getpid()))
    while True:
        try:
            msg = conn.recv()
        except (EOFError, OSError):
            return
        if msg is None:
            return
        job_id, gold, pred, soft_limit = msg
        conn.send((job_id, *_run_job(gold, pred, soft_limit)))


def subprocess_entry(fd: int, memory_limit_mb: int | None, parent_pid: int | None = None) -> None:
    """Entry point of a subprocess worker: ``fd`` is its end of a socket pair."""
    _worker_main(mp_connection.Connection(fd), memory_limit_mb, parent_pid)


# -- parent side ---------------------------------------------------------------------------------


class Worker:
    """One killable worker process and its connection."""

    def __init__(self, method: str, memory_limit_mb: int | None) -> None:
        self.method, self.memory_limit_mb = method, memory_limit_mb
        self.conn: Any = None
        self.proc: Any = None
        self.ready, self.job, self.deadline, self.started_at = False, None, 0.0, 0.0

    def start(self) -> None:
        """Launch the process; it reports ("ready", pid) once math-verify is imported."""
        self.ready, self.job, self.started_at = False, None, time.monotonic()
        if self.method == "subprocess":
            parent_sock, child = socket.socketpair()
            parent: Any = mp_connection.Connection(parent_sock.detach())
        else:
            parent, child = multiprocessing.get_context(self.method).Pipe(duplex=True)
        try:
            self.proc = self._launch(child)
        except BaseException:
            parent.close()
            raise
        finally:
            child.close()  # the child process holds its own copy
        self.conn = parent

    def _launch(self, child: Any) -> Any:
        # the worker dies with this process where it is this process's child and is started by the main thread
        # (the kernel's parent-death signal follows the starting thread); a forkserver's child is the server's
        own = self.method != "forkserver" and threading.current_thread() is threading.main_thread()
        parent_pid = os.getpid() if own else None
        if self.method == "subprocess":
            proc = subprocess.Popen(worker_argv(child.fileno(), self.memory_limit_mb, parent_pid),
                                    pass_fds=(child.fileno(),), stdin=subprocess.DEVNULL)
        else:
            ctx = multiprocessing.get_context(self.method)
            proc = ctx.Process(target=_worker_main, args=(child, self.memory_limit_mb, parent_pid), daemon=True)
            proc.start()
        _LIVE[proc] = os.getpid()
        return proc

    def send(self, msg: Any) -> bool:
        try:
            self.conn.send(msg)
            return True
        except (OSError, ValueError, AttributeError):
            return False

    def kill(self) -> None:
        """Kill the process (SIGKILL) and reap it; bounded time, never raises."""
        conn, proc, self.conn, self.proc, self.ready, self.job = self.conn, self.proc, None, None, False, None
        if conn is not None:
            try:
                conn.close()
            except OSError:
                pass
        if proc is not None:
            try:
                proc.kill()
            except Exception:  # noqa: BLE001 - already gone
                pass
            _reap(proc, 2.0)
            _LIVE.pop(proc, None)


def worker_argv(fd: int, memory_limit_mb: int | None, parent_pid: int | None = None) -> list[str]:
    """The command line of a subprocess worker. ``python -c`` puts the current directory first on ``sys.path``
    (a ``sympy.py`` there would shadow the real module): the worker drops it before any import, and finds this
    package where this process found it (installed, ``PYTHONPATH`` or an editable install alike)."""
    src = str(Path(__file__).resolve().parents[2])
    code = (
        f"import sys; sys.path[:] = [{src!r}] + [p for p in sys.path if p not in ('', {src!r})]; "
        f"from tandem_rlvr.rewards.workers import subprocess_entry; "
        f"subprocess_entry({fd}, {memory_limit_mb!r}, {parent_pid!r})"
    )
    return [sys.executable, "-c", code]


_LIVE: dict = {}  # every worker process started and not yet killed (Popen or Process) -> the pid that started it


def kill_all() -> None:
    """SIGKILL every live worker this process started, without waiting (a hard exit is under way)."""
    for proc, owner in list(_LIVE.items()):
        if owner == os.getpid():  # not a copy inherited over a fork
            try:
                proc.kill()
            except Exception:  # noqa: BLE001 - already gone
                pass
            _LIVE.pop(proc, None)


def _reap(proc: Any, timeout: float) -> None:
    """Wait for a worker process (Popen or multiprocessing.Process) at most ``timeout`` seconds."""
    try:
        (proc.wait if isinstance(proc, subprocess.Popen) else proc.join)(timeout=max(0.0, timeout))
    except Exception:  # noqa: BLE001 - still running, or not ours
        pass


def shutdown_workers(workers: list[Worker], owner_pid: int) -> None:
    """Ask workers to exit, wait briefly (≤ 1 s in all), then kill the rest. Never hangs."""
    if os.getpid() != owner_pid:  # an inherited copy after fork: the workers are not ours
        return
    for w in workers:
        if w.conn is not None and w.job is None:
            w.send(None)
    end = time.monotonic() + 1.0
    for w in workers:
        if w.proc is not None:
            _reap(w.proc, end - time.monotonic())
        w.kill()


