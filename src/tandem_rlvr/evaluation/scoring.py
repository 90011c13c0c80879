"""Teacher-forced scoring of sampled chains (legibility and drift, docs/evaluation.md "What it measures"):
the junior's per-token cross-entropy and top-1 accuracy, and KL(senior || junior), batched over chains and
chunked over tokens so the vocabulary-sized work stays within ``chunk_tokens`` rows at a time."""

from __future__ import annotations

import weakref

import torch

from tandem_rlvr.engines.scoring import teacher_inputs
from tandem_rlvr.engines.types import Rollout
from tandem_rlvr.evaluation import metrics as M
from tandem_rlvr.evaluation.options import eval_default

__all__ = ["LogitSource", "chain_scores", "drift_kl", "junior_legibility", "model_device"]


_SPLIT_OK: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def model_device(model) -> torch.device:
    return next(iter(model.parameters())).device


def _split_head(model):
    """``(decoder, head)`` if ``head(decoder(x).last_hidden_state)`` equals ``model(x).logits``, else None.

    Checked once per model on a short input; models without the split (or with extra logit
    transforms it would miss) fall back to full-logit forwards one row at a time.
    """
    try:
        dec, head = model.get_decoder(), model.get_output_embeddings()
    except Exception:  # e.g. the LoRA adapter-off junior wrapper
        return None
    if dec is model or head is None:
        return None
    ok = _SPLIT_OK.get(model)
    if ok is None:
        try:
            x = (torch.arange(1, 7, device=model_device(model)) % head.weight.shape[0])[None]
            ref = model(input_ids=x, use_cache=False).logits[0].float()
            got = head(dec(input_ids=x, use_cache=False).last_hidden_state)[0].float()
            ok = bool(torch.allclose(ref, got, rtol=1e-3, atol=1e-3 * max(1.0, float(ref.abs().max()))))
        except Exception:
            ok = False
        _SPLIT_OK[model] = ok
    return (dec, head) if ok else None


class LogitSource:
    """Logits of one model at arbitrary (row, column) positions of a teacher-forced batch.

    Fast path: one decoder forward for the batch, then the LM head on chunks of gathered hidden
    states (memory ∝ chunk × vocab). Fallback: one full forward per row, one row kept at a time.
    """

    def __init__(self, model, ids, mask, pos):
        self.model, self.ids, self.mask, self.pos = model, ids, mask, pos
        self.split = _split_head(model)
        self.hidden = None
        self._row, self._row_logits = None, None
        if self.split is not None:
            dec, _ = self.split
            self.hidden = dec(input_ids=ids, attention_mask=mask, position_ids=pos, use_cache=False).last_hidden_state

    def logits(self, rows_N: torch.Tensor, cols_N: torch.Tensor) -> torch.Tensor:
        if self.split is not None:
            return self.split[1](self.hidden[rows_N, cols_N])
        out = []
        for r in torch.unique_consecutive(rows_N).tolist():
            if r != self._row:
                sl = slice(r, r + 1)
                self._row_logits = self.model(input_ids=self.ids[sl], attention_mask=self.mask[sl],
                                              position_ids=self.pos[sl], use_cache=False).logits[0]
                self._row = r
            out.append(self._row_logits[cols_N[rows_N == r]])
        return torch.cat(out)


def _teacher_batch(rollout: Rollout, rows: torch.Tensor):
    """Prompt + response of ``rows`` (:func:`~tandem_rlvr.engines.scoring.teacher_inputs`, trimmed) and the
    response-token coordinates: row, response column, input column that predicts it, target id; lengths."""
    ids, mask, pos = teacher_inputs(rollout, rows, trim=True)
    r_mask = rollout.response_mask_BT[rows].long()
    T = max(int(r_mask.sum(-1).max()), 1)
    r_ids, r_mask = rollout.response_ids_BT[rows, :T], r_mask[:, :T]
    b_N, t_N = r_mask.nonzero(as_tuple=True)
    cols_N = ids.shape[1] - T - 1 + t_N
    return ids, mask, pos, b_N, t_N, cols_N, r_ids[b_N, t_N], r_mask.sum(-1)


def _score_rows(senior, junior, rollout: Rollout, rows: torch.Tensor, chunk_tokens: int) -> dict:
    ids, mask, pos, b_N, t_N, cols_N, tgt_N, len_B = _teacher_batch(rollout, rows)
    j_src = LogitSource(junior, ids, mask, pos)
    s_src = LogitSource(senior, ids, mask, pos) if senior is not None else None
    parts: list[dict] = []
    for c in range(0, int(b_N.numel()), chunk_tokens):
        sl = slice(c, c + chunk_tokens)
        s_logits = s_src.logits(b_N[sl], cols_N[sl]) if s_src is not None else None
        parts.append(M.token_scores(j_src.logits(b_N[sl], cols_N[sl]), tgt_N[sl], s_logits))
    tok = {k: torch.cat([p[k] for p in parts]).cpu() for k in parts[0]}
    b_N, t_N, len_N, nb = b_N.cpu(), t_N.cpu(), len_B[b_N].cpu(), len(rows)
    out = {
        "junior_ce": M.chain_means(tok["ce"], b_N, nb),
        "junior_top1": M.chain_means(tok["top1"], b_N, nb),
        "junior_ce_deciles": M.per_chain_deciles(tok["ce"], b_N, t_N, len_N, nb),
        "n_tokens": len_B.cpu(),
    }
    if s_src is not None:
        out["kl_mc"] = M.chain_means(tok["kl_mc"], b_N, nb)
        out["kl_exact"] = M.chain_means(tok["kl_exact"], b_N, nb)
    return out


@torch.inference_mode()
def chain_scores(senior, junior, rollout: Rollout, *, chunk_tokens: int = eval_default("chunk_tokens"),
                 score_batch: int = eval_default("score_batch")) -> dict:
    """Per-chain teacher-forced scores of ``rollout``'s responses after their prompts, at temperature 1.

    Returns float64 tensors over chains: ``junior_ce`` (mean nats per token), ``junior_top1``,
    ``junior_ce_deciles`` ``(B, 10)`` (NaN where a chain has no token in a decile), ``n_tokens``, and
    with a ``senior``: ``kl_mc`` and ``kl_exact`` (mean per-token KL(senior ‖ junior)). One forward per
    model per ``score_batch`` rows; the vocabulary-sized work is chunked to ``chunk_tokens`` tokens.
    EOS tokens count as response tokens.
    """
    if chunk_tokens < 1 or score_batch < 1:
        raise ValueError("chunk_tokens and score_batch must be >= 1")
    order = torch.arange(rollout.batch_size, device=rollout.response_ids_BT.device)
    parts = [_score_rows(senior, junior, rollout, order[i:i + score_batch], chunk_tokens)
             for i in range(0, rollout.batch_size, score_batch)]
    return {k: torch.cat([p[k] for p in parts]) for k in parts[0]}


def junior_legibility(junior, rollout: Rollout, **kw) -> dict:
    """The junior's per-chain CE (nats/token), top-1 accuracy and CE by position decile on ``rollout``."""
    return chain_scores(None, junior, rollout, **kw)


def drift_kl(senior, junior, rollout: Rollout, **kw) -> dict:
    """Per-chain mean per-token KL(senior ‖ junior): ``{"kl_mc": ..., "kl_exact": ...}``."""
    s = chain_scores(senior, junior, rollout, **kw)
    return {"kl_mc": s["kl_mc"], "kl_exact": s["kl_exact"]}
