"""Pure RL math for (Tandem) GRPO: stateless tensor functions, in the spirit of verl's ``core_algos``.

Nothing here knows about models, trainers or configs. Shape suffixes: ``_B`` batch (rollouts), ``_T``
response tokens, ``_V`` vocabulary. Every ``mask_BT`` is the *loss* mask: 1 where a token is trained
on. In the tandem arm the caller passes ``response_mask * senior_owner``, so junior tokens (which still
condition the senior through attention) get exactly zero gradient. A loss mask that is missing, badly
shaped, non-binary or all-zero is an error, never a silent fall-back.

Conventions matched to TRL 1.16 ``GRPOTrainer`` (checked by ``tests/training/test_trl_parity.py``):

* group std is the *unbiased* (Bessel, ``n - 1``) std, as TRL's ``nanstd``; TRL's advantage epsilon is
  ``1e-4`` (hard-coded), ours defaults to ``1e-6`` and is an argument;
* ``grpo`` aggregation divides each sequence by ``mask.sum(-1).clamp(min=1)`` and then averages over
  *all* B sequences (a sequence with no trainable token contributes 0 but still counts in B);
* ``dapo`` divides the masked token sum by a caller-given (global) token count; TRL's normaliser is
  ``num_items_in_batch / num_processes * grad_accum / steps_per_generation``, pass that as ``num_tokens``;
* ``dr_grpo`` divides by ``B * max_len`` (TRL: ``max_completion_length``);
* the KL term is k3 with ``q - p = ref - policy``, added per token *after* clipping, before aggregation;
  ``kl_clamp=10`` clamps it as verl's ``low_var_kl`` does (the paper's authors ran verl; TRL does not clamp,
  and the two agree below the clamp);
  TRL's default ``use_bias_correction_kl=True`` (KL times the ratio) is available as ``kl_is_correction``;
* ``clip_frac`` counts TRL's "region" clipping: ``(ratio < 1-eps and A < 0) or (ratio > 1+eps_high and A > 0)``.
"""

from __future__ import annotations

import torch

from tandem_rlvr.engines.types import token_logps  # the chosen tokens' log-probs: shared with the engines
from tandem_rlvr.names import LOSS_TYPES, TOKEN_MEAN_LOSSES

Tensor = torch.Tensor

__all__ = [
    "FORWARD_LOGITS",
    "LOSS_TYPES",
    "forward_rows",
    "aggregate",
    "group_advantages",
    "k3_kl",
    "masked_mean",
    "merge_metrics",
    "merged_mean",
    "chunk_weight",
    "process_scale",
    "policy_loss",
    "token_logps",
]


def _check_mask(mask_BT: Tensor | None, like_BT: Tensor, name: str = "mask_BT") -> Tensor:
    """Validate a loss mask against ``like_BT`` and return it as a bool tensor."""
    if mask_BT is None:
        raise ValueError(f"{name} is required (a missing loss/ownership mask is an error, not 'all tokens')")
    if like_BT.dim() != 2:
        raise ValueError(f"expected a (B, T) tensor, got shape {tuple(like_BT.shape)}")
    if mask_BT.shape != like_BT.shape:
        raise ValueError(f"{name} has shape {tuple(mask_BT.shape)}, expected {tuple(like_BT.shape)}")
    if mask_BT.dtype != torch.bool:
        if not bool(((mask_BT == 0) | (mask_BT == 1)).all()):
            raise ValueError(f"{name} must be binary (0/1 or bool)")
        mask_BT = mask_BT != 0
    if not bool(mask_BT.any()):
        raise ValueError(
            f"{name} is all zero: no trainable token in this batch (e.g. the senior owns no token); "
            "refusing to return a silent zero loss"
        )
    return mask_BT


def _check_same_shape(x: Tensor | None, like: Tensor, name: str) -> None:
    if x is not None and x.shape != like.shape:
        raise ValueError(f"{name} has shape {tuple(x.shape)}, expected {tuple(like.shape)}")


def masked_mean(x_BT: Tensor, mask_BT: Tensor) -> Tensor:
    """Mean of ``x`` over the masked positions: ``sum(x * m) / sum(m)`` (mask must be non-empty)."""
    mask_b = _check_mask(mask_BT, x_BT)
    return torch.where(mask_b, x_BT, 0.0).sum() / mask_b.sum().to(x_BT.dtype)


