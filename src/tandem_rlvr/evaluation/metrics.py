"""Pure evaluation arithmetic: unbiased pass@k, per-chain token averages, position deciles, KL.

Nothing here knows about models, tokenizers or files. Shape suffixes as elsewhere: ``_B`` chains,
``_T`` response tokens, ``_N`` flattened tokens, ``_V`` vocabulary.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

import torch

DEFAULT_KS = (1, 2, 4, 8)
N_DECILES = 10

__all__ = [
    "DEFAULT_KS",
    "N_DECILES",
    "chain_means",
    "decile_index",
    "kl_full",
    "macro_average",
    "mean_pass_at_k",
    "nanmean",
    "pass_at_k",
    "pass_at_ks",
    "per_chain_deciles",
    "std_error",
    "token_scores",
]


# ---------------------------------------------------------------------------------------------------
# pass@k
# ---------------------------------------------------------------------------------------------------


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k of one problem with ``c`` correct out of ``n`` samples (Chen et al. 2021).

    ``1 - C(n - c, k) / C(n, k)``, computed as ``1 - prod_{i = n-c+1}^{n} (1 - k / i)`` so that large
    ``n`` neither overflows nor loses precision. ``k > n`` has no unbiased estimate and is rejected.
    """
    n, c, k = int(n), int(c), int(k)
    if n < 1 or k < 1:
        raise ValueError(f"pass@k needs n >= 1 and k >= 1, got n={n}, k={k}")
    if k > n:
        raise ValueError(f"pass@{k} is undefined with only n={n} samples per problem (need k <= n)")
    if not 0 <= c <= n:
        raise ValueError(f"correct count c={c} must be in [0, n={n}]")
    if n - c < k:
        return 1.0
    prod = 1.0
    for i in range(n - c + 1, n + 1):
        prod *= 1.0 - k / i
    return 1.0 - prod


def _correct_counts(rewards_per_problem: Sequence[Sequence[float]], threshold: float) -> list[tuple[int, int]]:
    out = []
    for i, rs in enumerate(rewards_per_problem):
        if len(rs) == 0:
            raise ValueError(f"problem {i} has no samples")
        out.append((len(rs), sum(1 for r in rs if float(r) >= threshold)))
    return out


def mean_pass_at_k(rewards_per_problem: Sequence[Sequence[float]], k: int, threshold: float = 0.5) -> float:
    """Mean over problems of the unbiased pass@k; a sample counts as correct when reward >= threshold."""
    counts = _correct_counts(rewards_per_problem, threshold)
    if not counts:
        raise ValueError("pass@k of an empty problem list")
    return sum(pass_at_k(n, c, k) for n, c in counts) / len(counts)


def pass1_per_problem(rewards_per_problem: Sequence[Sequence[float]], threshold: float = 0.5) -> list[float]:
    """Each problem's share of correct samples (reward >= ``threshold``): its pass@1, the one the mean pass@1,
    its standard error and the communication tax are made of (also for rewards that are not 0 or 1)."""
    return [c / n for n, c in _correct_counts(rewards_per_problem, threshold)]


def pass_at_ks(
    rewards_per_problem: Sequence[Sequence[float]], ks: Sequence[int] = DEFAULT_KS, threshold: float = 0.5
) -> dict[int, float]:
    """``{k: mean pass@k}`` for every ``k`` in ``ks`` that is <= the smallest per-problem sample count."""
    n_min = min(len(rs) for rs in rewards_per_problem)
    return {int(k): mean_pass_at_k(rewards_per_problem, k, threshold) for k in ks if k <= n_min}


def std_error(values: Sequence[float]) -> float:
    """Standard error of the mean (Bessel-corrected); 0 for fewer than two values."""
    m = len(values)
    if m < 2:
        return 0.0
    mu = sum(values) / m
    var = sum((v - mu) ** 2 for v in values) / (m - 1)
    return math.sqrt(var / m)


# ---------------------------------------------------------------------------------------------------
# Token-level scores and their aggregation
# ---------------------------------------------------------------------------------------------------


def token_scores(junior_logits_NV: torch.Tensor, target_N: torch.Tensor,
                 senior_logits_NV: torch.Tensor | None = None) -> dict[str, torch.Tensor]:
    """Per-token scores of ``N`` positions at temperature 1, in float32.

    Always: ``ce`` (junior's cross-entropy of the target, nats) and ``top1`` (1.0 where the junior's
    argmax is the target). With the senior's logits also: ``kl_mc`` (``log p_s - log p_j`` of the
    target) and ``kl_exact`` (full-vocabulary ``KL(p_s || p_j)``).
    """
    lj = torch.log_softmax(junior_logits_NV.float(), dim=-1)
    tgt = target_N.long().unsqueeze(-1)
    lj_t = lj.gather(-1, tgt).squeeze(-1)
    out = {"ce": -lj_t, "top1": (lj.argmax(-1) == target_N).float()}
    if senior_logits_NV is not None:
        ls = torch.log_softmax(senior_logits_NV.float(), dim=-1)
        out["kl_mc"] = ls.gather(-1, tgt).squeeze(-1) - lj_t
        out["kl_exact"] = kl_full(ls, lj, log_probs=True)
    return out


