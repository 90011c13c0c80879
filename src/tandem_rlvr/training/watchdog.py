"""Hung steps and vanished peers.

:class:`Watchdog`: the trainer calls :meth:`Watchdog.beat` at each phase of a step (rollout,
reward and update, log/validate/save). A phase that lasts longer than ``train.watchdog_s`` is taken
for a hang: the watchdog thread logs which phase of which step, dumps the stack of every thread
(``faulthandler``) to stderr and to ``watchdog-rank{R}.txt`` in the run directory, ends this
process's child processes and exits with code 124. It runs in its own thread, so a main thread
stuck in a collective, a C extension or an endless Python loop is caught alike.

:class:`PeerWatch` (multi-process runs): every process writes a heartbeat (time and phase) to
the rendezvous store every :data:`BEAT_S` seconds. When a collective fails (a peer's connection
closed, or nothing came within ``train.collective_timeout_s``) the heartbeats say which rank
vanished: the one whose heartbeat stopped advancing. Each process also watches the next rank's
heartbeat and logs it once it has been silent for :data:`SILENT_S` seconds.

:class:`RunEnd`: how a ``tandem-rlvr train`` process ends, on every path (docs/faults.md, "Every stop
and its exit code"): the trackers are ended (a failed run), the rollout engine is closed, then the
process group, each step bounded by :data:`CLOSE_WAIT_S`; then the process exits with its code, by
``os._exit`` after flushing when threads that may still be blocked remain (an abandoned engine call):
one that wakes up during the interpreter's finalization aborts the process (exit 134), and a blocked
non-daemon thread would keep it from exiting at all.
"""

from __future__ import annotations

import faulthandler
import json
import logging
import os
import re
import sys
import threading
import time
from pathlib import Path
from typing import NoReturn

from tandem_rlvr.errors import EXIT_HUNG, PeerLost

log = logging.getLogger(__name__)

BEAT_S = 1.0  # heartbeat period of PeerWatch
STOP_WAIT_S = 10.0  # how long stop() waits for the heartbeat thread's last store call
CLOSE_WAIT_S = 60.0  # how long the closing of a run (trackers, engine, process group) may take before a hard exit
SILENT_S = 30.0  # a neighbour silent this long is reported at once (before any collective times out)


class Watchdog:
    """Stops the process when no :meth:`beat` came for ``seconds`` (0 = off)."""

    def __init__(self, seconds: float, *, dump_path: Path, rank: int = 0):
        self.seconds, self.dump_path, self.rank = float(seconds), Path(dump_path), rank
        self.what = "start"
        self.last = time.monotonic()
        self._stop = threading.Event()
        self._thread = None

    def start(self) -> Watchdog:
        if self.seconds > 0:
            self._thread = threading.Thread(target=self._run, name="tandem-watchdog", daemon=True)
            self._thread.start()
        return self

    def beat(self, what: str) -> None:
        """Progress: a new phase ``what`` begins now."""
        self.what, self.last = what, time.monotonic()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout=STOP_WAIT_S)  # it wakes at once: no thread left behind at exit

    def _run(self) -> None:
        while not self._stop.wait(min(1.0, self.seconds / 4)):
            if time.monotonic() - self.last > self.seconds:
                self._fire()

    def _fire(self) -> None:
        idle = time.monotonic() - self.last
        msg = (f"tandem-rlvr train: watchdog: rank {self.rank} made no progress for {idle:.0f} s in {self.what} "
               f"(train.watchdog_s={self.seconds:g}); the stack of every thread follows (also in {self.dump_path}); "
               f"stopping with exit code {EXIT_HUNG}. Rerun the same command to resume from the last checkpoint")
        err = sys.__stderr__  # the process's real stderr (faulthandler needs a file descriptor)
        print(msg, file=err, flush=True)
        faulthandler.dump_traceback(file=err, all_threads=True)
        try:
            self.dump_path.parent.mkdir(parents=True, exist_ok=True)
            with open(self.dump_path, "w", encoding="utf-8") as f:
                f.write(msg + "\n\n")
                f.flush()
                faulthandler.dump_traceback(file=f, all_threads=True)
        except OSError as e:
            print(f"(could not write {self.dump_path}: {e})", file=err)
        end = RunEnd.current
        if end is not None:  # the engine, then the process group (bounded: the main thread may hold them)
            end.close(EXIT_HUNG, wait_s=min(CLOSE_WAIT_S, max(5.0, self.seconds)))
        hard_exit(EXIT_HUNG)