def group_advantages(
    rewards_B: Tensor, group_size: int, *, normalize_std: bool = True, eps: float = 1e-6
) -> tuple[Tensor, dict[str, float]]:
    """GRPO advantages over contiguous groups of ``group_size`` rollouts (rollouts of one prompt adjacent).

    ``A_i = (r_i - mean_g) / (std_g + eps)`` with ``std_g`` the *unbiased* group std
    ``sqrt(sum_j (r_j - mean_g)^2 / (G - 1))`` (TRL 1.16 ``nanstd``), or ``A_i = r_i - mean_g`` when
    ``normalize_std=False`` (Dr. GRPO). A group with all-equal rewards gets ``A = 0`` exactly.

    Metrics: ``train/frac_zero_std_groups`` (groups whose std is ~0, ``torch.isclose`` as TRL),
    ``reward/mean`` and ``reward/std`` (unbiased std over the whole batch).
    """
    if rewards_B.dim() != 1:
        raise ValueError(f"rewards_B must be 1-D (B,), got shape {tuple(rewards_B.shape)}")
    if group_size < 2:
        raise ValueError(f"group_size must be >= 2 (a group of one has no baseline), got {group_size}")
    num = rewards_B.numel()
    if num == 0 or num % group_size != 0:
        raise ValueError(f"batch size {num} is not a positive multiple of group_size {group_size}")
    rewards = rewards_B.detach().float() if not rewards_B.is_floating_point() else rewards_B.detach()
    if not bool(torch.isfinite(rewards).all()):
        raise ValueError("rewards_B contains NaN or inf")
    groups_GN = rewards.view(-1, group_size)
    mean_G = groups_GN.mean(dim=1, keepdim=True)
    std_G = groups_GN.std(dim=1, keepdim=True)  # unbiased (correction=1)
    centered_GN = groups_GN - mean_G
    adv_GN = centered_GN / (std_G + eps) if normalize_std else centered_GN
    zero_std = torch.isclose(std_G, torch.zeros_like(std_G))
    stats = torch.stack([zero_std.float().mean(), rewards.mean(), rewards.std()]).tolist()
    metrics = {"train/frac_zero_std_groups": stats[0], "reward/mean": stats[1], "reward/std": stats[2]}
    return adv_GN.reshape(-1), metrics


K3_LOG_RATIO_CLAMP = 20.0  # verl's kl_penalty("low_var_kl") clamps q - p to +-20 before exp (and k3 to +-10)


def k3_kl(logps_BT: Tensor, ref_logps_BT: Tensor, clamp: float | None = None) -> Tensor:
    """Per-token k3 estimator of KL(policy || ref): ``exp(q - p) - (q - p) - 1`` (p policy, q reference).

    Non-negative, zero iff ``p == q``; its gradient w.r.t. ``p`` is ``1 - exp(q - p)``. With ``clamp``
    (verl's ``low_var_kl`` uses 10), ``q - p`` is first clamped to [-20, 20] (no ``exp`` overflow, so no
    ``0 * inf`` NaN in the backward) and the value to [-clamp, clamp]: a token held by the clamp gets no
    gradient (for 10: a log-ratio past ~ +2.53 or ~ -11).
    """
    _check_same_shape(ref_logps_BT, logps_BT, "ref_logps_BT")
    diff = ref_logps_BT - logps_BT
    if not clamp:
        return torch.exp(diff) - diff - 1.0
    diff = torch.clamp(diff, min=-K3_LOG_RATIO_CLAMP, max=K3_LOG_RATIO_CLAMP)
    return torch.clamp(torch.exp(diff) - diff - 1.0, min=-clamp, max=clamp)


