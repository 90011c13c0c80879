"""Two lean Qwen3 decoders advanced as one (the lockstep rollout's senior and junior, CPU fast path).

In lockstep both models read the same token at every step, so their forwards have the same shapes: this
module stacks the two :class:`~tandem_rlvr.engines.lean_qwen3.LeanQwen3` objects after their prompts are
read (weights and KV caches on a leading axis of 2) and runs each layer's projections as one batched
matmul and its attention as one SDPA over both caches: half the kernel calls per token, the same
function. A model with a narrower MLP is zero-padded to the wider one (a zero gate and up row give
``silu(0) * 0 = 0``; a zero ``down`` column adds nothing), so each model's logits are its own, up to
floating-point order. :func:`fits` says when two decoders can be paired (same width, heads, head size,
depth, vocabulary, dtype, device and batch); otherwise the engine runs them one after the other.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from tandem_rlvr.engines.lean_qwen3 import LeanQwen3, all_rows, drop_rows, grow_caches, live_inputs, rms_norm, rope

__all__ = ["LeanPair", "fits"]


def fits(a: LeanQwen3, b: LeanQwen3) -> bool:
    """Whether ``a`` and ``b`` can run as one :class:`LeanPair` (same shapes everywhere but the MLP width,
    both with every row and the same number of cache slots filled)."""
    same = (a.H, a.Hkv, a.D, len(a.layers), a.B, a.n, a.max_len) == (b.H, b.Hkv, b.D, len(b.layers), b.B, b.n, b.max_len)
    return (same and a.embed.shape == b.embed.shape and a.head.shape == b.head.shape
            and a.embed.dtype == b.embed.dtype and a.embed.device == b.embed.device
            and a.rows is None and b.rows is None and a.add_BL is not None and b.add_BL is not None
            and a.layers[0].k.shape == b.layers[0].k.shape and a.scale == b.scale)


def _pad_rows(w: torch.Tensor, n: int) -> torch.Tensor:
    return F.pad(w, (0, 0, 0, n - w.shape[0]))


class _Layer2:
    __slots__ = ("ln1", "qkv", "qkn", "o", "ln2", "gu", "down", "k", "v")


class LeanPair:
    """``a`` and ``b`` (:func:`fits`) from here on as one: :meth:`forward` returns both models' logits
    ``(2, B, keep, V)``. Takes over their KV caches (the two objects must not be used afterwards)."""

    def __init__(self, a: LeanQwen3, b: LeanQwen3):
        self.H, self.Hkv, self.D, self.scale, self.B = a.H, a.Hkv, a.D, a.scale, a.B
        self.n, self.max_len, self.rows = a.n, a.max_len, None
        dev, dtype = a.embed.device, a.embed.dtype
        self.eps = torch.tensor([a.eps, b.eps], dtype=torch.float32, device=dev).view(2, 1, 1, 1)
        self.embed = torch.stack([a.embed, b.embed])
        self.norm = torch.stack([a.norm, b.norm]).view(2, 1, 1, -1)
        self.head_T = torch.stack([a.head.T, b.head.T])  # (2, hidden, V)
        self.cos, self.sin = torch.stack([a.cos, b.cos]), torch.stack([a.sin, b.sin])
        self.add_BL = a.add_BL
        self.layers = [self._layer(la, lb) for la, lb in zip(a.layers, b.layers)]
        for L in (*a.layers, *b.layers):  # the caches live here now
            L.k = L.v = None
        self.dtype = dtype

    @staticmethod
    def _layer(la, lb) -> _Layer2:
        L = _Layer2()  # in float32 the layers' RMSNorm weights come folded into qkv and gu (LeanQwen3)
        L.ln1 = None if la.ln1 is None else torch.stack([la.ln1, lb.ln1]).view(2, 1, 1, -1)
        L.ln2 = None if la.ln2 is None else torch.stack([la.ln2, lb.ln2]).view(2, 1, 1, -1)
        L.qkv = torch.stack([la.qkv.T, lb.qkv.T])
        L.qkn = torch.stack([la.qkn, lb.qkn]).view(2, 1, 1, *la.qkn.shape)
        L.o = torch.stack([la.o.T, lb.o.T])
        width = max(la.down.shape[1], lb.down.shape[1])

        def gate_up(gu):
            g, u = gu.chunk(2, 0)
            return torch.cat([_pad_rows(g, width), _pad_rows(u, width)]).T
        L.gu = torch.stack([gate_up(la.gu), gate_up(lb.gu)])
        L.down = torch.stack([_pad_rows(la.down.T, width), _pad_rows(lb.down.T, width)])
        L.k, L.v = torch.stack([la.k, lb.k]), torch.stack([la.v, lb.v])
        return L

    def _reserve(self, n: int) -> None:
        grow_caches(self.layers, self.n, n, self.max_len, seq_dim=3)

    def drop_rows(self, live_B: torch.Tensor, below: float = 0.75) -> None:
        """As :meth:`LeanQwen3.drop_rows`, for both models at once."""
        drop_rows(self, live_B, below, batch_dim=1)

    def forward(self, ids_BQ: torch.Tensor, pos_BQ: torch.Tensor, mask: torch.Tensor, keep: int) -> torch.Tensor:
        """Both models' logits ``(2, B, keep, V)`` of the last ``keep`` of the ``Q`` new tokens; ``mask`` as
        :meth:`LeanQwen3.forward`'s (the same for both: they read the same padded history)."""
        ids_BQ, pos_BQ, mask = live_inputs(self.rows, ids_BQ, pos_BQ, mask)
        B, Q = ids_BQ.shape
        H, Hkv, D = self.H, self.Hkv, self.D
        a, b = self.n, self.n + Q
        self._reserve(b)
        grouped = Q == 1 and H != Hkv
        if grouped:
            mask = self.add_BL[:, None, None, :b]
        mask2 = torch.cat([mask, mask]) if mask.shape[0] == B else mask
        cos, sin = self.cos[:, pos_BQ][:, :, None], self.sin[:, pos_BQ][:, :, None]  # (2, B, 1, Q, D)
        x = self.embed[:, ids_BQ]  # (2, B, Q, hidden)
        for L in self.layers:
            x = self._block(L, x, cos, sin, mask2, a, b, grouped)
        self.n = b
        x = rms_norm(x[:, :, Q - keep:], self.norm, self.eps)
        logits = torch.matmul(x.reshape(2, B * keep, -1), self.head_T).view(2, B, keep, -1)
        return all_rows(logits, self.rows, self.B, dim=1)

    def _block(self, L: _Layer2, x, cos, sin, mask2, a: int, b: int, grouped: bool) -> torch.Tensor:
        _, B, Q, h = x.shape
        H, Hkv, D = self.H, self.Hkv, self.D
        qkv = torch.matmul(rms_norm(x, L.ln1, self.eps).reshape(2, B * Q, h), L.qkv).view(2, B, Q, H + 2 * Hkv, D)
        eps5 = self.eps.view(2, 1, 1, 1, 1)
        qk = rope(rms_norm(qkv[:, :, :, :H + Hkv], L.qkn, eps5).transpose(2, 3), cos, sin)  # q and k heads at once
        q, k = qk[:, :, :H], qk[:, :, H:]
        v = qkv[:, :, :, H + Hkv:].transpose(2, 3)
        L.k[:, :, :, a:b], L.v[:, :, :, a:b] = k, v
        kc, vc = L.k[:, :, :, :b].reshape(2 * B, Hkv, b, D), L.v[:, :, :, :b].reshape(2 * B, Hkv, b, D)
        if grouped:
            att = F.scaled_dot_product_attention(q.reshape(2 * B, Hkv, H // Hkv, D), kc, vc, attn_mask=mask2,
                                                 scale=self.scale).reshape(2, B * Q, H * D)
        else:
            att = F.scaled_dot_product_attention(q.reshape(2 * B, H, Q, D), kc, vc, attn_mask=mask2, scale=self.scale,
                                                 enable_gqa=H != Hkv)
            att = att.view(2, B, H, Q, D).transpose(2, 3).reshape(2, B * Q, H * D)
        x = x + torch.matmul(att, L.o).view(2, B, Q, h)
        g, u = torch.matmul(rms_norm(x, L.ln2, self.eps).reshape(2, B * Q, h), L.gu).chunk(2, -1)
        return x + torch.matmul(F.silu(g) * u, L.down).view(2, B, Q, h)

