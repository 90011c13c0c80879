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

from tandem_rlvr.errors import EXIT_HUNG, PeerLost

log = logging.getLogger(__name__)

BEAT_S = 1.0  # heartbeat period of PeerWatch
STOP_WAIT_S = 10.0  # how long stop() waits for the heartbeat thread's last store call
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
        _end_children()
        err.flush()
        os._exit(EXIT_HUNG)


def _end_children() -> None:
    """Kill this process's multiprocessing children (reward workers) so none outlive a hard exit."""
    import multiprocessing

    for child in multiprocessing.active_children():
        child.kill()


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