def aggregate(
    values_BT: Tensor,
    mask_BT: Tensor,
    loss_type: str,
    *,
    num_tokens: int | float | Tensor | None = None,
    max_len: int | None = None,
) -> Tensor:
    """Reduce per-token values to a scalar over the masked tokens (``s_b = sum_t m_bt * v_bt``).

    * ``grpo``: ``mean_b( s_b / max(sum_t m_bt, 1) )`` -- mean over all B sequences (TRL 1.16);
    * ``dapo`` / ``token_mean``: ``sum_b s_b / num_tokens``; ``num_tokens`` defaults to ``sum(m)`` and
      may be a global count (summed over processes / mini-batches) so that micro-batches add up;
    * ``dr_grpo``: ``sum_b s_b / (B * max_len)``, ``max_len`` defaulting to T.

    ``num_tokens`` is only read by the token-mean losses and ``max_len`` only by ``dr_grpo``.
    """
    if loss_type not in LOSS_TYPES:
        raise ValueError(f"unknown loss_type {loss_type!r}; valid: {', '.join(LOSS_TYPES)}")
    mask_b = _check_mask(mask_BT, values_BT)
    masked_BT = torch.where(mask_b, values_BT, 0.0)
    if loss_type == "grpo":
        count_B = mask_b.sum(dim=-1).clamp(min=1).to(values_BT.dtype)
        return (masked_BT.sum(dim=-1) / count_B).mean()
    if loss_type == "dr_grpo":
        max_len = values_BT.shape[1] if max_len is None else max_len
        if max_len <= 0:
            raise ValueError(f"max_len must be positive, got {max_len}")
        return masked_BT.sum() / (values_BT.shape[0] * max_len)
    if num_tokens is None:
        num_tokens = mask_b.sum().to(values_BT.dtype)
    elif float(num_tokens) <= 0:
        raise ValueError(f"num_tokens must be positive, got {float(num_tokens)}")
    return masked_BT.sum() / num_tokens


FORWARD_LOGITS = 1 << 28  # max elements of one teacher-forced forward's (rows, T + 1, V) logits: 1 GiB in float32


