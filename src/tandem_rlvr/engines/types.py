"""What every engine shares: the decoding settings (:class:`Sampling`), the co-written batch with its
ownership records (:class:`Rollout`), sampling one token per row, the log-prob of a token at a
temperature, and building or stacking Rollouts from per-row lists (engines that write whole turns)."""

from __future__ import annotations

from dataclasses import dataclass

import torch

__all__ = ["Rollout", "Sampling", "concat_rollouts", "decision_record", "logp_of", "rollout_from_rows", "sample_tokens",
           "token_logps"]


@dataclass(frozen=True)
class Sampling:
    """Decoding settings shared by both authors. ``temperature`` 0 means greedy."""

    max_new_tokens: int = 256
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0

    def __post_init__(self) -> None:
        if self.max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be >= 1, got {self.max_new_tokens}")
        if self.temperature < 0 or not 0 < self.top_p <= 1 or self.top_k < 0:
            raise ValueError(f"bad sampling settings: {self}")


@dataclass
class Rollout:
    """A batch of co-written responses. Response tensors are right-padded with the pad id.

    ``response_mask_BT`` is 1 on generated tokens (the EOS included); ``owner_BT`` is 1 where the
    senior wrote the token, 0 where the junior did (and 0 on padding: always combine with the
    response mask). Log-probs are of the emitted token at the sampling temperature;
    ``junior_logps_BT`` is None when the junior was not run.

    The schedule's own record of its decisions, which the trainer checks the ownership mask against
    (:mod:`tandem_rlvr.training.ownership`): ``turn_author_BT`` is -1 where a token continues its author's
    turn and the author the schedule chose (1 senior, 0 junior) where a decision came before it (the
    first token and every redraw); ``decisions_B`` / ``senior_decisions_B`` count a row's decisions
    that chose who writes a token (under a coin schedule each is a coin toss) and how many chose the
    senior. Engines that cannot record them leave them None.

    ``logps_recorded`` is True where the engine computed ``senior_logps_BT`` (and ``junior_logps_BT``, if
    any) with the models it sampled from, on every response token: the trainer may use them as the PPO
    ratio's old log-probs (``algo.old_logps``) instead of recomputing them.
    """

    prompt_ids_BP: torch.Tensor
    prompt_mask_BP: torch.Tensor
    response_ids_BT: torch.Tensor
    response_mask_BT: torch.Tensor
    owner_BT: torch.Tensor
    senior_logps_BT: torch.Tensor
    junior_logps_BT: torch.Tensor | None
    rounds_B: torch.Tensor
    finished_B: torch.Tensor
    schedule: str = "none"
    turn_author_BT: torch.Tensor | None = None
    decisions_B: torch.Tensor | None = None
    senior_decisions_B: torch.Tensor | None = None
    logps_recorded: bool = False

    @property
    def batch_size(self) -> int:
        return int(self.response_ids_BT.shape[0])

    def senior_token_frac(self) -> float:
        """Share of generated tokens that the senior wrote."""
        n = self.response_mask_BT.sum().clamp(min=1)
        return float((self.owner_BT * self.response_mask_BT).sum() / n)

    def texts(self, tokenizer) -> list[str]:
        """Decoded responses (special tokens dropped)."""
        ids = [row[m.bool()].tolist() for row, m in zip(self.response_ids_BT, self.response_mask_BT)]
        return tokenizer.batch_decode(ids, skip_special_tokens=True)

    def turns(self, tokenizer, i: int) -> list[dict]:
        """Row ``i`` as a list of turns ``{"owner": "senior"|"junior", "text": ...}`` in order."""
        n = int(self.response_mask_BT[i].sum())
        ids, own = self.response_ids_BT[i, :n].tolist(), self.owner_BT[i, :n].tolist()
        out: list[dict] = []
        start = 0
        for t in range(1, n + 1):
            if t == n or own[t] != own[start]:
                text = tokenizer.decode(ids[start:t], skip_special_tokens=True)
                out.append({"owner": "senior" if own[start] else "junior", "text": text, "tokens": t - start})
                start = t
        return out


