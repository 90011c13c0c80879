"""The one constructor of rollout engines: :func:`build_engine` of an :class:`~tandem_rlvr.engines.spec.EngineSpec`
(training's and evaluation's alike) and the loaded models."""

from __future__ import annotations

import os
from collections.abc import Sequence

from tandem_rlvr.engines.base import Engine
from tandem_rlvr.engines.spec import EngineSpec

__all__ = ["build_engine", "vllm_kwargs"]


def build_engine(spec: EngineSpec, senior, junior, *, eos_token_ids: Sequence[int], pad_token_id: int,
                 tokenizer=None, junior_tokenizer=None, make=None,
                 junior_eos_token_ids: Sequence[int] | None = None, hold_casts: bool = False) -> Engine:
    """The engine ``spec`` describes, over ``senior`` and ``junior`` (loaded, on their device; the vLLM engines
    load their own copies from the spec's paths). The schedules it must serve are checked first, so a refusal
    comes before anything starts. The text bridge needs both ``tokenizer`` and ``junior_tokenizer``; ``make``
    replaces ``vllm_backend.make_llm`` (tests). ``eos_token_ids`` end a row where the senior writes them,
    ``junior_eos_token_ids`` where the junior does (default: the senior's; the bridge reads the junior's own).
    ``hold_casts``: the in-process engine under mixed precision (:func:`~tandem_rlvr.engines.rollout.generate`)."""
    spec.check()
    if spec.bridge:
        from tandem_rlvr.engines.bridge import BridgeEngine

        return BridgeEngine(senior, tokenizer, junior, junior_tokenizer, eos_token_ids=eos_token_ids)
    if spec.vllm:
        return _vllm_engine(spec, eos_token_ids=eos_token_ids, pad_token_id=pad_token_id, make=make,
                            junior_eos_token_ids=junior_eos_token_ids)
    from tandem_rlvr.engines.inprocess import InProcessEngine

    return InProcessEngine(senior, junior, eos_token_ids=eos_token_ids, pad_token_id=pad_token_id, mode=spec.mode,
                           record_junior=spec.record_junior, junior_eos_token_ids=junior_eos_token_ids,
                           hold_casts=hold_casts)


def vllm_kwargs(spec: EngineSpec) -> dict:
    """The ``vllm.LLM`` arguments of ``spec`` (through :func:`~tandem_rlvr.engines.vllm_backend.make_llm`)."""
    from tandem_rlvr.engines.vllm_backend import sleep_kwargs

    kw = dict(dtype=spec.dtype, gpu_memory_utilization=spec.memory, seed=spec.seed, max_model_len=spec.max_model_len,
              trust_remote_code=spec.trust_remote_code, **sleep_kwargs(spec.sleep))
    if spec.processes > 1:  # each process holds its own engine on its own device, as colocated trainers do
        kw["distributed_executor_backend"] = "external_launcher"
    return kw


def _vllm_engine(spec: EngineSpec, *, eos_token_ids: Sequence[int], pad_token_id: int, make=None,
                 junior_eos_token_ids: Sequence[int] | None = None) -> Engine:
    """For tandem rollouts one dual engine that holds the senior and the junior and decodes each rollout as one
    request (:mod:`tandem_rlvr.engines.vllm_dual`); for solo rollouts alone a plain engine of the senior."""
    from tandem_rlvr.engines import vllm_backend as vb
    from tandem_rlvr.engines import vllm_dual
    from tandem_rlvr.models import local_snapshot

    make, kw = make or vb.make_llm, vllm_kwargs(spec)
    if spec.long_context:  # the user states the models read this far: vLLM would refuse more than their config says
        os.environ["VLLM_ALLOW_LONG_MAX_MODEL_LEN"] = "1"
    common = dict(eos_token_ids=eos_token_ids, pad_token_id=pad_token_id, timeout_s=spec.timeout_s, sleep=spec.sleep)
    # vLLM reads the files itself: a hub id as its snapshot at the run's revision (the one the trainer loaded)
    senior = local_snapshot(spec.senior_path, spec.senior_revision, code=spec.trust_remote_code)
    if spec.solo:
        return vb.VLLMEngine(make(senior, **kw), **common)
    junior = local_snapshot(spec.junior_path, spec.junior_revision, role="junior", code=spec.trust_remote_code)
    return vllm_dual.DualVLLMEngine(vllm_dual.make_dual_llm(senior, junior, make=make, **kw), **common,
                                    junior_eos_token_ids=junior_eos_token_ids)
