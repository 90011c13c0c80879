"""Word-level handoffs between two tokenizers, on text (the handoff-rate curve of a cross-family pair).

The lockstep ``word`` schedule draws a coin P(senior)=p whenever the author emits a token that starts
a word. Across tokenizers the same rule is applied in the author's own vocabulary and the handoff
happens in *text*:

1. The current author decodes (KV-cached). Whenever it samples a token that starts a word (byte-level
   ``Ġ``, SentencePiece ``▁`` or a leading space: :func:`tandem_rlvr.handoff.token_table`) after at
   least one token of its turn, a seeded coin decides who writes that word. If the coin keeps the
   author, the token is kept; otherwise it is dropped and the turn ends at the end of the previous
   word.
2. The other author reads its own prompt and its own encoding of the text so far and writes the new
   word: its first token is drawn among its tokens that start a word (its distribution conditioned
   on "a new word starts here", which is what the first author had decided), so every author writes
   whole words.
3. A chain ends on EOS, on the budget (senior tokens, as in :mod:`tandem_rlvr.crosstok`) or after
   ``max_rounds`` turns. The first author is coin 0; at p = 1 the senior writes everything.

Each switch costs the new author a fresh read of the whole history (no KV cache survives a handoff),
so this is far slower than the lockstep curve: use short budgets or few p values.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from tandem_rlvr.bridge import Side, SeededCoins, _Chains, _encode, _encode_prompts, _to_rollout, _Turn
from tandem_rlvr.rollout import Sampling, _Stream, sample_tokens

__all__ = ["word_bridge"]


@torch.inference_mode()
def _decode_words(side: Side, boundary_V: torch.Tensor, seqs: list[list[int]], caps: list[int], rows: list[int],
                  author: bool, coins: SeededCoins, draws: list[int], sampling: Sampling, gen,
                  new_word: list[bool] | None = None) -> list[_Turn]:
    """One author writes whole words for each row until a coin hands the next word over, EOS or its cap.

    ``new_word[i]``: row ``i`` was handed over where the other author was starting a word, so its
    first token is drawn among the tokens that start a word (the distribution conditioned on that).
    ``_Turn.step_end`` is True when the turn ended by a handoff.
    """
    from tandem_rlvr.bridge import _left_pad

    device = side.model.get_output_embeddings().weight.device
    ids_BP, mask_BP = _left_pad(seqs, side.tokenizer.pad_token_id)
    B, n_max = len(seqs), max(caps)
    stream = _Stream(side.model, ids_BP.to(device), mask_BP.to(device))
    eos, cap = torch.tensor(sorted(set(side.eos_ids))), torch.tensor(caps)
    out, length = torch.zeros(B, n_max, dtype=torch.long), torch.zeros(B, dtype=torch.long)
    done, hit_eos, handed = (torch.zeros(B, dtype=torch.bool) for _ in range(3))
    mask = mask_BP.to(device)
    for t in range(n_max):
        logits = stream.logits_BV
        if t == 0 and new_word is not None and any(new_word):
            V = logits.shape[-1]
            keep = torch.zeros(V, dtype=torch.bool)
            keep[:min(V, boundary_V.numel())] = boundary_V[:V]
            block = torch.tensor(new_word)[:, None] & ~keep[None, :]
            logits = logits.masked_fill(block.to(logits.device), float("-inf"))
        tok = sample_tokens(logits, sampling, gen).cpu()
        tok = torch.where(done, torch.full_like(tok, side.tokenizer.pad_token_id), tok)
        for i in torch.nonzero(boundary_V[tok] & (length > 0) & ~done).flatten().tolist():
            draws[rows[i]] += 1
            if coins.draw(rows[i], draws[rows[i]]) != author:
                handed[i], done[i] = True, True
        live = ~done
        out[live, length[live]] = tok[live]
        length += live.long()
        is_eos = torch.isin(tok, eos) & live
        hit_eos |= is_eos
        done |= is_eos | (length >= cap)
        if bool(done.all()):
            break
        mask = torch.cat([mask, torch.ones(B, 1, dtype=mask.dtype, device=device)], dim=1)
        stream.step(tok.to(device), mask)
    return [_Turn(out[b, :length[b]].tolist(), bool(hit_eos[b]), bool(handed[b])) for b in range(B)]


def word_starts(side: Side) -> torch.Tensor:
    """Which of the side's ids start a word (:func:`tandem_rlvr.handoff.token_table`), computed once per side."""
    from tandem_rlvr.handoff import token_table

    if getattr(side, "_word_starts", None) is None:
        rows = side.model.get_output_embeddings().weight.shape[0]
        side._word_starts = token_table(side.tokenizer, rows).boundary_V
    return side._word_starts