def _filter_logits(logits_BV: torch.Tensor, top_k: int, top_p: float) -> torch.Tensor:
    """Top-k then top-p (nucleus) filtering, row by row: dropped logits become ``-inf``. With both set, the
    nucleus is taken over the top-k values (:func:`_top_k_nucleus`) instead of a sort of the whole vocabulary,
    and the rows it leaves undecided are sorted: the same result (up to the float order of one softmax's sum),
    or for a row holding NaN the same error where the tokens are drawn."""
    if top_k and top_k < logits_BV.shape[-1] and top_p < 1.0:
        out_BV, undecided_B = _top_k_nucleus(logits_BV, top_k, top_p)
        if bool(undecided_B.any()):
            out_BV[undecided_B] = _filter_full(logits_BV[undecided_B], top_k, top_p)
        return out_BV
    return _filter_full(logits_BV, top_k, top_p)


def _top_k_nucleus(logits_BV: torch.Tensor, top_k: int, top_p: float) -> tuple[torch.Tensor, torch.Tensor]:
    """``(filtered logits, undecided rows)``: the nucleus over each row's ``top_k`` largest logits (top-k drops
    every other one). A row is undecided (its output row is not to be used) where a tie could make this differ
    from the sort of :func:`_filter_full`: a logit outside the top k equal to the k-th (top-k keeps it too), or
    a nucleus edge that splits a run of equal logits (which of them are kept is the order of ties). A finished
    row whose logits are all equal is one."""
    vals_BK, idx_BK = torch.topk(logits_BV, top_k, dim=-1)  # sorted, descending
    probs_BK = vals_BK.softmax(-1)
    drop_BK = (probs_BK.cumsum(-1) - probs_BK) >= top_p  # keep the smallest prefix reaching top_p
    undecided_B = (logits_BV >= vals_BK[:, -1:]).sum(-1) > top_k
    undecided_B |= ((vals_BK[:, 1:] == vals_BK[:, :-1]) & (drop_BK[:, 1:] != drop_BK[:, :-1])).any(-1)
    out_BV = torch.full_like(logits_BV, float("-inf"))
    return out_BV.scatter_(-1, idx_BK, vals_BK.masked_fill(drop_BK, float("-inf"))), undecided_B


def _filter_full(logits_BV: torch.Tensor, top_k: int, top_p: float) -> torch.Tensor:
    if top_k and top_k < logits_BV.shape[-1]:
        kth = torch.topk(logits_BV, top_k, dim=-1).values[:, -1:]
        logits_BV = logits_BV.masked_fill(logits_BV < kth, float("-inf"))
    if top_p < 1.0:
        sorted_l, idx = torch.sort(logits_BV, descending=True, dim=-1)
        cum = sorted_l.softmax(-1).cumsum(-1)
        drop_sorted = (cum - sorted_l.softmax(-1)) >= top_p  # keep the smallest prefix reaching top_p
        drop = torch.zeros_like(drop_sorted).scatter(-1, idx, drop_sorted)
        logits_BV = logits_BV.masked_fill(drop, float("-inf"))
    return logits_BV


def sample_tokens(logits_BV: torch.Tensor, sampling: Sampling, gen: torch.Generator) -> torch.Tensor:
    """Sample one token per row (greedy when temperature is 0)."""
    if sampling.temperature == 0:
        return logits_BV.argmax(-1)
    scaled = _filter_logits(logits_BV.float() / sampling.temperature, sampling.top_k, sampling.top_p)
    return draw(scaled.softmax(-1), gen)


