"""The rollout engine: batched co-generation by a senior and a junior with ownership records.

Both models read the same growing token history. Each keeps its own KV cache, the current author's
distribution is sampled, and ``owner_BT`` records 1 where the senior wrote the token and 0 where the
junior did. The history is never re-encoded at a switch. Two ways to keep the models in step
(``generate(..., mode=...)``; docs/engines.md "The in-process engine"), which give the same tokens, owners and
log-probs for the same seed:

- ``lockstep`` (default): at every step both models take the newest token. One senior and one junior
  forward per token, exactly a senior solo plus a junior solo rollout.
- ``catchup``: a model only runs at steps where it writes for some live row; it then reads all the
  tokens it has not seen yet in one forward (and scores them on the way, so the junior's log-prob of
  every token is still recorded). Fewer, larger forwards: it wins when some model sits out whole
  steps (small batches, long turns, a junior that only records), not with word turns on a big batch.

With schedule ``none`` and ``record_junior=False`` the junior is not run at all.

Sampling uses its own generator and the schedule's coins another, so a p = 1 tandem rollout samples
token-for-token what a solo rollout with the same seed samples.

Speed: on the devices in ``FAST_PATH_DEVICES`` (CPU) each model's KV cache is a preallocated buffer, the
mask a slice of one preallocated mask, grouped-query attention runs inside SDPA, plain Qwen3s decode with
:mod:`tandem_rlvr.engines.lean_qwen3` (both models as one in lockstep: :mod:`tandem_rlvr.engines.lean_pair`);
other models take a generic path. Why each exists and how it is tested: docs/engines.md, "The in-process
engine" and "The CPU fast path for small Qwen3s".
"""

from __future__ import annotations

import contextlib
from collections.abc import Sequence

import torch
from transformers import DynamicCache

from tandem_rlvr.engines import fastpath, lean_pair, lean_qwen3
from tandem_rlvr.engines.lean_pair import LeanPair
from tandem_rlvr.engines.lean_qwen3 import LeanQwen3
from tandem_rlvr.engines.fastpath import adapter_off_call, buffer_cache, gqa_attention
from tandem_rlvr.engines.handoff import Schedule, over_rounds
from tandem_rlvr.engines.serving import MODES
from tandem_rlvr.engines.types import Rollout, Sampling, decision_record, logp_of, sample_tokens

__all__ = ["MODES", "generate", "gqa_attention"]
LOGITS_BUDGET = 1 << 26  # max elements of one catch-up forward's (B, w, V) logits; longer windows are chunked


# ------------------------------------------------------------------------------------------------
# Fast path: preallocated KV cache, 4-D mask slices, grouped-query attention inside SDPA
# ------------------------------------------------------------------------------------------------

