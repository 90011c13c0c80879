"""Legibility comparable across tokenizers: the junior's bits per UTF-8 byte of the senior's chains.

Nats per token depend on the tokenizer: a vocabulary with longer tokens spends more nats per token on
the same text, so two juniors with different tokenizers (or a junior and the senior) cannot be ranked
by per-token cross-entropy. The total information a model assigns to a *text* does not depend on how
it cuts it, so we divide the junior's total negative log-likelihood of the chain text by the text's
length in UTF-8 bytes: **bits per byte** = ``sum(-log p_junior(token)) / ln 2 / bytes``.

The junior reads ``its own rendering of the prompt`` (its chat template, or the plain template when it
has none) followed by ``its own encoding of the chain text`` (no special tokens); every text token is
scored, EOS is not (it has no bytes). If prompt + text are longer than the junior's context, the input
is truncated from the left: prompt tokens first, then the earliest text tokens, which are then not
scored, and the bytes are those of the text from the first scored token on (counted per chain as
``truncated``). Empty chains have no bytes and no value (NaN). Values are averaged per chain, then
per benchmark, then over benchmarks, like the nats-per-token CE.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import torch

from tandem_rlvr.engines.base import PromptBatch
from tandem_rlvr.evaluation.options import eval_default

# the evaluation's scoring batch and chunk (documented once, in tandem_rlvr.evaluation.options.EvalOptions)
SCORE_BATCH, CHUNK_TOKENS = eval_default("score_batch"), eval_default("chunk_tokens")

LN2 = math.log(2.0)

__all__ = ["BpbSink", "bits_per_byte"]


def _rows(tokenizer, prompts: Sequence[str], texts: Sequence[str], context: int | None) -> list[dict]:
    """Per chain: the (left-truncated) input ids, the index of the first scored position, the bytes."""
    from tandem_rlvr.data import encode_prompt_texts  # the prompt ids sampling read (a plain prompt's BOS)
    p_ids = encode_prompt_texts(tokenizer, list(prompts))
    enc = tokenizer(list(texts), add_special_tokens=False, return_offsets_mapping=True)
    rows = []
    for p, t, offs, text in zip(p_ids, enc["input_ids"], enc["offset_mapping"], texts):
        seq = list(p) + list(t)
        drop = max(0, len(seq) - context) if context else 0
        k0 = min(len(t), max(0, drop + 1 - len(p)))  # first text token with a token before it in the window
        start = 0 if k0 == 0 else (int(offs[k0][0]) if k0 < len(t) else len(text))
        rows.append({"ids": seq[drop:], "first": len(p) - drop + k0, "n_text": len(t) - k0,
                     "bytes": len(text[start:].encode("utf-8")), "truncated": drop > 0, "unscored": k0})
    return rows


@torch.inference_mode()
def _nats(model, rows: list[dict], chunk_tokens: int) -> list[float]:
    """Sum of the text tokens' negative log-likelihoods (nats) of each row, one forward per batch."""
    from tandem_rlvr.evaluation.scoring import LogitSource, model_device

    device = model_device(model)
    batch = PromptBatch.left_padded([r["ids"] for r in rows], 0)
    ids, mask, width = batch.ids_BP, batch.mask_BP, batch.ids_BP.shape[1]
    pos = (mask.cumsum(-1) - 1).clamp(min=0)
    rows_N, cols_N = [], []
    for i, r in enumerate(rows):
        pad = width - len(r["ids"])
        cols = range(pad + r["first"], width)
        rows_N += [i] * len(cols)
        cols_N += list(cols)
    out = torch.zeros(len(rows), dtype=torch.float64)
    if not rows_N:
        return out.tolist()
    rows_N, cols_N = torch.tensor(rows_N), torch.tensor(cols_N)
    src = LogitSource(model, ids.to(device), mask.to(device), pos.to(device))
    for c in range(0, rows_N.numel(), chunk_tokens):
        r_n, c_n = rows_N[c:c + chunk_tokens], cols_N[c:c + chunk_tokens]
        logits = src.logits(r_n.to(device), (c_n - 1).to(device)).float()
        tgt = ids[r_n, c_n].to(device)
        nll = torch.logsumexp(logits, -1) - logits.gather(-1, tgt[:, None]).squeeze(-1)
        out.index_add_(0, r_n, nll.double().cpu())
    return out.tolist()