def kl_full(p_logits: torch.Tensor, q_logits: torch.Tensor, *, log_probs: bool = False) -> torch.Tensor:
    """Exact ``KL(p || q) = sum_v p_v (log p_v - log q_v)`` over the last axis.

    Inputs are logits (or log-probabilities with ``log_probs=True``); zero-probability entries of ``p``
    contribute exactly 0 (no ``0 * inf`` NaN).
    """
    lp = p_logits.float() if log_probs else torch.log_softmax(p_logits.float(), -1)
    lq = q_logits.float() if log_probs else torch.log_softmax(q_logits.float(), -1)
    p = lp.exp()
    terms = torch.where(p > 0, p * (lp - lq), torch.zeros_like(p))
    return terms.sum(-1)


def chain_means(values_N: torch.Tensor, chain_N: torch.Tensor, n_chains: int) -> torch.Tensor:
    """Mean of each chain's token values (``chain_N`` gives each token's chain); NaN for empty chains."""
    sums = torch.zeros(n_chains, dtype=torch.float64).index_add_(0, chain_N, values_N.double())
    counts = torch.zeros(n_chains, dtype=torch.float64).index_add_(0, chain_N, torch.ones_like(values_N, dtype=torch.float64))
    return torch.where(counts > 0, sums / counts.clamp(min=1), torch.full_like(sums, float("nan")))


def decile_index(pos_N: torch.Tensor, length_N: torch.Tensor, n_bins: int = N_DECILES) -> torch.Tensor:
    """Relative-position bin of each token: ``floor(n_bins * t / len)`` for ``t`` in ``[0, len)``."""
    return torch.div(pos_N.long() * n_bins, length_N.long().clamp(min=1), rounding_mode="floor").clamp(0, n_bins - 1)


def per_chain_deciles(values_N: torch.Tensor, chain_N: torch.Tensor, pos_N: torch.Tensor,
                      length_N: torch.Tensor, n_chains: int, n_bins: int = N_DECILES) -> torch.Tensor:
    """``(n_chains, n_bins)`` mean value per chain and relative-position bin (NaN where a bin is empty).

    A chain shorter than ``n_bins`` tokens leaves some of its bins empty.
    """
    flat = chain_N.long() * n_bins + decile_index(pos_N, length_N, n_bins)
    return chain_means(values_N, flat, n_chains * n_bins).view(n_chains, n_bins)


def nanmean(values) -> float:
    """Mean of the finite entries (NaN when there is none)."""
    vals = [float(v) for v in values if v is not None and math.isfinite(float(v))]
    return sum(vals) / len(vals) if vals else float("nan")


# ---------------------------------------------------------------------------------------------------
# Macro averages over benchmarks
# ---------------------------------------------------------------------------------------------------

COUNT_KEYS = ("n_problems", "n_chains", "n_skipped", "n_skipped_at_load", "handoff_stops",
              "handoff_context_truncations", "junior_bpb_empty_chains", "junior_bpb_truncated_chains",
              "junior_bpb_unscored_tokens", "reward_stats")  # reward_stats: the verifier's checks, timeouts, errors


def macro_average(per_benchmark: Mapping[str, Mapping]) -> dict:
    """Unweighted mean over benchmarks of every metric (each benchmark counts once).

    Scalars are averaged (NaN-skipping), ``{key: value}`` maps key-wise (e.g. the handoff-rate curve),
    lists element-wise (e.g. CE by position decile), standard errors (``*_se``) as the s.e. of the
    mean of independent means, ``sqrt(sum se^2) / m``; the counts in :data:`COUNT_KEYS` are summed and
    ``n_samples`` (samples per problem) is kept when all benchmarks agree.
    """
    rows = list(per_benchmark.values())
    if not rows:
        return {}
    out: dict = {"n_benchmarks": len(rows)}
    keys = [k for k in rows[0] if all(k in r for r in rows)]
    for key in keys:
        vals = [r[key] for r in rows]
        # a number with no data is NaN, or None once read back from a part (JSON has no NaN): typed by the others
        first = next((v for v in vals if v is not None), None)
        if first is None:
            out[key] = None
        elif key in COUNT_KEYS and isinstance(vals[0], Mapping):  # counts by reason (and seconds)
            out[key] = {s: _total(v.get(s, 0) for v in vals) for s in dict.fromkeys(s for v in vals for s in v)}
        elif key in COUNT_KEYS:
            out[key] = _total(vals)
        elif key == "n_samples":
            out[key] = vals[0] if all(v == vals[0] for v in vals) else None
        elif isinstance(vals[0], str):  # a marker such as "n/a (different tokenizers)": kept when all agree
            if all(v == vals[0] for v in vals):
                out[key] = vals[0]
        elif isinstance(vals[0], Mapping):
            subkeys = [s for s in vals[0] if all(s in v for v in vals)]
            out[key] = {s: nanmean(v[s] for v in vals) for s in subkeys}
        elif isinstance(vals[0], (list, tuple)):
            out[key] = [nanmean(col) for col in zip(*vals)]
        elif key.endswith("_se") and isinstance(first, (int, float)):
            out[key] = math.sqrt(sum(float("nan" if v is None else v) ** 2 for v in vals)) / len(vals)  # of a mean of means
        elif isinstance(first, (int, float)) and not isinstance(first, bool):
            out[key] = nanmean(vals)
    return out


def _total(values) -> int | float:
    """The sum of counts (an int) or of seconds (a float, where any value is one that is not whole)."""
    vals = [float(v) for v in values]
    total = sum(vals)
    return int(total) if all(v.is_integer() for v in vals) else total