def draw(probs_BV: torch.Tensor, gen: torch.Generator) -> torch.Tensor:
    """One index per row with probability ``probs_BV[b, i]`` (rows need not sum to 1): inverse-CDF sampling, one
    uniform per row (~20x faster than ``torch.multinomial`` on a CPU for a batch of rows). Token ``i`` is drawn
    when ``cdf[i-1] <= u < cdf[i]``, so a token of probability 0 never is; a ``u`` that rounds up to the total
    takes the last token of positive probability. A row holding NaN, inf or a negative value (or only zeros) is
    the RuntimeError ``torch.multinomial`` raises, which the trainer turns into its non-finite-logits error.
    The uniforms come from ``gen`` on its own device (the engines' CPU generators: the same stream on any device);
    the rest runs where ``probs_BV`` is, so a GPU's rows are never copied to the host."""
    cdf_BV = probs_BV.double().cumsum(-1)
    total_B = cdf_BV[:, -1]
    if not bool(((total_B > 0) & torch.isfinite(total_B)).all()) or bool((probs_BV < 0).any()):
        raise RuntimeError("probability tensor contains either inf, nan or element < 0 (or a row of zeros)")
    u_B1 = torch.rand(probs_BV.shape[0], 1, generator=gen, dtype=torch.float64, device=gen.device)
    u_B1 = u_B1.to(probs_BV.device) * cdf_BV[:, -1:]
    V = probs_BV.shape[-1]
    idx_B1 = torch.searchsorted(cdf_BV, u_B1, right=True).clamp_(max=V - 1)
    # cdf[i-1] <= u < cdf[i] means probs[i] > 0: only a u that rounded up to the total (index V) can land on a
    # token of probability 0 after the clamp; that row takes its last token of positive probability
    bad_B1 = probs_BV.gather(-1, idx_B1) <= 0
    if bool(bad_B1.any()):
        last_B1 = V - 1 - (probs_BV > 0).flip(-1).long().argmax(-1, keepdim=True)
        idx_B1 = torch.where(bad_B1, last_B1, idx_B1)
    return idx_B1.squeeze(-1)


def logp_of(logits_BV: torch.Tensor, tok_B: torch.Tensor, temperature: float) -> torch.Tensor:
    """Log-prob of ``tok`` under ``logits`` at ``temperature`` (any leading shape: ``(B,)`` or ``(B, W)``)."""
    t = temperature if temperature > 0 else 1.0
    scaled = logits_BV.float()
    if t != 1.0:
        scaled = scaled / t
    return scaled.gather(-1, tok_B.unsqueeze(-1)).squeeze(-1) - torch.logsumexp(scaled, -1)


def token_logps(logits_BTV: torch.Tensor, ids_BT: torch.Tensor, temperature: float = 1.0) -> torch.Tensor:
    """Log-probability of each chosen token: ``log softmax(z / tau)[id] = z[id] / tau - logsumexp(z / tau)``.

    ``logits_BTV[b, t]`` must already be the logits that *predict* ``ids_BT[b, t]`` (i.e. shifted by one
    w.r.t. the input). Computed one row at a time in float32, so no full ``B x T x V`` log-softmax (or
    float32 copy of bf16 logits) is materialised at once.
    """
    if logits_BTV.dim() != 3 or ids_BT.shape != logits_BTV.shape[:2]:
        raise ValueError(
            f"logits_BTV {tuple(logits_BTV.shape)} and ids_BT {tuple(ids_BT.shape)} "
            "must be (B, T, V) and (B, T)"
        )
    if temperature <= 0:
        raise ValueError(f"temperature must be > 0, got {temperature}")
    return torch.stack([logp_of(logits_TV, ids_T.long(), temperature) for logits_TV, ids_T in zip(logits_BTV, ids_BT)])


