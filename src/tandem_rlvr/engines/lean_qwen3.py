"""A lean decoder for small Qwen3 causal LMs: the function of transformers' ``Qwen3ForCausalLM`` (same
weights, same arithmetic up to floating-point order) without its per-layer module dispatch.

On the built-in worlds' tiny Qwen3s (3 layers, 96 wide) a rollout forward is overhead-bound: a decode
step of transformers' model calls ~40 modules and ~130 ops per token, each far costlier than its
arithmetic (issue 37). :class:`LeanQwen3` reads the model's weights once per rollout (q, k and v fused
into one matrix, gate and up into another, in float32 each layer's RMSNorm weights folded into the matrix
that reads the norm's output, the q and k norms and RoPE applied to both head sets at once), keeps a preallocated KV cache, looks RoPE up in a table
built from the model's own ``inv_freq``, and runs each step as a short list of tensor ops; the
attention is SDPA with the grouped-query heads passed natively (``enable_gqa``), as the engine's
``gqa_attention`` does for transformers' forward.

Only the rollout engine decodes with it (inference only, no autograd): the trainer's scoring and
update forwards stay transformers' model. :func:`supports` says where it is exact: a plain
``Qwen3ForCausalLM`` (no adapters, no quantisation) on CPU, full attention in every layer, default
RoPE, SiLU MLP, no attention bias; anything else takes the engine's generic path.
tests/engines/test_lean_qwen3.py checks logits against transformers' forward and whole rollouts
against the generic path.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

__all__ = ["LeanQwen3", "supports"]


def _hooked(model) -> bool:
    """Whether a forward hook could change what ``model``'s modules compute: a global one, or one on any of its
    modules other than transformers' own (which record outputs, installed after a call that asks for them). The
    lean decoder reads the weights and calls no module, so with such a hook it would compute another function
    (a user's hook on the lm_head: the rollout's recorded log-probs no longer the update's)."""
    from torch.nn.modules import module as nn_module

    if nn_module._global_forward_hooks or nn_module._global_forward_pre_hooks:
        return True
    for m in model.modules():
        for hook in (*m._forward_hooks.values(), *m._forward_pre_hooks.values()):
            if not str(getattr(hook, "__module__", "") or "").startswith("transformers."):
                return True
    return False


def _wrapped(model) -> bool:
    """Whether ``model``'s forward is not its class's: an instance attribute in its place (accelerate's autocast
    under mixed precision, the trainer's junior autocast, a user's patch), or an autocast context around the call.
    The lean decoder calls no forward, so it would decode in float32 what the wrapped forward computes in bf16."""
    return "forward" in vars(model) or torch.is_autocast_enabled("cpu")


def supports(model) -> bool:
    """Whether :class:`LeanQwen3` computes ``model``'s function exactly (up to float order)."""
    if (type(model).__name__ != "Qwen3ForCausalLM" or getattr(model, "peft_config", None) or _hooked(model)
            or _wrapped(model)):
        return False
    cfg = getattr(model, "config", None)
    if cfg is None or getattr(cfg, "quantization_config", None) is not None:
        return False
    rope = getattr(cfg, "rope_parameters", None) or {}
    types = getattr(cfg, "layer_types", None) or []
    try:
        device = next(iter(model.parameters())).device
    except StopIteration:
        return False
    if model.training and getattr(cfg, "attention_dropout", 0.0):  # transformers would drop attention weights
        return False
    return (device.type == "cpu" and cfg.hidden_act == "silu" and not cfg.attention_bias
            and rope.get("rope_type", "default") == "default"
            and all(t == "full_attention" for t in types)
            and not (getattr(cfg, "use_sliding_window", False) and getattr(cfg, "sliding_window", None))
            and len(model.model.layers) == cfg.num_hidden_layers
            and all(type(m).__name__ in ("Linear", "Embedding") for m in _weight_modules(model)))


def _weight_modules(model):
    yield model.model.embed_tokens
    yield model.lm_head
    for layer in model.model.layers:
        a, m = layer.self_attn, layer.mlp
        yield from (a.q_proj, a.k_proj, a.v_proj, a.o_proj, m.gate_proj, m.up_proj, m.down_proj)


class _Layer:
    __slots__ = ("ln1", "qkv", "qkn", "o", "ln2", "gu", "down", "k", "v")


class LeanQwen3:
    """``model``'s forward over a shared KV cache of ``batch`` rows and up to ``max_len`` positions.

    The cache holds ``capacity`` positions at first (default ``max_len``) and grows by half when full.
    :meth:`forward` takes ``ids_BQ`` (the next ``Q`` tokens of every row), their positions and a boolean
    attention mask ``(B, 1, 1 or Q, n)`` over the ``n`` cache slots filled after this call (True =
    attend), and returns the logits of the last ``keep`` of the ``Q`` tokens. The weights are read
    when it is built (fused copies for q/k/v and gate/up): build one per rollout.
    """

    def __init__(self, model, batch: int, max_len: int, capacity: int | None = None):
        cfg = model.config
        m = model.model
        self.eps = cfg.rms_norm_eps
        self.H, self.Hkv = cfg.num_attention_heads, cfg.num_key_value_heads
        self.D = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
        self.scale = self.D ** -0.5  # Qwen3Attention.scaling
        self.embed = m.embed_tokens.weight.detach()
        self.norm, self.head = m.norm.weight.detach(), model.lm_head.weight.detach()  # views: no copy of the head
        dtype, device = self.embed.dtype, self.embed.device
        # float32: each layer's RMSNorm weights folded into the matrix that reads the norm's output (one op less
        # per norm, the same up to float32 rounding); other dtypes keep transformers' order (w * x, then x W),
        # which a bf16 fold would round differently
        fold = dtype == torch.float32
        self.layers = []
        for layer in m.layers:
            a, mlp, L = layer.self_attn, layer.mlp, _Layer()
            ln1, ln2 = layer.input_layernorm.weight.detach(), layer.post_attention_layernorm.weight.detach()
            qkv = torch.cat([a.q_proj.weight, a.k_proj.weight, a.v_proj.weight]).detach()
            gu = torch.cat([mlp.gate_proj.weight, mlp.up_proj.weight]).detach()
            L.ln1, L.ln2 = (None, None) if fold else (ln1, ln2)
            L.qkv, L.gu = (qkv * ln1, gu * ln2) if fold else (qkv, gu)
            L.qkn = torch.cat([a.q_norm.weight.expand(self.H, -1), a.k_norm.weight.expand(self.Hkv, -1)]).detach()
            L.o = a.o_proj.weight.detach()
            L.down = mlp.down_proj.weight.detach()
            L.k = torch.empty(batch, self.Hkv, min(max_len, capacity or max_len), self.D, dtype=dtype, device=device)
            L.v = torch.empty_like(L.k)
            self.layers.append(L)
        rot = m.rotary_emb
        freqs = torch.arange(max(max_len, 1), device=device).float()[:, None] * rot.inv_freq.float()[None, :]
        emb = torch.cat([freqs, freqs], -1)
        self.cos = (emb.cos() * rot.attention_scaling).to(dtype)
        self.sin = (emb.sin() * rot.attention_scaling).to(dtype)
        self.n, self.max_len = 0, max_len  # filled cache slots; the most there will be
        self.B, self.rows = batch, None  # rows: the batch rows the cache still holds (None: all, in order)
        self.add_BL = None

    def _reserve(self, n: int) -> None:
        grow_caches(self.layers, self.n, n, self.max_len, seq_dim=2)

    def set_padding(self, pad_BL: torch.Tensor) -> None:
        """The rows' padding over every cache slot (True = a real token): single-token steps then add a
        precomputed ``-inf`` mask instead of converting a boolean one per layer."""
        self.add_BL = torch.zeros(pad_BL.shape, dtype=self.embed.dtype, device=pad_BL.device).masked_fill_(
            ~pad_BL, float("-inf"))

    def drop_rows(self, live_B: torch.Tensor, below: float = 0.75) -> None:
        """Stop computing the rows where ``live_B`` is False once fewer than ``below`` of the rows computed so
        far are live (the cache is compacted then, not per step). Their logits are zeros from then on:
        the caller must not use them (the engine replaces a finished row's tokens by padding)."""
        drop_rows(self, live_B, below, batch_dim=0)

    def forward(self, ids_BQ: torch.Tensor, pos_BQ: torch.Tensor, mask: torch.Tensor, keep: int,
                expand: torch.Tensor | None = None) -> torch.Tensor:
        """Logits ``(B, keep, V)``; see the class docstring. ``expand`` (first call only): ``ids_BQ`` are
        the distinct prompts and row ``i`` of the batch is prompt ``expand[i]`` (read once, cached per row)."""
        ids_BQ, pos_BQ, mask = live_inputs(self.rows, ids_BQ, pos_BQ, mask)
        B, Q = ids_BQ.shape
        H, Hkv, D = self.H, self.Hkv, self.D
        a, b = self.n, self.n + Q
        if expand is not None and a:
            raise ValueError("expand applies to the first forward (the prompts) only")
        self._reserve(b)
        grouped = Q == 1 and H != Hkv and self.add_BL is not None and expand is None  # add_BL has a row per row
        if grouped:  # one query per head: the heads sharing a KV head become queries of that head
            mask = self.add_BL[:, None, None, :b]
        cos, sin = self.cos[pos_BQ][:, None], self.sin[pos_BQ][:, None]  # (B, 1, Q, D)
        x = F.embedding(ids_BQ, self.embed)
        for L in self.layers:
            qkv = F.linear(rms_norm(x, L.ln1, self.eps), L.qkv).view(B, Q, H + 2 * Hkv, D)
            qk = rope(rms_norm(qkv[:, :, :H + Hkv], L.qkn, self.eps).transpose(1, 2), cos, sin)  # q and k heads at once
            q, k = qk[:, :H], qk[:, H:]
            v = qkv[:, :, H + Hkv:].transpose(1, 2)
            L.k[:, :, a:b] = k if expand is None else k[expand]
            L.v[:, :, a:b] = v if expand is None else v[expand]
            if a:
                k, v = L.k[:, :, :b], L.v[:, :, :b]
            if grouped:
                att = F.scaled_dot_product_attention(q.reshape(B, Hkv, H // Hkv, D), k, v, attn_mask=mask,
                                                     scale=self.scale).reshape(B, Q, H * D)
            else:
                att = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=self.scale, enable_gqa=H != Hkv)
                att = att.transpose(1, 2).reshape(B, Q, H * D)
            x = x + F.linear(att, L.o)
            g, u = F.linear(rms_norm(x, L.ln2, self.eps), L.gu).chunk(2, -1)
            x = x + F.linear(F.silu(g) * u, L.down)
        self.n = b
        x = x[:, Q - keep:]
        logits = F.linear(rms_norm(x if expand is None else x[expand], self.norm, self.eps), self.head)
        return all_rows(logits, self.rows, self.B, dim=0)


def rms_norm(x: torch.Tensor, w: torch.Tensor | None, eps) -> torch.Tensor:
    """Qwen3's RMSNorm in float32 (``eps`` a number or a tensor that broadcasts), back in ``x``'s dtype;
    ``w`` None: without the weight (folded into the matrix that reads the output)."""
    xf = x.float()
    xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
    return xf.to(x.dtype) if w is None else w * xf.to(x.dtype)


def rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotary embedding with the halves rotated (transformers' ``rotate_half``)."""
    h = x.shape[-1] // 2
    return x * cos + torch.cat([-x[..., h:], x[..., :h]], -1) * sin


def grow_caches(layers, filled: int, need: int, max_len: int, *, seq_dim: int) -> None:
    """Room for ``need`` slots in every layer's ``k`` / ``v`` (slots on ``seq_dim``): a full cache grows by half
    its size (at least 64, at most ``max_len``), the ``filled`` slots copied over."""
    cap = layers[0].k.shape[seq_dim]
    if need <= cap:
        return
    new = max(need, min(max_len, cap + max(cap // 2, 64)))
    for L in layers:
        for name in ("k", "v"):
            old = getattr(L, name)
            shape = list(old.shape)
            shape[seq_dim] = new
            buf = old.new_empty(shape)
            buf.narrow(seq_dim, 0, filled).copy_(old.narrow(seq_dim, 0, filled))
            setattr(L, name, buf)


def drop_rows(dec, live_B: torch.Tensor, below: float, *, batch_dim: int) -> None:
    """:meth:`LeanQwen3.drop_rows` of a decoder ``dec`` (its ``rows``, ``B``, ``layers`` with caches holding the
    batch on ``batch_dim``, ``add_BL``): once fewer than ``below`` of the rows computed so far are live (and
    some are), keep only the live ones."""
    rows = dec.rows if dec.rows is not None else torch.arange(dec.B, device=live_B.device)
    keep = live_B[rows].nonzero().squeeze(-1)
    if keep.numel() == 0 or keep.numel() >= below * rows.numel():
        return
    dec.rows = rows[keep]
    for L in dec.layers:
        L.k, L.v = L.k.index_select(batch_dim, keep), L.v.index_select(batch_dim, keep)
    if dec.add_BL is not None:
        dec.add_BL = dec.add_BL[keep]


def live_inputs(rows, ids_BQ: torch.Tensor, pos_BQ: torch.Tensor, mask: torch.Tensor):
    """The rows still computed (``rows``; None: all) of a forward's full-batch inputs; a mask that broadcasts
    over the batch is kept as it is."""
    if rows is None:
        return ids_BQ, pos_BQ, mask
    return ids_BQ[rows], pos_BQ[rows], mask[rows] if mask.shape[0] == ids_BQ.shape[0] else mask


def all_rows(logits: torch.Tensor, rows, full: int, *, dim: int) -> torch.Tensor:
    """``logits`` of the computed ``rows`` (on ``dim``) back in a batch of ``full`` rows, zeros for the dropped
    ones; as it is when every row was computed (``rows`` None)."""
    if rows is None:
        return logits
    shape = list(logits.shape)
    shape[dim] = full
    out = logits.new_zeros(shape)
    out.index_copy_(dim, rows, logits)
    return out