def word_bridge(senior: Side, junior: Side, senior_prompts: Sequence[str], junior_prompts: Sequence[str],
                sampling: Sampling, *, p: float, seed: int = 0, max_rounds: int | None = 150,
                contexts: tuple[int | None, int | None] = (None, None)) -> dict:
    """Word-level tandem through text; returns the same fields as :func:`tandem_rlvr.crosstok.bridge_handoff`."""
    from tandem_rlvr.crosstok import _fit_context, _senior_used

    n, budget = len(senior_prompts), int(sampling.max_new_tokens)
    coins = SeededCoins(n, p, seed)
    ch = _Chains.start(n, [bool(c) for c in coins.table[0]], budget)
    prompt_ids = {True: _encode_prompts(senior.tokenizer, senior_prompts),
                  False: _encode_prompts(junior.tokenizer, junior_prompts)}
    tables = {True: word_starts(senior), False: word_starts(junior)}
    ctx, draws = {True: contexts[0], False: contexts[1]}, [0] * n
    gen = torch.Generator().manual_seed(int(seed))
    stops, truncations = [""] * n, 0
    while not all(ch.done):
        for is_senior, side in ((True, senior), (False, junior)):
            rows = [b for b in range(n) if not ch.done[b] and ch.author[b] == is_senior]
            if not rows:
                continue
            history = _encode(side.tokenizer, [ch.texts[b] for b in rows])
            seqs, caps, cut = _fit_context([prompt_ids[is_senior][b] + h for b, h in zip(rows, history)],
                                           [ch.remaining[b] for b in rows], ctx[is_senior])
            truncations += cut
            turns = _decode_words(side, tables[is_senior], seqs, caps, rows, is_senior, coins, draws, sampling, gen,
                                  new_word=[ch.rounds[b] > 1 for b in rows])
            for b, turn in zip(rows, turns):
                ids = turn.ids[:-1] if turn.hit_eos else turn.ids
                ch.add_text(b, side.tokenizer.decode(ids, skip_special_tokens=True, clean_up_tokenization_spaces=False),
                            int(is_senior))
            for b, turn, used in zip(rows, turns, _senior_used(ch, rows, senior.tokenizer, budget)):
                _after_word_turn(ch, b, turn, used, budget, max_rounds, stops)
    rollout = _to_rollout(senior, ch, prompt_ids[True], "word")
    spans = [[(s, e, o) for s, e, o in row] for row in ch.spans]
    return {"rollout": rollout, "texts": list(ch.texts), "spans": spans, "stops": stops, "truncations": truncations}


def _after_word_turn(ch: _Chains, b: int, turn: _Turn, used: int | None, budget: int, max_rounds: int | None,
                     stops: list[str]) -> None:
    ch.remaining[b] = budget - (budget if used is None else used)
    ch.last_author[b] = ch.author[b]
    stop = "budget" if used is None else "eos" if turn.hit_eos else "budget" if not turn.step_end or ch.remaining[b] <= 0 else None
    if stop is None and max_rounds is not None and ch.rounds[b] >= max_rounds:
        stop = "max_rounds"
    if stop is not None:
        ch.done[b], ch.finished[b], stops[b] = True, stop == "eos", stop
        return
    ch.rounds[b] += 1
    ch.author[b] = not ch.author[b]
