"""Teacher-forced scoring of a :class:`~tandem_rlvr.engines.types.Rollout`: the one place that lays a
batch's prompts and responses out for a forward pass (:func:`teacher_inputs`) and the one function that
computes each response token's log-prob under a model (:func:`sequence_logps`). The trainer's old and
new log-probs, the text bridge's scores and the evaluation's per-token scores all start here."""

from __future__ import annotations

import torch

from tandem_rlvr.engines import fastpath
from tandem_rlvr.engines.fastpath import gqa_attention
from tandem_rlvr.engines.types import Rollout, token_logps

__all__ = ["PromptPrefix", "read_prompts", "sequence_logps", "teacher_inputs"]


def teacher_inputs(rollout: Rollout, rows: torch.Tensor | None = None, *, trim: bool = False):
    """``(ids, mask, pos)`` of prompt + response for ``rows`` (all by default): left-padded prompts, then
    the right-padded responses, positions counted over real tokens. ``trim`` drops the prompt columns
    that are padding in every row and the response columns past the longest response (the evaluation's
    layout; the trainer keeps the full width so log-probs line up with ``response_ids_BT``)."""
    rows = torch.arange(rollout.batch_size) if rows is None else rows
    p_ids, p_mask = rollout.prompt_ids_BP[rows], rollout.prompt_mask_BP[rows].long()
    r_ids, r_mask = rollout.response_ids_BT[rows], rollout.response_mask_BT[rows].long()
    if trim:
        T = max(int(r_mask.sum(-1).max()), 1)
        r_ids, r_mask = r_ids[:, :T], r_mask[:, :T]
        first = int(p_mask.any(0).nonzero().min()) if bool(p_mask.any()) else 0
        p_ids, p_mask = p_ids[:, first:], p_mask[:, first:]
    ids, mask = torch.cat([p_ids, r_ids], 1), torch.cat([p_mask, r_mask], 1)
    return ids, mask, (mask.cumsum(-1) - 1).clamp(min=0)


def sequence_logps(model, rollout: Rollout, temperature: float, micro: int = 0, rows=None,
                   prefix: "PromptPrefix | None" = None) -> torch.Tensor:
    """Log-probs ``(len(rows), T)`` of the response tokens under ``model`` at ``temperature``: one forward
    over prompt + response per ``micro`` rows (0: all at once), the LM head on the response positions only.
    Padding positions hold the log-prob of the pad token, or 0 past the rows' longest response (mask them
    with ``response_mask_BT``). ``prefix`` (:func:`read_prompts`, under autograd): the responses read the
    prompts' keys and values from it instead of a forward over the prompts."""
    rows = torch.arange(rollout.batch_size) if rows is None else rows
    step = micro or len(rows)
    return torch.cat([_forward_logps(model, rollout, rows[i:i + step], temperature, prefix)
                      for i in range(0, len(rows), step)])


def _forward_logps(model, rollout: Rollout, rows: torch.Tensor, temperature: float, prefix=None) -> torch.Tensor:
    """One forward over ``rows``, cut to their own longest response (and, without shared prompts, to their
    own longest prompt): the columns past it are padding in every row, so their log-probs are 0 without
    a forward (a batch's longest response is often longer than a chunk's)."""
    full_T = rollout.response_ids_BT.shape[1]
    T = max(int(rollout.response_mask_BT[rows].sum(-1).max()), 1) if fastpath.TRIM else full_T
    r_ids = rollout.response_ids_BT[rows, :T]
    inner = getattr(model, "module", model)  # DDP wraps the module; the attention switch lives on its config
    with gqa_attention(inner):
        shared = None if prefix is not None else _shared_prompts(model, rollout, rows, rollout.prompt_ids_BP.device)
        if prefix is not None or shared is not None:  # the prompts' keys and values come from a cache
            ids, mask, pos = (x[:, :rollout.prompt_ids_BP.shape[1] + T] for x in teacher_inputs(rollout, rows))
            logits = (prefix.logits(model, ids, mask, pos, T, rows) if prefix is not None
                      else _shared_prompt_logits(model, ids, mask, pos, T, *shared))
        else:
            ids, mask, pos = teacher_inputs(rollout, rows, trim=fastpath.TRIM)
            logits = model(input_ids=ids, attention_mask=mask, position_ids=pos, use_cache=False,
                           logits_to_keep=T + 1).logits
    logps = token_logps(logits[:, :-1], r_ids, temperature=temperature)
    return torch.nn.functional.pad(logps, (0, full_T - T)) if T < full_T else logps


