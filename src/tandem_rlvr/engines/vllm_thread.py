"""The thread every call into an in-process vLLM engine runs on (both vLLM engines), its time limit and shutdown.

Torch-only (no vLLM import). One daemon thread per engine makes every call (rollouts, weight pushes,
sleep, shutdown), so a call that hangs can be timed out: the caller gets :class:`EngineFault` after
``rollout.vllm_timeout_s`` and the thread is abandoned, never joined or waited for again.

What is per thread in torch is given to the engine thread from the thread that built the engine:

* the CUDA device: vLLM sets ``cuda:LOCAL_RANK`` in the thread that builds the engine, and the current
  device is per thread, so without this the engine thread of rank >= 1 would work on cuda:0 (the
  async output copy, the slot-mapping kernels and an FSDP unshard of a weight push on the wrong device);
* OpenMP's thread count (vLLM's CPU attention checks that it runs with the count it was built with).
"""

from __future__ import annotations

import logging
import queue
import threading
from collections.abc import Callable

import torch

from tandem_rlvr.errors import TandemError

__all__ = ["EngineFault", "EngineThread", "caller_device", "shutdown_llm"]
log = logging.getLogger(__name__)
_CALLER = object()  # EngineThread's default: the device of the thread that creates it


class EngineFault(TandemError):
    """The vLLM engine raised or stopped answering mid-rollout; the run stops, the last checkpoint is kept."""


def caller_device() -> int | None:
    """This thread's CUDA device index (None without CUDA)."""
    return torch.cuda.current_device() if torch.cuda.is_available() else None


def shutdown_llm(llm) -> None:
    """Shut a ``vllm.LLM``'s engine core down (vLLM 0.32: ``llm.llm_engine.engine_core.shutdown()``, which its
    in-process client makes idempotent; the executor's workers are released, and vLLM's teardown also
    destroys torch.distributed's default process group when one is initialised). Nothing for a stand-in."""
    core = getattr(getattr(llm, "llm_engine", None), "engine_core", None)
    if core is not None and hasattr(core, "shutdown"):
        core.shutdown()


class EngineThread:
    """One daemon thread that makes every call into an in-process engine (see the module docstring).

    ``device``: the CUDA device the thread sets before its first call (default: the creating thread's,
    :func:`caller_device`; None sets none); ``device_setter``: how (default ``torch.cuda.set_device``;
    tests record the calls)."""

    def __init__(self, *, device=_CALLER, device_setter: Callable[[int], None] | None = None,
                 name: str = "vllm-engine"):
        self.device = caller_device() if device is _CALLER else device
        self.set_device = device_setter or torch.cuda.set_device
        self.inbox: queue.Queue = queue.Queue()
        self.threads = torch.get_num_threads()
        self.hung: str | None = None  # what the abandoned call was doing
        self.closed = False
        threading.Thread(target=self._loop, name=name, daemon=True).start()

    def _setup(self) -> BaseException | None:
        try:
            set_threads = getattr(torch._C, "set_num_threads", None)  # vLLM's CPU worker made torch's a no-op
            if set_threads is not None:
                set_threads(self.threads)
            if self.device is not None:
                self.set_device(self.device)
        except BaseException as e:  # noqa: BLE001 - every call reports it
            return e
        return None

    def _loop(self) -> None:
        failed = self._setup()
        while True:
            item = self.inbox.get()
            if item is None:
                return
            fn, box = item
            if failed is not None:
                box.put((False, failed))
                continue
            try:
                box.put((True, fn()))
            except BaseException as e:  # noqa: BLE001 - handed to the caller, which raises it with context
                box.put((False, e))

    def call(self, fn, timeout_s: float, what: str):
        """``fn()`` on the engine thread; :class:`EngineFault` if it raises or takes longer than ``timeout_s``
        (the thread is then abandoned: every later call fails at once)."""
        if self.hung is not None:
            raise EngineFault(f"the vLLM engine is still busy with {self.hung}, which did not finish in time; "
                              f"{what} cannot run")
        if self.closed:
            raise EngineFault(f"the vLLM engine is closed; {what} cannot run")
        box: queue.Queue = queue.Queue(maxsize=1)  # this call's own answer: a late one never reaches another call
        self.inbox.put((fn, box))
        try:
            ok, value = box.get(timeout=timeout_s)
        except queue.Empty:
            self.hung = what
            raise EngineFault(f"the vLLM engine did not finish {what} within {timeout_s:g} s (rollout.vllm_timeout_s); "
                              "stopping the run, the last checkpoint is kept") from None
        if not ok:
            raise EngineFault(f"the vLLM engine failed in {what}: {type(value).__name__}: {value}; stopping the run, "
                              "the last checkpoint is kept") from value
        return value

    def close(self, shutdown: Callable[[], None], timeout_s: float) -> None:
        """Run ``shutdown`` on the engine thread (within ``timeout_s``), then end the thread. Idempotent; an
        abandoned (hung) thread is left alone, never waited for. Never raises: a failed shutdown is logged
        (the caller is on its way out, often with another error to report)."""
        if self.closed:
            return
        if self.hung is None:
            try:
                self.call(shutdown, timeout_s, "the engine shutdown")
            except EngineFault as e:
                log.warning("%s", e)
        else:
            log.warning("the vLLM engine is left running: it is still busy with %s", self.hung)
        self.closed = True
        if self.hung is None:
            self.inbox.put(None)