class _Decoder:
    """One model's decoding state over the shared history: its KV cache and how far it has read.

    ``seen`` response tokens are in the cache; ``logits_BV`` predicts response column ``seen``.
    :meth:`sync` reads columns ``[seen, upto)`` in one forward and records this model's log-probs of
    the tokens it now predicts; :meth:`record` the log-prob of a just-sampled column ``seen``.
    """

    def __init__(self, model, prompt_ids_BP, prompt_mask_BP, *, n_new: int, pad_BL: torch.Tensor,
                 temperature: float, fast: bool):
        self.model, self.fast, self.temperature = model, fast, temperature
        self.call = adapter_off_call(model) or model
        B, P = prompt_ids_BP.shape
        self.P, self.pad_BL = P, pad_BL
        device = prompt_ids_BP.device
        if fast:
            self.cache = buffer_cache(P + min(n_new, 256), P + n_new)
            self.mask4 = pad_BL[:, None, None, :]  # bool, True = attend
            self.cols = torch.arange(P + n_new, device=device)
        else:
            cfg = getattr(model, "config", None)
            self.cache = DynamicCache(config=cfg) if cfg is not None else DynamicCache()
        lean_ok = fast and fastpath.LEAN and self.call is model and lean_qwen3.supports(model)
        self.lean = LeanQwen3(model, B, P + n_new, P + min(n_new, 256)) if lean_ok else None
        self.plen_B1 = prompt_mask_BP.long().sum(-1, keepdim=True)
        self.steps = torch.arange(n_new, device=device)
        pos = (prompt_mask_BP.long().cumsum(-1) - 1).clamp(min=0)
        if self.lean is not None:
            self.logits_BV = self._lean_prefill(prompt_ids_BP, prompt_mask_BP, pos, pad_BL)
        else:
            self.logits_BV = self._forward(prompt_ids_BP, prompt_mask_BP, pos, 1)[:, -1, :]
        self.seen = 0
        self.logps_BT = torch.zeros(B, n_new, device=device)

    def _lean_prefill(self, ids_BP, mask_BP, pos_BP, pad_BL) -> torch.Tensor:
        """Read the prompts with the lean model, each distinct prompt once (a GRPO batch holds every prompt
        ``group_size`` times); a padding position attends to itself (no empty softmax row)."""
        self.lean.set_padding(pad_BL)
        P = ids_BP.shape[1]
        uniq, inv = torch.unique(torch.cat([ids_BP, mask_BP.long()], -1), dim=0, return_inverse=True)
        ids_UP, real_UP = uniq[:, :P], uniq[:, P:].bool()
        cols = torch.arange(P, device=ids_BP.device)
        mask = (real_UP[:, None, None, :] & (cols[None, :] <= cols[:, None])) | (cols[None, :] == cols[:, None])
        pos_UP = (real_UP.long().cumsum(-1) - 1).clamp(min=0)
        return self.lean.forward(ids_UP, pos_UP, mask, 1, expand=inv)[:, -1, :]

    def _forward(self, ids, mask, pos, keep: int) -> torch.Tensor:
        if self.lean is not None:
            return self.lean.forward(ids, pos, mask, keep)
        out = self.call(input_ids=ids, attention_mask=mask, position_ids=pos,
                        past_key_values=self.cache, use_cache=True, logits_to_keep=keep)
        self.cache = out.past_key_values
        return out.logits

    def _mask(self, a: int, b: int):
        n = self.P + b
        if not self.fast:
            return self.pad_BL[:, :n].long()
        m = self.mask4[..., :n]
        if b - a > 1:  # several queries: causal inside the window
            q = self.P + a + self.steps[:b - a]
            m = m & (self.cols[None, :n] <= q[:, None])[None, None]
        return m

    def sync(self, ids_BT: torch.Tensor, upto: int, known: int) -> None:
        """Read response columns ``[seen, upto)``; ``known``: columns ``< known`` hold sampled tokens."""
        B, V = ids_BT.shape[0], self.logits_BV.shape[-1]
        chunk = max(1, LOGITS_BUDGET // max(1, B * V))
        while self.seen < upto:
            a = self.seen
            b = min(upto, a + chunk)
            logits = self._forward(ids_BT[:, a:b], self._mask(a, b), self.plen_B1 + self.steps[a:b], b - a)
            k = min(b - a, known - 1 - a)  # logits[:, i] predicts column a + 1 + i
            if k > 0:
                self.logps_BT[:, a + 1:a + 1 + k] = logp_of(logits[:, :k], ids_BT[:, a + 1:a + 1 + k], self.temperature)
            self.logits_BV, self.seen = logits[:, -1, :], b

    def live(self, t: int, live_B: torch.Tensor) -> None:
        """After step ``t``: rows still being written. The lean model stops computing finished rows once
        this model has read every column before ``t`` (and recorded ``t``): a model that sat out steps
        (catch-up) still has to score what those rows wrote before they finished."""
        if self.lean is not None and self.seen >= t:
            self.lean.drop_rows(live_B)

    def record(self, t: int, tok_B: torch.Tensor) -> None:
        if self.seen == t:
            self.logps_BT[:, t] = logp_of(self.logits_BV, tok_B, self.temperature)


def _pair(decs: list[_Decoder]) -> LeanPair | None:
    """Both decoders as one :class:`LeanPair` where both decode with the lean model and :func:`lean_pair.fits`
    (``fastpath.PAIR``); else None (they run one after the other)."""
    if not fastpath.PAIR or len(decs) != 2 or any(d.lean is None for d in decs):
        return None
    a, b = decs[0].lean, decs[1].lean
    return LeanPair(a, b) if lean_pair.fits(a, b) else None


def _check_vocab(senior, junior, table_size: int | None) -> None:
    vs = senior.get_output_embeddings().weight.shape[0]
    if junior is not None:
        vj = junior.get_output_embeddings().weight.shape[0]
        if vj != vs:
            raise ValueError(f"senior and junior output vocabularies differ ({vs} vs {vj} rows)")
    if table_size is not None and table_size < vs:
        raise ValueError(f"handoff token table covers {table_size} ids but the model has {vs} rows")


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
    mode: str = "lockstep",
    junior_eos_token_ids: Sequence[int] | None = None,
    hold_casts: bool = False,
) -> Rollout:
    """Co-generate responses to left-padded prompts; see the module docstring.

    A token ends its row where it is an EOS of the model that wrote it: ``eos_token_ids`` the senior's,
    ``junior_eos_token_ids`` the junior's (default: the senior's; a base model and an instruct model of one
    vocabulary end on different tokens). ``max_rounds`` ends a sequence once it would start turn ``max_rounds + 1``. ``record_junior``
    runs the junior even when it never writes, to record its log-probs. ``mode``: ``"lockstep"``
    or ``"catchup"`` (same result, different forward pattern; see the module docstring). ``hold_casts``: the
    models' forwards autocast float32 weights (mixed precision); autocast then casts each weight once for the whole
    rollout, not at every token (its cast cache lives only outside inference mode and within an autocast region,
    here a disabled one, so the steps between forwards keep full precision). It holds a bf16 copy of the weights
    that require grad while the rollout runs.
    """
    if mode not in MODES:
        raise ValueError(f"unknown rollout mode {mode!r}; choose one of {', '.join(MODES)}")
    if schedule.uses_junior and junior is None:
        raise ValueError(f"handoff schedule {schedule.name!r} (p={schedule.p}) needs a junior model")
    run_junior = junior is not None and (schedule.uses_junior or record_junior)
    _check_vocab(senior, junior if run_junior else None, schedule.table.vocab_size if schedule.table else None)
    device = prompt_ids_BP.device
    models = [senior] + ([junior] if run_junior else [])
    fast = [device.type in fastpath.FAST_PATH_DEVICES and fastpath.fast_ok(m) for m in models]
    P, n_new = prompt_ids_BP.shape[1], sampling.max_new_tokens
    pad_BL = torch.ones(prompt_ids_BP.shape[0], P + n_new, dtype=torch.bool, device=device)
    pad_BL[:, :P] = prompt_mask_BP.bool()
    with _decode_mode(hold_casts, device.type), gqa_attention(*[m for m, f in zip(models, fast) if f]):
        decs = [_Decoder(m, prompt_ids_BP, prompt_mask_BP, n_new=n_new, pad_BL=pad_BL,
                         temperature=sampling.temperature, fast=f) for m, f in zip(models, fast)]
        run = _CoWrite(decs, schedule, sampling, seed=seed, eos_token_ids=eos_token_ids, pad_token_id=pad_token_id,
                       max_rounds=max_rounds, lockstep=mode == "lockstep", device=device,
                       junior_eos_token_ids=junior_eos_token_ids)
        run.run()
        return run.rollout(prompt_ids_BP, prompt_mask_BP)