def _shared_prompts(model, rollout: Rollout, rows: torch.Tensor, device):
    """``(distinct prompts (ids, mask), row -> prompt index)`` when no gradient is taken and ``model`` is a
    full-attention decoder on a fast-path device, not DDP-wrapped; else None. A GRPO batch holds each
    prompt ``group_size`` times. The choice never depends on the data: an FSDP-sharded model's forwards
    are collective, so every process must take the same path (a batch without repeats costs one extra
    forward call, not extra arithmetic).

    Not under autograd: there the trainer decides for the whole mini-batch (:func:`read_prompts`, one
    process only: a DDP-wrapped model cannot take two forwards per backward)."""
    if not fastpath.SHARED_PROMPTS or device.type not in fastpath.FAST_PATH_DEVICES or not fastpath.fast_ok(model):
        return None
    if getattr(model, "module", None) is not None or getattr(model, "is_gradient_checkpointing", False):
        return None
    if torch.is_grad_enabled():
        return None
    p_ids, p_mask = rollout.prompt_ids_BP[rows], rollout.prompt_mask_BP[rows].long()
    uniq, inv = torch.unique(torch.cat([p_ids, p_mask], -1), dim=0, return_inverse=True)
    P = p_ids.shape[1]
    return uniq[:, :P], uniq[:, P:], inv


def _new_cache(model):
    from transformers import DynamicCache

    cfg = getattr(model, "config", None)
    return DynamicCache(config=cfg) if cfg is not None else DynamicCache()


def _read_distinct(model, u_ids, u_mask):
    """One forward over the distinct prompts: ``(cache, last-position logits)``."""
    u_pos = (u_mask.cumsum(-1) - 1).clamp(min=0)
    first = model(input_ids=u_ids, attention_mask=u_mask, position_ids=u_pos, past_key_values=_new_cache(model),
                  use_cache=True, logits_to_keep=1)
    return first.past_key_values, first.logits


def _after_prompts(model, cache, first_BV, ids, mask, pos, T: int) -> torch.Tensor:
    """The logits of the plain forward's last ``T + 1`` positions: ``first_BV`` (the prompts' last position,
    one row per batch row) and the responses' forward over ``cache`` (the prompts' keys and values)."""
    P = ids.shape[1] - T
    rest = model(input_ids=ids[:, P:], attention_mask=mask, position_ids=pos[:, P:], past_key_values=cache,
                 use_cache=True, logits_to_keep=T).logits
    return torch.cat([first_BV, rest], 1)


def _shared_prompt_logits(model, ids, mask, pos, T: int, u_ids, u_mask, inv) -> torch.Tensor:
    """The logits of the plain forward's last ``T + 1`` positions, with each distinct prompt read once: the
    prompts' keys and values (and last logits) are computed per distinct prompt and indexed out to their
    rows, then the responses read them from the cache. Same function: a prompt position never attends to
    a response."""
    cache, first = _read_distinct(model, u_ids, u_mask)
    cache.batch_select_indices(inv)
    return _after_prompts(model, cache, first[inv], ids, mask, pos, T)


