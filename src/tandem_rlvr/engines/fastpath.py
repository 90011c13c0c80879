"""CPU fast paths of the rollout engine, measured in benchmarks/ (see the README there).

- :func:`gqa_attention`: grouped-query attention inside SDPA without transformers' ``repeat_kv``
  copies of every key and value (which made long rollouts quadratic on CPU);
- a preallocated per-model KV cache (:class:`_BufferLayer`) written in place instead of concatenated
  every token, so memory does not grow with the number of handoffs;
- switching a peft adapter off with a flag on a precomputed list of LoRA layers instead of peft's
  ``disable_adapter()`` context (about 5 ms a call).

``FAST_PATH = False`` falls back to plain transformers behaviour; the fast paths are only enabled on
``FAST_PATH_DEVICES`` (CPU: not yet checked on GPUs). Each switch below can also be turned off for a
process by naming it in the environment: ``TANDEM_RLVR_FASTPATH_OFF=SHARED_PROMPTS_UPDATE,PAIR``.
"""

from __future__ import annotations

import contextlib
import os

import torch
from transformers import DynamicCache
from transformers.cache_utils import DynamicLayer

FAST_PATH = True  # preallocated KV caches, 4-D mask slices, GQA-in-SDPA
LEAN = True  # decode plain Qwen3s with engines.lean_qwen3 (no transformers dispatch per layer); False: transformers
SHARED_PROMPTS = True  # no-grad teacher-forced scoring reads each distinct prompt once (engines.scoring)
SHARED_PROMPTS_UPDATE = True  # one process: the update reads each distinct prompt of a mini-batch once (engines.scoring)
PAIR = True  # lockstep: both lean decoders as one batched model per token (engines.lean_pair)
TRIM = True  # teacher-forced forwards stop at their rows' longest response (engines.scoring); False: the batch's width
# one process, no KL term, any device: the update leaves out rows whose advantage is 0 (training.core.rows_with_gradient)
SKIP_ZERO_ADVANTAGE = True
FAST_PATH_DEVICES = ("cpu",)  # measured and tested on CPU only so far; add "cuda" once checked there
SWITCHES = ("FAST_PATH", "LEAN", "SHARED_PROMPTS", "SHARED_PROMPTS_UPDATE", "PAIR", "TRIM", "SKIP_ZERO_ADVANTAGE")
OFF_ENV = "TANDEM_RLVR_FASTPATH_OFF"


def switches_off_from_env(environ=os.environ) -> list[str]:
    """Turn off the switches named in ``$TANDEM_RLVR_FASTPATH_OFF`` (comma-separated); returns their names.
    An unknown name is an error that lists the known ones (a typo must not leave a fast path on)."""
    names = [n.strip() for n in environ.get(OFF_ENV, "").split(",") if n.strip()]
    unknown = [n for n in names if n not in SWITCHES]
    if unknown:
        raise ValueError(f"{OFF_ENV}: unknown fast-path switch(es) {', '.join(unknown)}; known: {', '.join(SWITCHES)}")
    for n in names:
        globals()[n] = False
    return names


switches_off_from_env()


_FAST_ATTN = "tandem_rlvr_sdpa_gqa"
_DECODE_GROUPED = True  # decode steps: grouped queries against the shared KV head (faster; ~1e-7 off sdpa)
_fast_attn_registered = False


