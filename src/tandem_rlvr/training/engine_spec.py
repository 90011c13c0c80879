"""The training run's rollout engine: its :class:`~tandem_rlvr.engines.spec.EngineSpec` read from the config
(:func:`spec_from_config`, the only place that maps ``rollout.*`` / ``model.*`` keys onto an engine), built by the
one constructor :func:`~tandem_rlvr.engines.factory.build_engine`."""

from __future__ import annotations

from collections.abc import Sequence

from tandem_rlvr.config import Config
from tandem_rlvr.engines.base import Engine
from tandem_rlvr.engines.factory import build_engine
from tandem_rlvr.engines.spec import EngineSpec

__all__ = ["spec_from_config", "training_engine"]


def spec_from_config(cfg: Config, schedule: str, *, bridge: bool = False, max_model_len: int | None = None,
                     processes: int = 1) -> EngineSpec:
    """The engine of a run that rolls out ``schedule``: ``rollout.engine`` in ``rollout.mode`` (recording the
    junior's log-probs of tandem rollouts), or the text bridge (``bridge``: the junior has its own tokenizer).
    On vLLM: the model paths and their revisions (``model.revision``, ``model.junior_revision``; the self-paired
    junior is the senior's start weights), ``rollout.vllm_dtype``
    (``model``: ``model.dtype``; pushes cast the senior's weights to it), ``rollout.vllm_memory``,
    ``rollout.vllm_timeout_s``, ``rollout.vllm_sleep``, ``train.seed``, ``model.trust_remote_code``,
    ``model.max_context`` (vLLM allows a context past the models' config) and ``max_model_len``, the context the
    run needs (:func:`tandem_rlvr.context.engine_len`; default prompt + response budgets)."""
    m, r = cfg.model, cfg.rollout
    senior = junior = ""
    revisions = ("", "")
    if r.engine == "vllm" and not bridge:
        from tandem_rlvr.models import resolve_name

        senior = resolve_name(m.senior)
        junior = "" if schedule == "none" else senior if m.self_paired else resolve_name(m.junior)
        revisions = (m.revision, m.revision if m.self_paired else m.junior_revision)
    return EngineSpec(kind=r.engine, schedules=(schedule,), bridge=bridge, mode=r.mode, record_junior=True,
                      senior_path=senior, junior_path=junior, senior_revision=revisions[0],
                      junior_revision=revisions[1] if junior else "",
                      dtype=m.dtype if r.vllm_dtype == "model" else r.vllm_dtype,
                      memory=r.vllm_memory, max_model_len=max_model_len or r.max_prompt_tokens + r.max_new_tokens,
                      seed=cfg.train.seed, timeout_s=r.vllm_timeout_s, sleep=r.vllm_sleep,
                      trust_remote_code=m.trust_remote_code, long_context=bool(m.max_context), processes=processes)


def training_engine(cfg: Config, pair, senior, schedule, *, eos_token_ids: Sequence[int], num_processes: int = 1,
                    vllm_engine=None, max_model_len: int | None = None,
                    junior_eos_token_ids: Sequence[int] | None = None, hold_casts: bool = False) -> Engine:
    """The engine of a training run rolling out ``schedule`` over ``senior`` (unwrapped) and ``pair``'s junior:
    :func:`spec_from_config`, built. ``vllm_engine`` replaces the vLLM engines (tests)."""
    spec = spec_from_config(cfg, schedule.name, bridge=pair.junior_tokenizer is not None, max_model_len=max_model_len,
                            processes=num_processes)
    if spec.vllm and vllm_engine is not None:
        return vllm_engine
    return build_engine(spec, senior, pair.junior, eos_token_ids=eos_token_ids, pad_token_id=pair.tokenizer.pad_token_id,
                        tokenizer=pair.tokenizer, junior_tokenizer=pair.junior_tokenizer,
                        junior_eos_token_ids=junior_eos_token_ids, hold_casts=hold_casts)
