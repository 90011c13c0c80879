"""Solo validation during training: the senior alone on held-out problems, ``val/pass@k`` and friends.

With several processes each samples its share of the batches (the batches and their seeds are those of
one process, so the metrics do not depend on the number of processes) and the chains are combined.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from tandem_rlvr.evaluation.evaluate import EvalSettings, eval_sampling, open_scorer, solo_eval, solo_metrics_from_chains

log = logging.getLogger(__name__)

_CACHE: dict = {}


def val_examples(cfg) -> list:
    """The validation problems of ``cfg.val`` (read once per process, or handed on by :func:`use_val_examples`)."""
    from tandem_rlvr.data import val_examples as load_val

    key = _val_key(cfg)
    if key not in _CACHE:
        _CACHE[key] = load_val(cfg, limit=cfg.val.limit or None)  # data's columns and prompt format, as training
    return _CACHE[key]


def use_val_examples(cfg, examples: list) -> None:
    """Validation of ``cfg`` reads ``examples``, ``data.val_examples(cfg, limit=cfg.val.limit or None)`` loaded by
    the checks before the run (:class:`tandem_rlvr.preflight.RunPlan`), instead of loading them again."""
    _CACHE[_val_key(cfg)] = examples


def _val_key(cfg) -> tuple:
    from tandem_rlvr.data import prompt_format

    d, v = cfg.data, cfg.val
    return (v.data, v.split, v.subset, v.limit, d.problem_key, d.answer_key, d.prompt_key, repr(prompt_format(cfg)))


def validate(senior, tokenizer, cfg, step: int, reward_fn: Callable | None = None, engine=None,
             shard: tuple[int, int] = (0, 1), gather: Callable[[list], list] | None = None) -> dict:
    """``val/pass@k`` and friends of the senior alone on ``cfg.val``'s problems, decoded with ``val.temperature``,
    ``val.top_p`` and ``val.top_k`` (by default the evaluation's decoding).

    The seed is ``train.seed`` at every step, so successive checkpoints are compared on the same random
    numbers (lower-variance checkpoint selection). A user reward ``package.module:function`` (or
    ``reward_fn``) is scored in-process, as in training; the built-in ones in time-limited workers.
    ``engine``: the run's rollout engine when it decodes from its own copy of the senior (vLLM), else
    None (in-process). ``shard`` = ``(rank, processes)`` with ``gather`` (every process's list of chains,
    concatenated): each process samples its share, the metrics cover all.
    """
    from tandem_rlvr.context import model_context
    from tandem_rlvr.rewards import import_reward

    examples = val_examples(cfg)
    v = cfg.val
    sampling = eval_sampling(v.max_new_tokens or cfg.rollout.max_new_tokens, v.temperature, v.top_p, v.top_k)
    was_training = bool(getattr(senior, "training", False))
    senior.eval()
    reward_fn = reward_fn or import_reward(cfg.data.reward)  # a user's function runs in-process, as in training
    # the senior never runs past what it reads (tandem_rlvr.context): longer prompts are skipped, budgets cut there
    limit = model_context("senior", cfg.model.senior, getattr(senior, "config", None), tokenizer, cfg.model.max_context).limit
    settings = EvalSettings(n=cfg.val.n, sampling=sampling, seed=cfg.train.seed, batch_size=cfg.rollout.batch_size or 64,
                            context=limit, max_prompt_tokens=cfg.rollout.max_prompt_tokens, progress=False)
    try:
        if reward_fn is not None:
            m, chains = solo_eval(senior, tokenizer, examples, settings, reward_fn=reward_fn, engine=engine, shard=shard)
        else:
            with open_scorer(cfg.data.reward, cfg.data.reward_timeout_s, cfg.data.reward_workers) as scorer:
                m, chains = solo_eval(senior, tokenizer, examples, settings, scorer=scorer, engine=engine, shard=shard)
    finally:
        if was_training:
            senior.train()
    if shard[1] > 1:
        m = solo_metrics_from_chains(gather(chains), cfg.val.n, m["n_problems"])
    out = {f"val/{k[len('solo_'):]}": v for k, v in m.items() if k.startswith("solo_")}
    out["val/n_problems"] = m["n_problems"]
    log.info("validation at step %d: pass@1 = %.4f on %d problems", step, out["val/pass@1"], m["n_problems"])
    return out