def _register_fast_attention() -> None:
    """Register an SDPA attention that never copies keys and values for grouped-query attention.

    transformers' ``sdpa`` calls ``repeat_kv`` (a full copy of the cached keys and values, per layer
    and token) whenever a mask is given, because CUDA kernels fall back to math with GQA + mask. The
    CPU kernel takes GQA + mask natively (``enable_gqa``; bit-identical to ``repeat_kv``), so on CPU
    we use this one. Single-token decode steps (no autograd) go further: the ``g`` query heads that
    share a KV head are run as ``g`` queries of that head (one SDPA over ``Hkv`` heads, an additive
    mask), ~1.1-1.5x faster at long contexts and equal to ``sdpa`` within ~1e-7.
    """
    global _fast_attn_registered
    if _fast_attn_registered:
        return
    from transformers import AttentionInterface
    from transformers.integrations.sdpa_attention import sdpa_attention_forward
    from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

    def attention(module, query, key, value, attention_mask, dropout=0.0, scaling=None, is_causal=None, **kwargs):
        if attention_mask is None or kwargs.get("position_bias") is not None:
            return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout,
                                          scaling=scaling, is_causal=is_causal, **kwargs)
        groups = getattr(module, "num_key_value_groups", 1)
        B, H, q_len, D = query.shape
        if _DECODE_GROUPED and groups > 1 and q_len == 1 and not torch.is_grad_enabled():
            # one query per head: the g heads sharing a KV head become g queries of one head
            mask = attention_mask
            if mask.dtype == torch.bool:
                mask = torch.zeros(mask.shape, dtype=query.dtype, device=mask.device).masked_fill_(
                    ~mask, torch.finfo(query.dtype).min)
            out = torch.nn.functional.scaled_dot_product_attention(
                query.reshape(B, H // groups, groups, D), key, value, attn_mask=mask, dropout_p=dropout, scale=scaling)
            return out.reshape(B, 1, H, D), None
        out = torch.nn.functional.scaled_dot_product_attention(
            query, key, value, attn_mask=attention_mask, dropout_p=dropout, scale=scaling, enable_gqa=groups > 1)
        return out.transpose(1, 2).contiguous(), None

    AttentionInterface.register(_FAST_ATTN, attention)
    AttentionMaskInterface.register(_FAST_ATTN, sdpa_mask)
    _fast_attn_registered = True


def fast_ok(model) -> bool:
    """Whether ``model`` can take the fast path: a decoder with sdpa and full attention in every layer."""
    cfg = getattr(model, "config", None)
    if not FAST_PATH or cfg is None or getattr(cfg, "is_encoder_decoder", False):
        return False
    if getattr(cfg, "_attn_implementation", None) not in ("sdpa", _FAST_ATTN):
        return False
    text = cfg.get_text_config(decoder=True) if hasattr(cfg, "get_text_config") else cfg
    types = getattr(text, "layer_types", None)
    if types is not None and any(t != "full_attention" for t in types):
        return False
    return not (getattr(text, "use_sliding_window", False) and getattr(text, "sliding_window", None))


def _dispatches_attention(model) -> bool:
    """Whether ``model``'s attention looks its function up by ``config._attn_implementation`` (transformers'
    ``_supports_attention_backend``), so that a renamed one is called. A model without it (Falcon) compares the
    name to ``"sdpa"`` itself: renamed, it would take its eager branch and add SDPA's boolean mask to the
    scores (future and padding positions left visible)."""
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    return bool(getattr(base, "_supports_attention_backend", False))


@contextlib.contextmanager
def gqa_attention(*models):
    """Within the block, run the grouped-query attention of these models inside SDPA on CPU.

    transformers' ``sdpa`` copies every key and value ``num_key_value_groups`` times (``repeat_kv``)
    whenever a padding mask is given; this passes ``enable_gqa`` to the kernel instead. Forward
    outputs are bit-identical, gradients equal to float rounding. Models that are not plain
    full-attention ``sdpa`` decoders, or not on CPU, are left alone. Also useful around training
    forwards and backwards (left-padded batches). Re-entrant.
    """
    configs = []
    for m in models:
        cfg = getattr(m, "config", None)
        if cfg is None or getattr(cfg, "_attn_implementation", None) != "sdpa" or not fast_ok(m):
            continue
        if not _dispatches_attention(m):
            continue
        try:
            device = next(iter(m.parameters())).device
        except StopIteration:
            continue
        if device.type == "cpu" and all(cfg is not c for c in configs):
            configs.append(cfg)
    if configs:
        _register_fast_attention()
    try:
        for cfg in configs:
            cfg._attn_implementation = _FAST_ATTN
        yield
    finally:
        for cfg in configs:
            cfg._attn_implementation = "sdpa"


class _BufferLayer(DynamicLayer):
    """A KV cache layer written in place into a preallocated buffer (grown rarely, by half).

    ``torch.cat`` in transformers' ``DynamicLayer`` copies the whole cache at every token; here a
    token costs a copy of its own keys and values, and attention reads a view of the filled part.
    """

    def __init__(self, capacity: int, max_len: int):
        super().__init__()
        self.capacity, self.max_len, self.n = capacity, max_len, 0
        self._k = self._v = None

    def lazy_initialization(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        self.dtype, self.device = key_states.dtype, key_states.device
        self._k = self._alloc(key_states, max(self.capacity, key_states.shape[-2]))
        self._v = self._alloc(value_states, self._k.shape[-2])
        self.is_initialized = True

    @staticmethod
    def _alloc(like: torch.Tensor, n: int) -> torch.Tensor:
        return like.new_empty(*like.shape[:-2], n, like.shape[-1])

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs):
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        n, m = self.n, key_states.shape[-2]
        if n + m > self._k.shape[-2]:
            cap = self._k.shape[-2]
            new = max(n + m, min(self.max_len, cap + max(cap // 2, 64)))
            for name in ("_k", "_v"):
                old = getattr(self, name)
                buf = self._alloc(old, new)
                buf[..., :n, :] = old[..., :n, :]
                setattr(self, name, buf)
        self._k[..., n:n + m, :] = key_states
        self._v[..., n:n + m, :] = value_states
        self.n = n + m
        self.keys, self.values = self._k[..., :self.n, :], self._v[..., :self.n, :]
        return self.keys, self.values

    def get_seq_length(self) -> int:
        return self.n

    def crop(self, tokens_to_remove: int) -> None:
        if tokens_to_remove < 0:
            self.n = max(self.n + tokens_to_remove, 0)
        elif tokens_to_remove < self.n:
            self.n = tokens_to_remove
        if self.is_initialized:
            self.keys, self.values = self._k[..., :self.n, :], self._v[..., :self.n, :]

    def reset(self) -> None:
        self.n = 0
        self._k = self._v = None
        super().reset()


def adapter_off_call(model):
    """A cheap forward for ``models.AdapterOff`` (a peft LoRA model seen with its adapter disabled).

    ``peft_model.disable_adapter()`` scans every module twice and toggles ``requires_grad`` per call
    (~5 ms, as much as a small model's forward, paid at every junior step). Here the LoRA layers are
    listed once and their ``disable_adapters`` flag is flipped around the forward (no gradients are
    taken in the engine). Returns None (use the model as given) for anything else.
    """
    peft_model = getattr(model, "peft_model", None)
    if peft_model is None or type(model).__name__ != "AdapterOff":
        return None
    try:
        from peft.tuners.tuners_utils import BaseTunerLayer
        from peft.utils.other import AuxiliaryTrainingWrapper

        pcfg = peft_model.active_peft_config
        if getattr(pcfg, "is_prompt_learning", False) or getattr(pcfg, "is_adaption_prompt", False):
            return None
        layers = []
        for m in peft_model.modules():
            if isinstance(m, AuxiliaryTrainingWrapper):
                return None
            if isinstance(m, BaseTunerLayer):
                if not isinstance(getattr(m, "_disable_adapters", None), bool):
                    return None
                layers.append(m)
    except Exception:  # noqa: BLE001 -- an unknown peft layout: keep peft's own context manager
        return None
    if not layers:
        return None

    def call(**kwargs):
        prev = [layer._disable_adapters for layer in layers]
        was_disabled = getattr(peft_model, "_adapters_disabled", False)
        for layer in layers:
            layer._disable_adapters = True
        peft_model._adapters_disabled = True
        try:
            return peft_model(**kwargs)
        finally:
            for layer, was in zip(layers, prev):
                layer._disable_adapters = was
            peft_model._adapters_disabled = was_disabled

    return call


def buffer_cache(capacity: int, max_len: int) -> DynamicCache:
    cache = DynamicCache()
    cache.layer_class_to_replicate = lambda: _BufferLayer(capacity, max_len)
    return cache


