"""Rollout engines: who produces the tokens of a co-written rollout (never who writes next: that is
:mod:`tandem_rlvr.engines.handoff`'s). Every engine implements :class:`~tandem_rlvr.engines.base.Engine`; the
trainer and the evaluation get one from :mod:`tandem_rlvr.engines.factory` and make one call.

- ``hf`` (:mod:`~tandem_rlvr.engines.rollout`): the in-process dual decoder, ``lockstep`` or ``catchup``, every schedule;
- ``bridge`` (:mod:`~tandem_rlvr.engines.bridge`): a junior with another tokenizer, through text, step-level schedules;
- ``vllm`` (:mod:`~tandem_rlvr.engines.vllm_backend`): vLLM engines, solo and step-level schedules.

What each serves is declared once, torch-free, in :mod:`tandem_rlvr.engines.serving` (the configuration
asks it). This package's ``__init__`` imports nothing heavy.
"""
