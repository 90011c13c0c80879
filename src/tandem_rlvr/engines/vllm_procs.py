"""vLLM engines whose cores run in their own processes, so a senior and a junior engine decode at once.

In-process engines (``VLLM_ENABLE_V1_MULTIPROCESSING=0``, the default of
:func:`~tandem_rlvr.engines.vllm_backend.make_llm`) share this process's forward context: the turn
driver steps them one after the other. With ``processes=True`` each ``vllm.LLM`` starts its engine
core (scheduler and model) in a child process that runs a busy loop of its own: while it has
requests it keeps stepping, and ``LLMEngine.step()`` in this process only collects the outputs it
has produced. Two such engines decode at the same time.

What changes for the rest of the package:

- **Weight push**: the worker is in another process. Tensors cannot travel as ``collective_rpc``
  arguments (vLLM's msgpack decoder turns them into plain lists), so :func:`push_weights_file`
  writes them once to a safetensors file (in ``/dev/shm`` where it has room) and calls the
  ``tandem_load_weights`` method that :class:`WeightLoader` adds to vLLM's worker
  (``worker_extension_cls``); the worker reads the file and reloads its weights in place.
- **Threads (CPU backend)**: vLLM pins each engine's model worker to CPU cores
  (``VLLM_CPU_OMP_THREADS_BIND``); left on ``auto`` two engines would pin to the same cores.
  :func:`cpu_binds` splits the cores between the engines; :func:`engine_env` applies one split
  while an engine starts.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
from collections.abc import Iterable, Iterator

import torch

EXTENSION = "tandem_rlvr.engines.vllm_procs.WeightLoader"
LOAD_METHOD = "tandem_load_weights"


class WeightLoader:
    """Mixed into vLLM's worker class (``worker_extension_cls``): loads pushed weights from a file."""

    def tandem_load_weights(self, path: str) -> int:
        """Reload the model's weights in place from the safetensors file at ``path``; returns the tensor count."""
        from safetensors.torch import load_file

        weights = load_file(path)
        if hasattr(self, "reload_weights"):  # re-applies the CPU / quantised backends' repacking
            self.reload_weights(weights_iterator=iter(weights.items()), is_checkpoint_format=True)
        else:
            self.model_runner.model.load_weights(weights.items())
        return len(weights)


def _scratch_dir(nbytes: int) -> str:
    """``/dev/shm`` (memory) where it is writable and has room for ``nbytes`` with a margin (containers often
    give it 64 MB), else the temporary directory."""
    shm = "/dev/shm"
    if os.path.isdir(shm) and os.access(shm, os.W_OK) and shutil.disk_usage(shm).free > nbytes * 1.1 + 2**20:
        return shm
    return tempfile.gettempdir()


def push_weights_file(llm, weights: Iterable[tuple[str, torch.Tensor]]) -> None:
    """Push ``weights`` to a multiprocess engine's worker through a temporary safetensors file."""
    from safetensors.torch import save_file

    tensors, seen = {}, set()
    for name, w in weights:
        w = w.detach().to("cpu")
        if w.data_ptr() in seen or not w.is_contiguous():  # tied weights share storage: safetensors refuses
            w = w.contiguous().clone()
        seen.add(w.data_ptr())
        tensors[name] = w
    nbytes = sum(w.numel() * w.element_size() for w in tensors.values())
    fd, path = tempfile.mkstemp(prefix="tandem-push-", suffix=".safetensors", dir=_scratch_dir(nbytes))
    os.close(fd)
    try:
        save_file(tensors, path)
        counts = llm.collective_rpc(LOAD_METHOD, args=(path,))
    finally:
        os.unlink(path)
    if any(c != len(tensors) for c in counts):
        raise RuntimeError(f"vLLM workers loaded {counts} of {len(tensors)} pushed tensors")


def is_multiprocess(llm) -> bool:
    """Whether ``llm``'s engine core runs in another process (no in-process model executor)."""
    eng = getattr(llm, "llm_engine", llm)
    core = getattr(eng, "engine_core", None)
    return core is not None and not hasattr(core, "engine_core")


def dead_process(engine) -> str | None:
    """Why a multiprocess engine cannot answer any more (its core process exited), else None."""
    resources = getattr(getattr(engine, "engine_core", None), "resources", None)
    for proc in getattr(getattr(resources, "engine_manager", None), "processes", None) or ():
        if proc.exitcode is not None:
            return f"its engine core process {proc.pid} exited with code {proc.exitcode}"
    return None


def step_ready(engine) -> list:
    """``engine.step()``, then (multiprocess core) further steps while the core has outputs queued: one
    call collects everything the core decoded meanwhile, so the driver never falls behind it.

    Outputs are cumulative, and vLLM's outputs of one request share one token list, so an earlier
    output of a request already shows the later tokens but not the later ``finished`` flag: only each
    request's last output is kept."""
    outs = list(engine.step())
    queued = getattr(getattr(engine, "engine_core", None), "outputs_queue", None)
    if queued is None or queued.empty():
        return outs
    while not queued.empty():
        outs.extend(engine.step())
    latest = {}
    for out in outs:
        latest[out.request_id] = out  # keeps the request's first position, holds its last output
    return list(latest.values())


def cpu_binds(n_engines: int, cpus: list[int] | None = None) -> list[str]:
    """``VLLM_CPU_OMP_THREADS_BIND`` values giving ``n_engines`` engines disjoint CPU cores (``"0"``,
    ``"1"`` on two cores); with fewer cores than engines they share all of them."""
    cpus = sorted(cpus if cpus is not None else os.sched_getaffinity(0))
    if len(cpus) < n_engines:
        return [",".join(map(str, cpus))] * n_engines
    size = len(cpus) // n_engines
    return [",".join(map(str, cpus[i * size:(i + 1) * size])) for i in range(n_engines)]


@contextlib.contextmanager
def engine_env(processes: bool, cpu_bind: str | None = None) -> Iterator[None]:
    """Environment for starting one engine: its core in-process or in a child process (and, on the CPU
    backend, the cores its worker may use). vLLM reads these while the engine starts; the previous
    values come back afterwards. vLLM caches its environment once an in-process engine has started,
    so the cache is dropped here for the new values to count. In-process engines keep
    ``VLLM_ENABLE_V1_MULTIPROCESSING=0`` set: vLLM reads it again at run time."""
    env = {"VLLM_ENABLE_V1_MULTIPROCESSING": "1" if processes else "0"}
    if cpu_bind is not None:
        env["VLLM_CPU_OMP_THREADS_BIND"] = cpu_bind
    old = {k: os.environ.get(k) for k in env if processes or k != "VLLM_ENABLE_V1_MULTIPROCESSING"}
    os.environ.update(env)
    try:
        import vllm.envs as venvs

        getattr(venvs, "disable_envs_cache", lambda: None)()
        yield
    finally:
        for k, v in old.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
