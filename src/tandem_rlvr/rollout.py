"""The rollout engine: batched co-generation by a senior and a junior with ownership records.

Both models read the same growing token history. Each keeps its own KV cache; at every decoding
step both take the newest token (*lockstep*), the current author's distribution is sampled, and
``owner_BT`` records 1 where the senior wrote the token and 0 where the junior did. The history is
never re-encoded at a switch. Lockstep costs one senior and one junior forward per token, which is
exactly a senior solo plus a junior solo rollout, and gives the junior's log-prob of every emitted
token for free (drift metrics, KL-to-junior). With schedule ``none`` and ``record_junior=False`` the
junior is not run at all.

Sampling uses its own generator and the schedule's coins another, so a p = 1 tandem rollout samples
token-for-token what a solo rollout with the same seed samples.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
from transformers import DynamicCache

from tandem_rlvr.handoff import Schedule

SCHEDULE_SEED_OFFSET = 1_000_003


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
    probs = scaled.softmax(-1)
    return torch.multinomial(probs.cpu(), 1, generator=gen).squeeze(-1).to(logits_BV.device)


def _logp_of(logits_BV: torch.Tensor, tok_B: torch.Tensor, temperature: float) -> torch.Tensor:
    t = temperature if temperature > 0 else 1.0
    scaled = logits_BV.float() / t
    return scaled.gather(-1, tok_B[:, None]).squeeze(-1) - torch.logsumexp(scaled, -1)


class _Stream:
    """One model's incremental decoding state over the shared history (its own KV cache)."""

    def __init__(self, model, ids_BP: torch.Tensor, mask_BP: torch.Tensor):
        self.model = model
        self.cache = DynamicCache()
        self.pos_B1 = (mask_BP.long().cumsum(-1) - 1).clamp(min=0)
        self.logits_BV = self._forward(ids_BP, mask_BP, self.pos_B1)
        self.pos_B1 = self.pos_B1[:, -1:]

    def _forward(self, ids, mask, pos) -> torch.Tensor:
        out = self.model(
            input_ids=ids, attention_mask=mask, position_ids=pos,
            past_key_values=self.cache, use_cache=True, logits_to_keep=1,
        )
        self.cache = out.past_key_values
        return out.logits[:, -1, :]

    def step(self, tok_B: torch.Tensor, mask_BT: torch.Tensor) -> None:
        self.pos_B1 = self.pos_B1 + 1
        self.logits_BV = self._forward(tok_B[:, None], mask_BT, self.pos_B1)


def _check_vocab(senior, junior, table_size: int | None) -> None:
    vs = senior.get_output_embeddings().weight.shape[0]
    if junior is not None:
        vj = junior.get_output_embeddings().weight.shape[0]
        if vj != vs:
            raise ValueError(f"senior and junior output vocabularies differ ({vs} vs {vj} rows)")
    if table_size is not None and table_size < vs:
        raise ValueError(f"handoff token table covers {table_size} ids but the model has {vs} rows")


@torch.inference_mode()
def generate(
    senior,
    junior,
    prompt_ids_BP: torch.Tensor,
    prompt_mask_BP: torch.Tensor,
    schedule: Schedule,
    sampling: Sampling,
    *,
    eos_token_ids: Sequence[int],
    pad_token_id: int,
    seed: int = 0,
    max_rounds: int | None = None,
    record_junior: bool = True,
) -> Rollout:
    """Co-generate responses to left-padded prompts; see the module docstring.

    ``max_rounds`` ends a sequence once it would start turn ``max_rounds + 1``. ``record_junior``
    runs the junior in lockstep even when it never writes, to record its log-probs.
    """
    if schedule.uses_junior and junior is None:
        raise ValueError(f"handoff schedule {schedule.name!r} (p={schedule.p}) needs a junior model")
    run_junior = junior is not None and (schedule.uses_junior or record_junior)
    _check_vocab(senior, junior if run_junior else None, schedule.table.vocab_size if schedule.table else None)
    device = prompt_ids_BP.device
    B, n_new = prompt_ids_BP.shape[0], sampling.max_new_tokens
    gen_tok = torch.Generator().manual_seed(int(seed))
    gen_sched = torch.Generator().manual_seed(int(seed) + SCHEDULE_SEED_OFFSET)
    eos = torch.tensor(sorted(set(int(e) for e in eos_token_ids)), device=device)

    mask_BT = prompt_mask_BP.long().clone()
    s_stream = _Stream(senior, prompt_ids_BP, mask_BT)
    j_stream = _Stream(junior, prompt_ids_BP, mask_BT) if run_junior else None
    state = schedule.start(B, gen_sched)
    ids = torch.full((B, n_new), pad_token_id, dtype=torch.long, device=device)
    owner = torch.zeros(B, n_new, dtype=torch.long)
    alive_BT = torch.zeros(B, n_new, dtype=torch.long)
    s_lp, j_lp = torch.zeros(B, n_new), torch.zeros(B, n_new)
    done = torch.zeros(B, dtype=torch.bool, device=device)
    hit_eos = torch.zeros(B, dtype=torch.bool, device=device)
    rounds = state.rounds_B.clone()
    for t in range(n_new):
        author = state.author_B.to(device)
        logits = s_stream.logits_BV
        if j_stream is not None:
            logits = torch.where(author[:, None], logits, j_stream.logits_BV)
        tok = sample_tokens(logits, sampling, gen_tok)
        tok = torch.where(done, torch.full_like(tok, pad_token_id), tok)
        ids[:, t], alive_BT[:, t] = tok, (~done).long().cpu()
        owner[:, t] = (author & ~done).long().cpu()
        s_lp[:, t] = _logp_of(s_stream.logits_BV, tok, sampling.temperature).cpu()
        if j_stream is not None:
            j_lp[:, t] = _logp_of(j_stream.logits_BV, tok, sampling.temperature).cpu()
        state = schedule.advance(state, tok, gen_sched)
        rounds = torch.where(done.cpu(), rounds, state.rounds_B)
        hit_eos = hit_eos | (torch.isin(tok, eos) & ~done)
        done = done | hit_eos
        if max_rounds is not None:
            done = done | (state.rounds_B > max_rounds).to(device)
        if bool(done.all()) or t == n_new - 1:
            break
        mask_BT = torch.cat([mask_BT, torch.ones(B, 1, dtype=mask_BT.dtype, device=device)], dim=1)
        s_stream.step(tok, mask_BT)
        if j_stream is not None:
            j_stream.step(tok, mask_BT)
    T = int(alive_BT.sum(0).nonzero().max()) + 1 if alive_BT.any() else 1
    return Rollout(
        prompt_ids_BP=prompt_ids_BP, prompt_mask_BP=prompt_mask_BP,
        response_ids_BT=ids[:, :T], response_mask_BT=alive_BT[:, :T].to(device),
        owner_BT=owner[:, :T].to(device), senior_logps_BT=s_lp[:, :T] * alive_BT[:, :T],
        junior_logps_BT=(j_lp[:, :T] * alive_BT[:, :T]) if j_stream is not None else None,
        rounds_B=torch.minimum(rounds, torch.full_like(rounds, max_rounds or 10**9)),
        finished_B=hit_eos, schedule=schedule.name,
    )


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
    )
