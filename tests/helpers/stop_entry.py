"""``tandem-rlvr train`` over a stand-in rollout engine that fails the way a timed-out vLLM call does
(tests/training/test_faults.py). Run as ``python tests/helpers/stop_entry.py train CONFIG [overrides]``:
the real command (``main()`` as the process's entry point), with one difference outside the package.

The run's engine (``rollout.engine=hf``) is wrapped in :class:`StandIn`: every rollout is made on a
:class:`tandem_rlvr.engines.vllm_dual.EngineThread` (the dual vLLM engine's own thread, timed out after
``rollout.vllm_timeout_s`` with ``EngineFault``). From the ``TANDEM_TEST_AT``-th rollout on,
``TANDEM_TEST_ENGINE`` says what the call does instead:

- ``hang``: it waits for a worker of a thread pool that never finishes (pool workers are non-daemon
  threads, joined when the interpreter exits, as vLLM's are): the call stays hung for good;
- ``late``: it waits inside C++ code with the GIL released (a ``TCPStore`` wait) until the interpreter
  finalizes, then returns: a call that outlives its timeout and ends during the shutdown.

``TANDEM_TEST_ORDER=FILE``: the engine's ``close`` and ``close_process_group`` append their names to it
(``FILE.rankR`` when ``RANK`` is set).
"""

from __future__ import annotations

import os
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from datetime import timedelta

from tandem_rlvr.engines.base import EngineBase
from tandem_rlvr.engines.vllm_dual import EngineThread
from tandem_rlvr.training import build, dist

MODE, AT = os.environ.get("TANDEM_TEST_ENGINE", "hang"), int(os.environ.get("TANDEM_TEST_AT", "3"))
_KEEP: list = []  # module state of __main__: cleared (its objects finalized) when the interpreter finalizes


def record(what: str) -> None:
    path = os.environ.get("TANDEM_TEST_ORDER")
    if path:
        with open(path + (f".rank{os.environ['RANK']}" if "RANK" in os.environ else ""), "a") as f:
            f.write(what + "\n")


def hang_forever() -> None:
    pool = ThreadPoolExecutor(1, thread_name_prefix="stand-in-pool")
    _KEEP.append(pool)
    pool.submit(threading.Event().wait).result()


class _ReleaseAtFinalization:
    """Sets the key a hung call waits for when the interpreter finalizes ``__main__`` (then gives it a second)."""

    def __init__(self, store):
        self.store, self.sleep = store, time.sleep

    def __del__(self):
        self.store.set("release", "1")
        self.sleep(1.0)


def return_at_finalization() -> None:
    import torch.distributed as tdist

    store = tdist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)
    _KEEP.append(_ReleaseAtFinalization(tdist.TCPStore("127.0.0.1", store.port, is_master=False)))
    store.wait(["release"], timedelta(hours=1))  # C++ with the GIL released; it takes the GIL back on return


class StandIn(EngineBase):
    """The run's engine, called on an EngineThread; fails from the AT-th rollout on, under rollout.vllm_timeout_s (the
    real rollouts before it under a generous bound, which a loaded machine's slow step cannot reach)."""

    def __init__(self, inner, timeout_s: float):
        self.inner, self.serving, self.timeout_s = inner, inner.serving, timeout_s
        self.thread, self.calls = EngineThread(), 0

    def generate_many(self, batches, schedule, sampling, *, max_rounds=None):
        self.calls += 1
        fn = lambda: self.inner.generate_many(batches, schedule, sampling, max_rounds=max_rounds)  # noqa: E731
        timeout = max(self.timeout_s, 300.0)  # a real rollout: never cut short by a loaded machine
        if self.calls >= AT:
            fn, timeout = {"hang": hang_forever, "late": return_at_finalization}[MODE], self.timeout_s
        return self.thread.call(fn, timeout, f"the rollout (call {self.calls})")

    def generate(self, prompts, schedule, sampling, *, seed=0, max_rounds=None):
        return self.generate_many([(prompts, seed)], schedule, sampling, max_rounds=max_rounds)[0]

    def sync_senior(self, model) -> None:
        self.inner.sync_senior(model)

    def close(self) -> None:
        record("engine.close")
        self.inner.close()


_real_engine, _real_close_group = build.training_engine, dist.close_process_group


def _engine(cfg, *a, **kw):
    return StandIn(_real_engine(cfg, *a, **kw), cfg.rollout.vllm_timeout_s)


def _close_group() -> None:
    record("close_process_group")
    _real_close_group()


build.training_engine, dist.close_process_group = _engine, _close_group

if __name__ == "__main__":
    from tandem_rlvr.cli import main

    sys.argv[0] = "tandem-rlvr"
    sys.exit(main())
