"""The one place that picks a rollout engine from a setting (training config or evaluation options)."""

from __future__ import annotations

from collections.abc import Sequence

from tandem_rlvr.engines.base import Engine, FirstServing
from tandem_rlvr.engines.inprocess import InProcessEngine


def training_engine(cfg, pair, senior, schedule, *, eos_token_ids: Sequence[int], num_processes: int = 1,
                    vllm_engine=None, max_model_len: int | None = None) -> Engine:
    """The engine of a training run (rolling out ``schedule``): the text bridge for a junior with another tokenizer, else
    ``rollout.engine`` (``hf``: in-process in ``rollout.mode``, recording the junior's log-probs of
    tandem rollouts; ``vllm``: ``vllm_engine`` or new vLLM engines of ``max_model_len`` positions, the
    context the run needs (:mod:`tandem_rlvr.context`))."""
    pad = pair.tokenizer.pad_token_id
    if pair.junior_tokenizer is not None:
        from tandem_rlvr.engines.bridge import BridgeEngine

        return BridgeEngine(senior, pair.tokenizer, pair.junior, pair.junior_tokenizer, eos_token_ids=eos_token_ids)
    if cfg.rollout.engine == "vllm":
        if vllm_engine is not None:
            return vllm_engine
        from tandem_rlvr.engines.vllm_dual import training_engine as vllm_engines

        return vllm_engines(cfg, uses_junior=schedule.name != "none", eos_token_ids=eos_token_ids, pad_token_id=pad,
                            num_processes=num_processes, max_model_len=max_model_len)
    return InProcessEngine(senior, pair.junior, eos_token_ids=eos_token_ids, pad_token_id=pad, mode=cfg.rollout.mode,
                           record_junior=True)


def eval_engine(kind: str, mode: str, senior, junior, *, eos_token_ids: Sequence[int], pad_token_id: int,
                vllm_llm=None) -> Engine:
    """The engine of an evaluation: in-process (``kind`` ``hf``, in ``mode``), or for ``vllm`` the dual vLLM
    engine ``vllm_llm`` for what it serves (every schedule, solo on the senior stack alone), then in-process
    for the rest (nothing today; kept so an engine that serves fewer still works)."""
    local = InProcessEngine(senior, junior, eos_token_ids=eos_token_ids, pad_token_id=pad_token_id, mode=mode)
    if kind != "vllm":
        return local
    from tandem_rlvr.engines.vllm_dual import DualVLLMEngine

    return FirstServing(DualVLLMEngine(vllm_llm, eos_token_ids=eos_token_ids, pad_token_id=pad_token_id), local)