def forward_rows(micro_batch: int, width: int, vocab: int, budget: int | None = None) -> int:
    """Rows per teacher-forced forward (the update's chunks, the old and junior log-prob passes): ``micro_batch``
    (``algo.micro_batch``; 0 = all of them), at most as many as keep one forward's logits over ``width`` response
    positions and a ``vocab``-row output layer within ``budget`` elements (at least 1). A function of the config
    only (``width`` = ``rollout.max_new_tokens``), so every process cuts the same number of chunks. At Qwen3's
    151,936 rows and 3,000 tokens that is one row a forward; in the CPU demo (495 rows, 112 tokens) 4,799."""
    cap = max(1, (FORWARD_LOGITS if budget is None else budget) // max(1, (width + 1) * vocab))
    return min(micro_batch, cap) if micro_batch else cap


def chunk_weight(loss_type: str, chunk_rows: int, rows: int, num_processes: int = 1) -> tuple[float, float]:
    """How one micro-batch chunk's loss enters a mini-batch update: ``(backward factor, share)``.

    A mini-batch of ``rows`` rows is split into chunks whose gradients add up, and DDP / FSDP average
    gradients over ``num_processes``. Token-mean losses already divide by the global token count, so a
    chunk's loss is its share as is (``share`` 1) and the backward factor undoes the process average;
    per-sequence means (``grpo``, ``dr_grpo``) are weighted by the chunk's share of rows.
    """
    if loss_type not in LOSS_TYPES:
        raise ValueError(f"unknown loss_type {loss_type!r}; valid: {', '.join(LOSS_TYPES)}")
    if loss_type in TOKEN_MEAN_LOSSES:
        return float(num_processes), 1.0
    share = chunk_rows / rows
    return share, share


TOKEN_MEAN_METRICS = frozenset({"train/clip_frac", "train/clip_frac_low", "train/clip_frac_high", "train/ratio_mean",
                                "kl/policy_ref"})  # the token means among policy_loss's metrics


def merge_metrics(parts: list[dict[str, float]], summed: frozenset[str] | set[str] = frozenset()) -> dict[str, float]:
    """The metrics of several :func:`policy_loss` calls (an update's chunks, or its mini-batches) as one: the
    keys in ``summed`` added up (0 for a part without them); the token means (:data:`TOKEN_MEAN_METRICS`)
    weighted by each part's ``train/num_tokens``, so that they stay means over all the parts' tokens whatever
    the chunks' sizes; any other key averaged over the parts that have it."""
    out = {}
    for key in set().union(*parts) | set(summed):
        if key in summed:
            out[key] = float(sum(p.get(key, 0.0) for p in parts))
        else:
            out[key] = merged_mean([p for p in parts if key in p], key)
    return out


def merged_mean(parts: list[dict], key: str) -> float:
    """``key``'s mean over ``parts`` (each holding it): a token mean (:data:`TOKEN_MEAN_METRICS`) weighted by each
    part's ``train/num_tokens`` where they have tokens, any other key (or parts without tokens) plainly."""
    vals = [(float(p[key]), float(p.get("train/num_tokens") or 0.0)) for p in parts]
    total = sum(w for _, w in vals)
    if key in TOKEN_MEAN_METRICS and total > 0:
        return sum(v * w for v, w in vals) / total
    return sum(v for v, _ in vals) / len(vals)


def rows_with_gradient(adv_B: Tensor, rows: Tensor, kl_beta: float = 0.0) -> Tensor:
    """The ``rows`` of a mini-batch whose :func:`policy_loss` can have a gradient. With no KL term (``kl_beta``
    0) a row whose advantage is exactly 0 has the per-token loss ``-min(r * 0, clip(r) * 0) = 0`` whatever its
    ratio, so its gradient is exactly zero (for a finite ratio), and leaving it out of the forward changes
    nothing as long as the aggregation still counts it: the token-mean losses' global token count and the
    per-sequence losses' row count (:func:`chunk_weight` of the whole mini-batch). With a KL term every row;
    when no row would be left, all of them (the caller's mini-batch runs as it would without this)."""
    if kl_beta > 0:
        return rows
    keep = rows[adv_B[rows] != 0]
    return keep if len(keep) else rows


def process_scale(loss_type: str, num_processes: int) -> int:
    """Factor from one process's summed chunk losses to the global loss: token-mean shares add up over
    processes (``num_processes``), per-sequence means average (1)."""
    return num_processes if loss_type in TOKEN_MEAN_LOSSES else 1


def _check_policy_args(
    logps_BT: Tensor,
    old_logps_BT: Tensor,
    adv_B: Tensor,
    ref_logps_BT: Tensor | None,
    clip_eps: float,
    clip_eps_high: float | None,
    kl_beta: float,
) -> float:
    """Validate ``policy_loss`` arguments; return the effective upper clip epsilon."""
    _check_same_shape(old_logps_BT, logps_BT, "old_logps_BT")
    _check_same_shape(ref_logps_BT, logps_BT, "ref_logps_BT")
    if adv_B.shape != logps_BT.shape[:1]:
        raise ValueError(f"adv_B has shape {tuple(adv_B.shape)}, expected ({logps_BT.shape[0]},)")
    eps_high = clip_eps if clip_eps_high is None else clip_eps_high
    if not 0.0 <= clip_eps < 1.0 or eps_high < 0.0:
        raise ValueError(f"need 0 <= clip_eps < 1 and clip_eps_high >= 0, got {clip_eps}, {eps_high}")
    if kl_beta < 0:
        raise ValueError(f"kl_beta must be >= 0, got {kl_beta}")
    if kl_beta > 0 and ref_logps_BT is None:
        raise ValueError("kl_beta > 0 needs ref_logps_BT (reference log-probs of the sampled tokens)")
    return eps_high


def policy_loss(
    logps_BT: Tensor,
    old_logps_BT: Tensor,
    adv_B: Tensor,
    mask_BT: Tensor,
    *,
    loss_type: str = "grpo",
    clip_eps: float = 0.2,
    clip_eps_high: float | None = None,
    kl_beta: float = 0.0,
    ref_logps_BT: Tensor | None = None,
    num_tokens: int | float | Tensor | None = None,
    max_len: int | None = None,
    kl_is_correction: bool = False,
    kl_clamp: float | None = None,
    allow_empty: bool = False,
) -> tuple[Tensor, dict[str, float]]:
    """PPO clipped surrogate (+ optional k3 KL), aggregated over the masked tokens by ``loss_type``.

    With ``r = exp(p - p_old)`` and ``eps_h = clip_eps_high or clip_eps``, per token:
    ``l = -min(r * A, clip(r, 1 - clip_eps, 1 + eps_h) * A) + kl_beta * k3(p, p_ref)``,
    then ``loss = aggregate(l, mask_BT, loss_type)``. ``kl_is_correction=True`` weights the KL term by the
    (differentiable, unclipped) ratio ``r * k3`` (DeepSeek-V3.2; TRL 1.16's ``use_bias_correction_kl``,
    which TRL turns on by default); the default is the plain ``beta * k3`` of the method. ``kl_clamp``
    clamps k3 per token (:func:`k3_kl`; verl's ``low_var_kl``: 10).
    ``old_logps_BT``, ``ref_logps_BT`` and ``adv_B`` are treated as constants (detached). Positions outside
    the mask are excluded *before* any exp, so they get exactly zero gradient and cannot overflow, whatever
    values they hold.

    Metrics (python floats): ``train/loss``, ``train/pg_loss`` (surrogate alone, same aggregation),
    ``train/clip_frac`` (+ ``_low`` / ``_high``), ``train/ratio_mean``, ``train/num_tokens`` and, when a
    reference is given, ``kl/policy_ref`` (token mean of the plain k3 over the mask, never ratio-weighted).

    An all-zero mask raises, unless ``allow_empty``: then the loss is an exact, graph-connected zero
    (for a process whose micro-batch has no senior token while others do; the caller has checked that
    the step as a whole trains some token) and the metrics are empty.
    """
    if allow_empty and mask_BT is not None and mask_BT.shape == logps_BT.shape and not bool(mask_BT.bool().any()):
        return (logps_BT * 0.0).sum(), {}
    mask_b = _check_mask(mask_BT, logps_BT)
    eps_high = _check_policy_args(logps_BT, old_logps_BT, adv_B, ref_logps_BT, clip_eps, clip_eps_high, kl_beta)
    log_ratio_BT = torch.where(mask_b, logps_BT - old_logps_BT.detach(), 0.0)
    ratio_BT = torch.exp(log_ratio_BT)
    adv_B1 = adv_B.detach().to(device=logps_BT.device, dtype=logps_BT.dtype).unsqueeze(-1)  # e.g. CPU rewards
    unclipped_BT = ratio_BT * adv_B1
    clipped_BT = torch.clamp(ratio_BT, 1.0 - clip_eps, 1.0 + eps_high) * adv_B1
    pg_BT = -torch.minimum(unclipped_BT, clipped_BT)
    per_token_BT, kl_BT = pg_BT, None
    if ref_logps_BT is not None:
        ref_BT = ref_logps_BT.detach()
        kl_BT = k3_kl(torch.where(mask_b, logps_BT, ref_BT), ref_BT, kl_clamp)
        if kl_beta > 0:
            per_token_BT = pg_BT + kl_beta * (ratio_BT * kl_BT if kl_is_correction else kl_BT)
    agg = dict(loss_type=loss_type, num_tokens=num_tokens, max_len=max_len)
    loss = aggregate(per_token_BT, mask_b, **agg)
    pg_loss = loss if per_token_BT is pg_BT else None
    return loss, _loss_metrics(loss, pg_loss, pg_BT, ratio_BT, adv_B1, kl_BT, mask_b, agg, clip_eps, eps_high)


@torch.no_grad()
def _loss_metrics(loss, pg_loss, pg_BT, ratio_BT, adv_B1, kl_BT, mask_b, agg, clip_eps, eps_high) -> dict[str, float]:
    """The metrics of :func:`policy_loss` as python floats (one device sync)."""
    n_tokens = mask_b.sum().to(torch.float32)

    def token_mean(x_BT: Tensor) -> Tensor:
        return torch.where(mask_b, x_BT.float(), 0.0).sum() / n_tokens

    low_BT = (ratio_BT < 1.0 - clip_eps) & (adv_B1 < 0)
    high_BT = (ratio_BT > 1.0 + eps_high) & (adv_B1 > 0)
    stats = {
        "train/loss": loss,
        "train/pg_loss": pg_loss if pg_loss is not None else aggregate(pg_BT, mask_b, **agg),
        "train/clip_frac": token_mean(low_BT | high_BT),
        "train/clip_frac_low": token_mean(low_BT),
        "train/clip_frac_high": token_mean(high_BT),
        "train/ratio_mean": token_mean(ratio_BT),
        "train/num_tokens": n_tokens,
    }
    if kl_BT is not None:
        stats["kl/policy_ref"] = token_mean(kl_BT)
    values = torch.stack([v.detach().float().reshape(()) for v in stats.values()]).tolist()
    return dict(zip(stats.keys(), values))
