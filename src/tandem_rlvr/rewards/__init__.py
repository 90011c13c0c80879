"""Verifiable math rewards with a hard per-check time limit.

A reward takes the last ``\\boxed{...}`` (also ``\\fbox{...}``, ``\\boxed x``) of a completion and
checks it against the gold answer: ``math`` with math-verify (``verify(gold, pred)``, gold first),
``gsm8k`` likewise with the gold after ``####``, ``boxed_exact`` by string equality without
whitespace. Scores are 1.0 or 0.0; checks never raise and never hang (a checker whose workers cannot start
at all raises :class:`~tandem_rlvr.errors.VerifierUnavailable` instead of scoring everything 0).

* :mod:`tandem_rlvr.rewards.extract` — answer extraction and the parent-side pre-check (no box, too
  long, bad gold, ``boxed_exact``), decided without a worker.
* :mod:`tandem_rlvr.rewards.scorer` — :class:`RewardScorer`, the pool of verifier processes and its
  hard time limit (default 2 s per check).
* :mod:`tandem_rlvr.rewards.workers` — the verifier processes themselves.
* :mod:`tandem_rlvr.rewards.registry` — the reward functions by name on one shared process-wide
  scorer, :func:`score_batch`, :func:`reward_totals`, and user rewards by import path.
"""

from tandem_rlvr.rewards.extract import extract_boxed, gsm8k_gold
from tandem_rlvr.rewards.registry import (
    REWARD_FNS,
    boxed_exact_reward,
    get_reward_fn,
    gsm8k_reward,
    import_reward,
    math_reward,
    reward_totals,
    score_batch,
)
from tandem_rlvr.rewards.scorer import DEFAULT_TIME_LIMIT, RewardScorer

__all__ = [
    "DEFAULT_TIME_LIMIT", "REWARD_FNS", "RewardScorer", "boxed_exact_reward", "extract_boxed",
    "get_reward_fn", "gsm8k_gold", "gsm8k_reward", "import_reward", "math_reward", "reward_totals", "score_batch",
]