def bits_per_byte(model, tokenizer, prompts: Sequence[str], texts: Sequence[str], *, context: int | None = None,
                  batch: int = SCORE_BATCH, chunk_tokens: int = CHUNK_TOKENS) -> list[dict]:
    """Per text: ``bpb`` (NaN for an empty text), ``nats``, ``bytes``, ``n_tokens`` scored, ``truncated``.

    ``prompts`` are already rendered for ``model``'s tokenizer; ``context`` defaults to the model's
    ``max_position_embeddings``.
    """
    if len(prompts) != len(texts):
        raise ValueError(f"bits_per_byte needs one prompt per text, got {len(prompts)} and {len(texts)}")
    if context is None:
        context = getattr(getattr(model, "config", None), "max_position_embeddings", None)
    out = []
    for i in range(0, len(texts), batch):
        rows = _rows(tokenizer, prompts[i:i + batch], texts[i:i + batch], context)
        for r, nats in zip(rows, _nats(model, rows, chunk_tokens)):
            bpb = nats / LN2 / r["bytes"] if r["bytes"] > 0 and r["n_text"] > 0 else float("nan")
            out.append({"bpb": bpb, "nats": nats, "bytes": r["bytes"], "n_tokens": r["n_text"],
                        "truncated": r["truncated"], "unscored_tokens": r["unscored"]})
    return out


class BpbSink:
    """A chain sink that adds ``junior_bpb`` to every solo chain (scored in batches) and passes all on.

    Call :meth:`flush` at the end, then :meth:`summary` for ``junior_bpb`` and its counts.
    """

    def __init__(self, junior, tokenizer, examples: Sequence, sink: Callable | None, *, batch: int = SCORE_BATCH,
                 chunk_tokens: int = CHUNK_TOKENS):
        from tandem_rlvr.data import render_prompt
        from tandem_rlvr.errors import DataError

        self.junior, self.tok, self.sink, self.batch, self.chunk = junior, tokenizer, sink, batch, chunk_tokens
        self.problems: dict[str, str] = {}
        for ex in examples:
            if self.problems.setdefault(str(ex.id), ex.problem) != ex.problem:
                raise DataError(f"two problems share the id {ex.id!r}; ids must be unique to score legibility")
        self.render = render_prompt
        self.pending: list[dict] = []
        self.scores: list[dict] = []

    def __call__(self, rec: dict) -> None:
        if rec.get("mode") != "solo":
            self._emit(rec)
            return
        self.pending.append(rec)
        if len(self.pending) >= self.batch:
            self.flush()

    def _emit(self, rec: dict) -> None:
        if self.sink is not None:
            self.sink(rec)

    def flush(self) -> None:
        """Score the buffered solo chains and pass them on."""
        if not self.pending:
            return
        recs, self.pending = self.pending, []
        prompts = [self.render(self.tok, self.problems[str(r["problem_id"])]) for r in recs]
        scores = bits_per_byte(self.junior, self.tok, prompts, [r["text"] for r in recs], batch=self.batch,
                               chunk_tokens=self.chunk)
        for rec, s in zip(recs, scores):
            rec["junior_bpb"] = s["bpb"] if math.isfinite(s["bpb"]) else None
            self.scores.append(s)
            self._emit(rec)

    def summary(self) -> dict:
        """``junior_bpb`` (mean over chains with bytes) and the counts of empty and truncated chains."""
        vals = [s["bpb"] for s in self.scores if math.isfinite(s["bpb"])]
        return {"junior_bpb": sum(vals) / len(vals) if vals else float("nan"),
                "junior_bpb_empty_chains": sum(1 for s in self.scores if not math.isfinite(s["bpb"])),
                "junior_bpb_truncated_chains": sum(1 for s in self.scores if s["truncated"]),
                "junior_bpb_unscored_tokens": sum(s["unscored_tokens"] for s in self.scores)}