class PromptPrefix:
    """The distinct prompts of a mini-batch read once under autograd, for the update's chunks to share.

    A GRPO mini-batch holds each prompt ``group_size`` times; the update's forward per chunk would read
    every copy. Here the prompts' keys, values and last logits are computed once (:func:`read_prompts`)
    and handed to each chunk as detached leaves: a chunk's backward stops at them, adding its share of
    their gradient there, and :meth:`backward` then runs the prompts' own backward once with the sum.
    The same gradient as a forward per chunk over its prompts, added up in another order."""

    def __init__(self, cache, last_logits, inv_B):
        self._src = [t for layer in cache.layers for t in (layer.keys, layer.values)] + [last_logits]
        # a tensor no trainable weight reaches (the first layer's keys under a LoRA without k_proj) stays a
        # constant: no leaf to collect a gradient, nothing to run backward through
        self._leaf = [t.detach().requires_grad_(t.requires_grad) for t in self._src]
        self._inv_B = inv_B  # each batch row's prompt index (-1: a row outside the mini-batch)

    def logits(self, model, ids, mask, pos, T: int, rows: torch.Tensor) -> torch.Tensor:
        """As :func:`_shared_prompt_logits` for ``rows``, reading the prompts from this prefix."""
        cache, inv = _new_cache(model), self._inv_B[rows]
        *kv, last = self._leaf
        for i in range(0, len(kv), 2):
            cache.update(kv[i][inv], kv[i + 1][inv], i // 2)
        return _after_prompts(model, cache, last[inv], ids, mask, pos, T)

    def backward(self) -> None:
        """The prompts' backward, once, with the gradient the chunks left on the leaves."""
        pairs = [(s, leaf.grad) for s, leaf in zip(self._src, self._leaf) if s.requires_grad and leaf.grad is not None]
        if pairs:
            torch.autograd.backward([s for s, _ in pairs], [g for _, g in pairs])
        self._src = self._leaf = []


_DROPOUT_FIELDS = ("attention_dropout", "dropout", "hidden_dropout", "hidden_dropout_prob", "attention_probs_dropout_prob",
                   "resid_pdrop", "embd_pdrop", "attn_pdrop", "activation_dropout", "layerdrop", "ffn_dropout")


def _config_says(model, fields) -> bool:
    """Whether ``model``'s config (or its text config) sets any of ``fields`` to a positive number; a value that
    cannot be read as a number counts as positive (the callers then take the safe path)."""
    cfg = getattr(model, "config", None)
    text = cfg.get_text_config(decoder=True) if hasattr(cfg, "get_text_config") else cfg
    for c in {id(x): x for x in (cfg, text) if x is not None}.values():
        for field in fields:
            try:
                if float(getattr(c, field, 0.0) or 0.0) > 0:
                    return True
            except (TypeError, ValueError):
                return True
    return False


def drops_out(model) -> bool:
    """Whether a training forward of ``model`` may sample dropout (a dropout module, or a rate in its config
    that transformers applies functionally): the copies of a prompt would then share one mask instead of
    drawing their own, so the prompts are not shared."""
    if not model.training:
        return False
    if _config_says(model, _DROPOUT_FIELDS):
        return True
    return any(isinstance(m, torch.nn.modules.dropout._DropoutNd) and m.p > 0 for m in model.modules())


_EXPERT_FIELDS = ("num_experts", "num_local_experts", "n_routed_experts", "moe_num_experts")


def routes_experts(model) -> bool:
    """Whether ``model`` is a mixture of experts (an expert count in its config): a forward over some rows may
    leave an expert without a gradient that the other rows would have given it (a zero one)."""
    return _config_says(model, _EXPERT_FIELDS)


def read_prompts(model, rollout: Rollout, rows: torch.Tensor, max_prompts: int | None = None) -> PromptPrefix | None:
    """The distinct prompts of ``rows`` read once with autograd on (:class:`PromptPrefix`) where the update
    may share them: ``fastpath.SHARED_PROMPTS_UPDATE`` on, ``model`` an unwrapped full-attention decoder on
    a fast-path device (one process: a DDP- or FSDP-wrapped model takes one forward per backward) without
    active dropout, and some prompt repeated; else None (a forward per chunk over its own prompts). The prompts'
    graph is held until every chunk is done: with more than ``max_prompts`` distinct prompts (the chunk size)
    it would hold more prompt activations than a chunk does, so the memory bound of ``algo.micro_batch``
    holds and the chunks read their own."""
    device = rollout.prompt_ids_BP.device
    if (not fastpath.SHARED_PROMPTS_UPDATE or not torch.is_grad_enabled() or device.type not in fastpath.FAST_PATH_DEVICES
            or not fastpath.fast_ok(model) or getattr(model, "module", None) is not None
            or getattr(model, "is_gradient_checkpointing", False) or drops_out(model)):
        return None
    p_ids, p_mask = rollout.prompt_ids_BP[rows], rollout.prompt_mask_BP[rows].long()
    uniq, inv = torch.unique(torch.cat([p_ids, p_mask], -1), dim=0, return_inverse=True)
    if len(uniq) == len(rows) or (max_prompts is not None and len(uniq) > max_prompts):
        return None
    P = p_ids.shape[1]
    with gqa_attention(model):
        cache, last = _read_distinct(model, uniq[:, :P], uniq[:, P:])
    inv_B = torch.full((rollout.batch_size,), -1, dtype=torch.long, device=device)
    inv_B[rows] = inv
    return PromptPrefix(cache, last, inv_B)
