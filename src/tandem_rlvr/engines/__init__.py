"""Rollout engines: who produces the tokens of a co-written rollout (never who writes next: that is
:mod:`tandem_rlvr.engines.handoff`'s). Every engine implements :class:`~tandem_rlvr.engines.base.Engine`; the
trainer and the evaluation describe theirs as an :class:`~tandem_rlvr.engines.spec.EngineSpec` (plain values: no
module here reads a configuration) and get it from :func:`tandem_rlvr.engines.factory.build_engine`.

- ``hf`` (:mod:`~tandem_rlvr.engines.rollout`): the in-process dual decoder, ``lockstep`` or ``catchup``, every schedule;
- ``bridge`` (:mod:`~tandem_rlvr.engines.bridge`): a junior with another tokenizer, through text, step-level schedules,
  its turns played by the one turn driver (:mod:`~tandem_rlvr.engines.turns`);
- ``vllm``: the dual engine (:mod:`~tandem_rlvr.engines.vllm_dual`: one vLLM engine holding both models, every
  schedule) and a plain engine of the senior for solo arms (:mod:`~tandem_rlvr.engines.vllm_backend`).

What every engine shares (``Rollout``, ``Sampling``, sampling helpers) is :mod:`~tandem_rlvr.engines.types`;
teacher-forced scoring of a rollout is :mod:`~tandem_rlvr.engines.scoring`.

Each handoff schedule is defined once, torch-free, in :mod:`tandem_rlvr.engines.schedules` (the registry every
list of schedules derives from); what each engine serves is declared once, torch-free, in
:mod:`tandem_rlvr.engines.serving` (the configuration asks both). This package's ``__init__`` imports nothing heavy.
"""