def _end_children() -> None:
    """Kill this process's children so none outlive a hard exit: multiprocessing children and the verifier
    workers started with ``subprocess`` (:func:`tandem_rlvr.rewards.workers.kill_all`)."""
    import multiprocessing

    from tandem_rlvr.rewards.workers import kill_all

    for child in multiprocessing.active_children():
        child.kill()
    kill_all()


def _flush() -> None:
    for h in logging.getLogger().handlers:
        try:
            h.flush()
        except Exception:  # noqa: BLE001 - a closed stream: nothing left to flush
            pass
    for f in (sys.stdout, sys.stderr, sys.__stdout__, sys.__stderr__):
        try:
            f.flush()
        except Exception:  # noqa: BLE001
            pass


def hard_exit(code: int) -> NoReturn:
    """End the process now with ``code``: children killed, output flushed, no interpreter finalization."""
    _end_children()
    _flush()
    os._exit(code)


def stray_threads() -> list[threading.Thread]:
    """Live threads besides the main one: each may be blocked (an abandoned engine call) and wake up, or keep
    the interpreter from exiting, during its finalization."""
    return [t for t in threading.enumerate() if t is not threading.main_thread() and t.is_alive()]


class RunEnd:
    """The end of one ``tandem-rlvr train`` process: :meth:`close` (every exit path, the watchdog's too), then
    :meth:`exit`. ``trainer`` is set once the run is built; :attr:`current` is the run of this process."""

    current: RunEnd | None = None

    def __init__(self):
        self.trainer = None
        self.finished = False  # the run ended its trackers itself (Trainer._finish)
        self.closed: list[str] = []  # what was closed, in order (tests)
        self._lock = threading.Lock()
        self._started = False
        RunEnd.current = self

    def _steps(self) -> list[tuple[str, object]]:
        from tandem_rlvr.training.dist import close_process_group

        t, steps = self.trainer, []
        if t is not None:
            if not self.finished and t.cfg.train.trackers and t.acc.is_main_process:
                steps.append(("the trackers", t.acc.end_training))
            steps.append(("the rollout engine", t.engine.close))
        return steps + [("the process group", close_process_group)]

    def close(self, code: int, wait_s: float = CLOSE_WAIT_S) -> None:
        """Close, in order, the trackers (a run that did not finish), the engine, the process group; once per
        process. A step that raises is logged; one that takes over ``wait_s`` seconds ends the process with
        ``code`` (:func:`hard_exit`)."""
        with self._lock:
            if self._started:
                return
            self._started = True
        for what, fn in self._steps():
            timer = threading.Timer(wait_s, self._stuck, args=(what, wait_s, code))
            timer.daemon = True
            timer.start()
            try:
                fn()
                self.closed.append(what)
            except Exception as e:  # noqa: BLE001 - closing goes on: the exit code is already decided
                log.warning("closing %s failed: %s: %s", what, type(e).__name__, e)
            finally:
                timer.cancel()
                if timer is not threading.current_thread():
                    timer.join()
        RunEnd.current = None
        _flush()

    @staticmethod
    def _stuck(what: str, wait_s: float, code: int) -> None:
        print(f"tandem-rlvr train: closing {what} did not finish within {wait_s:g} s; ending the process with "
              f"exit code {code}", file=sys.__stderr__, flush=True)
        hard_exit(code)

    def exit(self, code: int) -> int:
        """``code``, to return from ``main``; or, when threads remain that may still be blocked, end the
        process here with it (:func:`hard_exit`)."""
        RunEnd.current = None
        stray = stray_threads()
        if stray:
            log.debug("threads left at exit (%s): ending the process with os._exit(%d)",
                      ", ".join(t.name for t in stray), code)
            hard_exit(code)
        _flush()
        return code


_COLLECTIVE_WORDS = re.compile(r"gloo|nccl|connection (closed|reset|refused)|timed out|processgroup|broken pipe|socket", re.I)


def is_collective_failure(exc: BaseException) -> bool:
    """Whether ``exc`` looks like a failed collective (a peer's connection closed, or a timeout)."""
    import torch.distributed as tdist

    dist_error = getattr(tdist, "DistError", ())
    return isinstance(exc, dist_error) or (isinstance(exc, RuntimeError) and bool(_COLLECTIVE_WORDS.search(str(exc))))