def rollout_from_rows(prompt_ids_BP: torch.Tensor, prompt_mask_BP: torch.Tensor, ids: list[list[int]],
                      owner: list[list[int]], *, pad_token_id: int, rounds: list[int], finished: list[bool],
                      max_rounds: int | None, schedule: str, turn: list[list[int]] | None = None,
                      record: dict | None = None) -> Rollout:
    """A :class:`Rollout` from per-row token and owner lists (engines that write whole turns), right-padded,
    on the prompts' device; rounds capped at ``max_rounds``; no log-probs recorded (zeros / None).
    The schedule's decisions: ``turn`` per token (-1 or the chosen author, as ``Rollout.turn_author_BT``),
    or ``record``, ready-made per-row counts (``decisions_B``, ``senior_decisions_B``)."""
    B, T = len(ids), max(1, max(len(r) for r in ids))
    ids_BT = torch.full((B, T), pad_token_id, dtype=torch.long)
    mask_BT, owner_BT = torch.zeros(B, T, dtype=torch.long), torch.zeros(B, T, dtype=torch.long)
    turn_BT = torch.full((B, T), -1, dtype=torch.long)
    for b, (row, own) in enumerate(zip(ids, owner)):
        ids_BT[b, :len(row)] = torch.tensor(row, dtype=torch.long)
        mask_BT[b, :len(row)] = 1
        owner_BT[b, :len(own)] = torch.tensor(own, dtype=torch.long)
        if turn is not None:
            turn_BT[b, :len(turn[b])] = torch.tensor(turn[b], dtype=torch.long)
    dev = prompt_ids_BP.device
    rounds_B = torch.tensor([min(r, max_rounds or 10**9) for r in rounds], dtype=torch.long)
    if turn is not None:
        record = decision_record(turn_BT)
    return Rollout(
        prompt_ids_BP=prompt_ids_BP, prompt_mask_BP=prompt_mask_BP, response_ids_BT=ids_BT.to(dev),
        response_mask_BT=mask_BT.to(dev), owner_BT=owner_BT.to(dev), senior_logps_BT=torch.zeros(B, T, device=dev),
        junior_logps_BT=None, rounds_B=rounds_B.to(dev), finished_B=torch.tensor(finished, dtype=torch.bool).to(dev),
        schedule=schedule, **{k: v.to(dev) for k, v in (record or {}).items()},
    )


def decision_record(turn_author_BT: torch.Tensor) -> dict:
    """The Rollout fields of a schedule's decisions: ``turn_author_BT`` and the per-row counts."""
    return {"turn_author_BT": turn_author_BT, "decisions_B": (turn_author_BT >= 0).long().sum(-1),
            "senior_decisions_B": (turn_author_BT == 1).long().sum(-1)}


def concat_rollouts(parts: list[Rollout], pad_token_id: int) -> Rollout:
    """Stack rollouts along the batch: prompts left-padded, responses right-padded to a common length."""
    if len(parts) == 1:
        return parts[0]
    T = max(r.response_ids_BT.shape[1] for r in parts)
    P = max(r.prompt_ids_BP.shape[1] for r in parts)

    def pad(x: torch.Tensor, value) -> torch.Tensor:
        return torch.nn.functional.pad(x, (0, T - x.shape[1]), value=value)

    def lpad(x: torch.Tensor, value) -> torch.Tensor:
        return torch.nn.functional.pad(x, (P - x.shape[1], 0), value=value)

    junior = None if any(r.junior_logps_BT is None for r in parts) else torch.cat([pad(r.junior_logps_BT, 0.0) for r in parts])

    def cat_opt(name: str, value=None):  # an optional record survives only if every part has it
        xs = [getattr(r, name) for r in parts]
        if any(x is None for x in xs):
            return None
        return torch.cat([pad(x, value) if value is not None else x for x in xs])
    return Rollout(
        prompt_ids_BP=torch.cat([lpad(r.prompt_ids_BP, pad_token_id) for r in parts]),
        prompt_mask_BP=torch.cat([lpad(r.prompt_mask_BP, 0) for r in parts]),
        response_ids_BT=torch.cat([pad(r.response_ids_BT, pad_token_id) for r in parts]),
        response_mask_BT=torch.cat([pad(r.response_mask_BT, 0) for r in parts]),
        owner_BT=torch.cat([pad(r.owner_BT, 0) for r in parts]),
        senior_logps_BT=torch.cat([pad(r.senior_logps_BT, 0.0) for r in parts]),
        junior_logps_BT=junior,
        rounds_B=torch.cat([r.rounds_B for r in parts]),
        finished_B=torch.cat([r.finished_B for r in parts]),
        schedule=parts[0].schedule,
        turn_author_BT=cat_opt("turn_author_BT", -1), decisions_B=cat_opt("decisions_B"),
        senior_decisions_B=cat_opt("senior_decisions_B"), logps_recorded=all(r.logps_recorded for r in parts),
    )
