"""What the training loop runs inside: preemption signals, the watchdog, peer heartbeats, failed collectives.

Preemption. SIGTERM, SIGUSR1 and SIGINT (what SLURM, Kubernetes and launchers send before a kill)
only set a flag, except during a rollout of the in-process engine (``rollout.engine=hf`` and
``train.fsdp=off``), which the handler abandons at once (nothing persistent has changed yet).
Every process then meets at one of two *safe points* of each step and agrees on the flag with one
all-reduce (max of the signal numbers), so all processes stop at the same point even when only one
was signalled:

* right after the rollout (abandoned or not): the RNG states are put back to those of the step's
  start and the checkpoint holds the state after the previous step; the step is redone on resume;
* after the step's update and metrics row (and its validation and periodic save).

So a signal that lands in a rollout stops the run within one decode iteration (a multi-process run:
within the slowest unsignalled process's rollout); one that lands in the reward scoring or the
update stops it after the rest of that step's update. Then the main process writes a checkpoint
(atomically, with checksums), every process waits for it, logs why it stopped and exits with
``train.preempt_exit_code`` (143); the main process also writes ``preempted.json`` in the run
directory (a launcher such as torchrun exits with its own code). Further signals while stopping are logged and otherwise ignored,
so they cannot corrupt the checkpoint being written.
"""

from __future__ import annotations

import contextlib
import logging
import signal
import threading
from datetime import timedelta

from tandem_rlvr import checkpoint as ckpt_mod
from tandem_rlvr import dist
from tandem_rlvr.errors import Preempted
from tandem_rlvr.io import atomic_write_json
from tandem_rlvr.watchdog import PeerWatch, Watchdog, is_collective_failure, peer_lost

log = logging.getLogger(__name__)

SIGNALS = (signal.SIGTERM, signal.SIGUSR1, signal.SIGINT)
MARKER = "preempted.json"  # in the run directory from a preemption until the next start


def process_group_kwargs(cfg) -> list:
    """accelerate kwargs handlers giving every collective the ``train.collective_timeout_s`` bound."""
    from accelerate.utils import InitProcessGroupKwargs

    return [InitProcessGroupKwargs(timeout=timedelta(seconds=cfg.train.collective_timeout_s))]


class _Abandon(BaseException):
    """Raised by the signal handler inside an abandonable rollout (never escapes :class:`RunGuard`)."""