def _decode_mode(hold_casts: bool, device_type: str):
    """Inference mode; or, to hold autocast's weight casts (:func:`generate`), no_grad in a disabled autocast region
    (the cache lives only outside inference mode, until the outermost autocast region ends)."""
    if not hold_casts:
        return torch.inference_mode()
    stack = contextlib.ExitStack()
    stack.enter_context(torch.no_grad())
    stack.enter_context(torch.autocast(device_type, enabled=False))
    return stack


class _CoWrite:
    """The decoding loop of :func:`generate`: buffers, the schedule's state and one step per token."""

    def __init__(self, decs: list[_Decoder], schedule: Schedule, sampling: Sampling, *, seed: int, eos_token_ids,
                 pad_token_id: int, max_rounds: int | None, lockstep: bool, device, junior_eos_token_ids=None):
        self.decs, self.schedule, self.sampling = decs, schedule, sampling
        self.s_dec, self.j_dec = decs[0], (decs[1] if len(decs) > 1 else None)
        self.max_rounds, self.lockstep, self.device = max_rounds, lockstep, device
        B, n_new = decs[0].logps_BT.shape
        self.gen_tok = torch.Generator().manual_seed(int(seed))
        self.coins = schedule.coins(B, seed)
        self.state = schedule.start(self.coins)
        self.eos = torch.tensor(sorted({int(e) for e in eos_token_ids}), dtype=torch.long, device=device)
        j_eos = sorted({int(e) for e in junior_eos_token_ids}) if junior_eos_token_ids is not None else None
        self.eos_j = None if j_eos is None or j_eos == self.eos.tolist() else torch.tensor(j_eos, device=device)
        self.ids = torch.full((B, n_new), pad_token_id, dtype=torch.long, device=device)
        self.owner = torch.zeros(B, n_new, dtype=torch.long, device=device)
        self.turn = torch.full_like(self.ids, -1)  # the schedule's decisions (Rollout.turn_author_BT)
        self.alive_BT = torch.zeros(B, n_new, dtype=torch.long, device=device)
        self.done = torch.zeros(B, dtype=torch.bool, device=device)
        self.hit_eos = torch.zeros(B, dtype=torch.bool, device=device)
        self.pad_tok = torch.full((B,), pad_token_id, dtype=torch.long, device=device)
        self.rounds = self.state.rounds_B.clone()
        self.pair = _pair(decs) if lockstep else None  # both lean decoders as one (engines.lean_pair)

    def _pair_sync(self, upto: int, known: int) -> None:
        """:meth:`_Decoder.sync` of both decoders by one :class:`~tandem_rlvr.engines.lean_pair.LeanPair` forward."""
        s, j = self.s_dec, self.j_dec
        chunk = max(1, LOGITS_BUDGET // max(1, self.ids.shape[0] * s.logits_BV.shape[-1]))
        while s.seen < upto:
            a = s.seen
            b = min(upto, a + chunk)
            out = self.pair.forward(self.ids[:, a:b], s.plen_B1 + s.steps[a:b], s._mask(a, b), b - a)
            k = min(b - a, known - 1 - a)  # logits[:, i] predicts column a + 1 + i
            for d, logits in zip((s, j), out):
                if k > 0:
                    d.logps_BT[:, a + 1:a + 1 + k] = logp_of(logits[:, :k], self.ids[:, a + 1:a + 1 + k], d.temperature)
                d.logits_BV, d.seen = logits[:, -1, :], b

    def _logits(self, t: int, author: torch.Tensor) -> torch.Tensor:
        """Bring the models that must run at step ``t`` up to date; the authors' next-token logits."""
        if self.pair is not None:
            self._pair_sync(t, t)
            return torch.where(author[:, None], self.s_dec.logits_BV, self.j_dec.logits_BV)
        if self.lockstep or self.j_dec is None:
            need_s, need_j = True, self.j_dec is not None
        else:  # catch-up: a model runs only where it writes for some live row
            need_s = bool((author & ~self.done).any())
            need_j = bool((~author & ~self.done).any())
        if need_s:
            self.s_dec.sync(self.ids, t, t)
        if need_j:
            self.j_dec.sync(self.ids, t, t)
        if need_s and need_j:
            return torch.where(author[:, None], self.s_dec.logits_BV, self.j_dec.logits_BV)
        return self.s_dec.logits_BV if need_s else self.j_dec.logits_BV

    def step(self, t: int) -> bool:
        """Sample response column ``t``; True once every row is done."""
        author = self.state.author_B.to(self.device)
        tok = torch.where(self.done, self.pad_tok, sample_tokens(self._logits(t, author), self.sampling, self.gen_tok))
        live = ~self.done
        self.ids[:, t], self.alive_BT[:, t], self.owner[:, t] = tok, live.long(), (author & live).long()
        self.turn[:, t] = torch.where(self.state.fresh_B.to(self.device) & live, author.long(), -1)
        for d in self.decs:
            d.record(t, tok)
        # a row's rounds: the turn of its last token (a turn the coin after it starts, at EOS, at the budget or
        # past max_rounds, is never written)
        self.rounds = torch.where(live.cpu(), self.state.rounds_B, self.rounds)
        self.state = self.schedule.advance(self.state, tok, self.coins)
        ends = torch.isin(tok, self.eos)
        if self.eos_j is not None:  # each author's own EOS
            ends = torch.where(author, ends, torch.isin(tok, self.eos_j))
        self.hit_eos = self.hit_eos | (ends & live)
        self.done = self.done | self.hit_eos | over_rounds(self.state.rounds_B, self.max_rounds).to(self.device)
        if self.pair is not None:
            if self.s_dec.seen >= t:
                self.pair.drop_rows(~self.done)
        else:
            for d in self.decs:
                d.live(t, ~self.done)
        return bool(self.done.all())

    def run(self) -> None:
        t = 0
        for t in range(self.ids.shape[1]):
            if self.step(t):
                break
        if self.pair is not None:
            self._pair_sync(t, t + 1)
        for d in self.decs:  # models that sat out the last steps read (and score) the tokens they missed
            d.sync(self.ids, t, t + 1)

    def rollout(self, prompt_ids_BP: torch.Tensor, prompt_mask_BP: torch.Tensor) -> Rollout:
        alive_BT = self.alive_BT
        T = int(alive_BT.sum(0).nonzero().max()) + 1 if bool(alive_BT.any()) else 1
        alive = alive_BT[:, :T]
        rounds = self.rounds
        return Rollout(
            prompt_ids_BP=prompt_ids_BP, prompt_mask_BP=prompt_mask_BP,
            response_ids_BT=self.ids[:, :T], response_mask_BT=alive,
            owner_BT=self.owner[:, :T], senior_logps_BT=self.s_dec.logps_BT[:, :T] * alive,
            junior_logps_BT=(self.j_dec.logps_BT[:, :T] * alive) if self.j_dec is not None else None,
            rounds_B=torch.minimum(rounds, torch.full_like(rounds, self.max_rounds or 10**9)),
            finished_B=self.hit_eos, schedule=self.schedule.name, **decision_record(self.turn[:, :T]),
            logps_recorded=True,
        )