class PeerWatch:
    """Heartbeats of every rank in the rendezvous store; names the vanished rank after a failed collective."""

    def __init__(self, rank: int, world: int):
        from torch.distributed import distributed_c10d as c10d

        self.rank, self.world = rank, world
        self.store = c10d._get_default_store()  # the store every process rendezvoused through
        self.state = {"phase": "start"}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="tandem-heartbeat", daemon=True)
        self._seen, self._since, self._reported = None, time.monotonic(), False

    def start(self) -> PeerWatch:
        self._beat()
        self._thread.start()
        return self

    @classmethod
    def started(cls, rank: int, world: int) -> PeerWatch | None:
        """A running PeerWatch, or None (logged) where the store cannot be used: then failures name no rank."""
        try:
            return cls(rank, world).start()
        except Exception as e:
            log.warning("no heartbeats (the rendezvous store is not usable: %s): a vanished peer will not be named", e)
            return None

    def stop(self) -> None:
        """Stop beating and wait for the thread (at most one store call, ~ms with every peer alive): a daemon
        thread still inside the store's C++ code when the interpreter exits aborts the process."""
        self._stop.set()
        if self._thread.is_alive() and self._thread is not threading.current_thread():
            self._thread.join(timeout=STOP_WAIT_S)

    def _beat(self) -> None:
        self.store.set(f"tandem/hb/{self.rank}", json.dumps({"t": time.time(), **self.state}))

    def _run(self) -> None:
        beats = 0
        while not self._stop.wait(BEAT_S):
            try:
                self._beat()
                beats += 1
                if beats % 5 == 0:
                    self._watch_neighbour()
            except Exception:  # the store's host is gone; diagnose() says so
                return

    def _watch_neighbour(self) -> None:
        """Each rank watches the next one's heartbeat (a ring: one store read per rank every 5 s) and
        logs a silent one once, so its name is in the log even where a timed-out NCCL collective aborts
        the process before :func:`peer_lost` can run."""
        r = (self.rank + 1) % self.world
        key = f"tandem/hb/{r}"
        beat = json.loads(self.store.get(key)) if self.store.check([key]) else None
        now = time.monotonic()
        if beat != self._seen:
            self._seen, self._since = beat, now
        elif now - self._since > SILENT_S and not self._reported:
            self._reported = True
            log.error("rank %d wrote no heartbeat for %.0f s (last in %s): it vanished or is frozen; collectives "
                      "with it fail within train.collective_timeout_s", r, now - self._since,
                      beat["phase"] if beat else "nothing, never beat")

    def _read(self) -> dict[int, dict | None]:
        out = {}
        for r in range(self.world):
            key = f"tandem/hb/{r}"
            out[r] = json.loads(self.store.get(key)) if self.store.check([key]) else None
        return out

    def diagnose(self, wait_s: float = 3 * BEAT_S + 1) -> str:
        """Which ranks stopped beating (watched for ``wait_s`` seconds), in words."""
        try:
            before = self._read()
            time.sleep(wait_s)
            after = self._read()
        except Exception as e:
            return (f"the rendezvous store is unreachable ({type(e).__name__}), so rank 0 or the launcher that "
                    "hosts it vanished")
        gone = [r for r in range(self.world) if r != self.rank and (after[r] is None or after[r] == before[r])]
        if not gone:
            return (f"every rank still beats, so a peer is alive but stuck before the collective (see its watchdog); "
                    f"heartbeats: {_where(after)}")
        desc = ", ".join(f"rank {r}" + (f" (last heartbeat {time.time() - after[r]['t']:.0f} s ago, in "
                                       f"{after[r]['phase']})" if after[r] else " (never beat)") for r in gone)
        return f"{desc} of {self.world} vanished"



def peer_lost(peers: PeerWatch | None, rank: int, exc: BaseException, timeout_s: float,
              last_ckpt: Path | None) -> PeerLost:
    """The error to stop with after the collective failure ``exc`` (``peers``: None without heartbeats)."""
    first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
    first = first if len(first) <= 160 else first[:160] + "..."
    kept = f"The last checkpoint {last_ckpt} is intact" if last_ckpt else "No checkpoint was written yet"
    who = peers.diagnose() if peers is not None else "a peer vanished or stopped answering (no heartbeats to name it)"
    return PeerLost(f"{who}; rank {rank} stopped when a collective failed (train.collective_timeout_s={timeout_s:g}): "
                    f"{first}. {kept}; rerun the same command (all processes) to resume")


def _where(beats: dict) -> str:
    return "; ".join(f"rank {r}: {b['phase']}" for r, b in beats.items() if b)