class RunGuard:
    """One training run's guard; use :meth:`running` around the loop, :meth:`beat` and :meth:`after_step` in it."""

    def __init__(self, trainer):
        self.t = trainer
        acc, tc = trainer.acc, trainer.cfg.train
        self.rank, self.world = acc.process_index, acc.num_processes
        self.exit_code = tc.preempt_exit_code
        # abandoning needs a rollout without collectives (FSDP gathers) or engine processes (vLLM)
        self.abandonable = trainer.cfg.rollout.engine == "hf" and not trainer.sharded
        self.signum: int | None = None
        self.in_rollout = self.raised = self.stopping = False
        self._old: dict = {}
        self.watchdog = Watchdog(tc.watchdog_s, dump_path=trainer.run_dir / f"watchdog-rank{self.rank}.txt",
                                 rank=self.rank)
        self.peers: PeerWatch | None = None

    # -- the context ---------------------------------------------------------------------------
    @contextlib.contextmanager
    def running(self):
        """Install the handlers and threads; turn a failed collective into a message naming the vanished rank."""
        t = self.t
        if t.acc.is_main_process:
            (t.run_dir / MARKER).unlink(missing_ok=True)
        self._install()
        self.watchdog.start()
        if self.world > 1:
            self.peers = PeerWatch.started(self.rank, self.world)
        inner, override = t.rollout, vars(t).get("rollout")  # the method, or an instance override (tests)
        t.rollout = lambda step: self._rollout(inner, step)  # the first safe point, for the loop only
        try:
            yield self
        except Exception as e:
            if self.world > 1 and not isinstance(e, Preempted) and is_collective_failure(e):
                raise peer_lost(self.peers, self.rank, e, t.cfg.train.collective_timeout_s,
                                ckpt_mod.latest_checkpoint(t.run_dir)) from e
            raise
        finally:
            vars(t).pop("rollout", None)
            if override is not None:
                t.rollout = override
            self._uninstall()
            self.watchdog.stop()
            if self.peers is not None:
                self.peers.stop()

    def beat(self, what: str) -> None:
        """Progress: the phase ``what`` of the current step begins (watchdog, heartbeats)."""
        self.watchdog.beat(what)
        if self.peers is not None:
            self.peers.state = {"phase": what}

    def after_step(self) -> None:
        """The second safe point: stop (with a checkpoint) if any process was signalled."""
        signum = self._agree()
        if signum:
            self._stop(signum, abandoned=False)

    # -- the rollout safe point ----------------------------------------------------------------
    def _rollout(self, inner, step: int):
        self.beat(f"the rollout of step {step + 1}")
        plain, tensors = ckpt_mod.rng_state()
        out, abandoned = None, False
        try:
            if self.signum is None:
                self.in_rollout = True
                out = inner(step)
        except _Abandon:
            abandoned = True
        finally:
            self.in_rollout = False
        signum = self._agree()
        if signum:
            ckpt_mod.set_rng_state(plain, tensors)  # as at the step's start: the checkpoint is the previous step's end
            self._stop(signum, abandoned=abandoned or out is None)
        self.beat(f"the reward and update of step {step + 1}")
        return out

    def _agree(self) -> int:
        """The largest signal number any process received (0: none). Collective when multi-process."""
        local = float(self.signum or 0)
        return int(dist.reduce_scalar(self.t.acc, local, "max")) if self.world > 1 else int(local)

    def _stop(self, signum: int, abandoned: bool) -> None:
        t = self.t
        self.stopping = True
        name = signal.Signals(signum).name
        self.beat("the preemption checkpoint")
        t.save()
        t.acc.wait_for_everyone()
        ckpt = t.run_dir / "checkpoints" / f"step-{t.step}"
        when = f"in the rollout of step {t.step + 1} (abandoned; redone on resume)" if abandoned else f"after step {t.step}"
        who = "this process" if self.signum == signum else "a peer process"
        msg = (f"preempted: {who} received {name}; stopped {when} with checkpoint {ckpt}; exit code "
               f"{self.exit_code}; rerun the same command to resume")
        if t.acc.is_main_process:  # for requeue scripts behind a launcher that exits with its own code
            atomic_write_json(t.run_dir / MARKER, {"signal": name, "step": t.step, "checkpoint": ckpt,
                                                   "exit_code": self.exit_code, "message": msg})
        raise Preempted(msg, self.exit_code)

    # -- signals -------------------------------------------------------------------------------
    def _install(self) -> None:
        if threading.current_thread() is not threading.main_thread():
            log.debug("not the main thread: preemption signals keep their handlers")
            return
        for sig in SIGNALS:
            self._old[sig] = signal.signal(sig, self._handler)

    def _uninstall(self) -> None:
        for sig, old in self._old.items():
            signal.signal(sig, old)
        self._old.clear()

    def _handler(self, signum, frame) -> None:
        name = signal.Signals(signum).name
        if self.signum is None:
            self.signum = signum
            where = "now, abandoning the rollout" if self.in_rollout and self.abandonable else "at the next safe point"
            log.warning("%s received: stopping %s, with a checkpoint", name, where)
        else:
            log.warning("%s received again: already stopping%s; ignored (the checkpoint is written atomically)",
                        name, " (writing the checkpoint)" if self.stopping else "")
        if self.in_rollout and self.abandonable and not self.raised:
            self.raised = True
            raise _Abandon()
