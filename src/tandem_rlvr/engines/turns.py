"""The turn driver: the one place where two models write a response turn by turn through *text*.

Every path whose authors do not share token positions runs here: the training text bridge
(:mod:`tandem_rlvr.engines.bridge`) and the evaluation's step and word handoffs between different
tokenizers (:mod:`tandem_rlvr.evaluation.crosstok`). Who writes next is always the row's
:class:`~tandem_rlvr.engines.handoff.SequenceSchedule` (the rules live in :mod:`tandem_rlvr.engines.handoff`
only); this module plays the turns:

1. every live row whose author is the senior, then every one whose author is the junior: the author
   reads its own prompt and its own encoding of the text so far (left-truncated to its context where
   :attr:`TurnRules.contexts` says so) and writes one turn (:func:`decode_turn`, KV-cached, batched);
2. a turn ends at EOS, at the row's remaining budget, or where the schedule ends it: for a step-level
   schedule at the end of a step (the turn's text is cut after its first ``"\\n\\n"``; the row's next
   step-end coin falls afterwards, :meth:`SequenceSchedule.end_step`), for a token-level one (``word``)
   where a coin hands the next token to the other author: every emitted token is fed to the schedule
   in the author's own vocabulary, the coin falls *after* a word-start token or after ``max_gap`` tokens
   without one, exactly as in the lockstep engine, and the token that preceded the coin stays in the turn;
3. the turn's text (decoded after the author's last tokens of the text so far, :func:`decode_after`, so that
   the joined text is the decoding of the whole token sequence: a SentencePiece ``"▁word"`` keeps its space)
   joins the row's history with its owner (character spans); the chain ends on EOS
   (``eos``), on its budget (``budget``), past ``max_rounds`` turns (``max_rounds``) or, where
   :attr:`TurnRules.stop_empty`, on a turn of whitespace only (``empty_turn``).

:func:`chains_to_rollout` turns the chains into a :class:`~tandem_rlvr.engines.types.Rollout` over the
senior's tokens (each senior token owned by the senior iff the senior wrote every character it covers).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import torch
from transformers import DynamicCache

from tandem_rlvr.engines.base import PromptBatch
from tandem_rlvr.engines.handoff import STEP_END, CoinStream, Schedule, SequenceSchedule, TokenTable, step_end, token_table
from tandem_rlvr.engines.types import Rollout, Sampling, rollout_from_rows, sample_tokens
from tandem_rlvr.errors import BridgeError

__all__ = ["Chain", "Side", "Stream", "Turn", "TurnRules", "chains_to_rollout", "decode_after", "decode_turn",
           "encode_texts", "truncate_to_context", "make_side", "run_turns", "senior_token_owner", "senior_used",
           "start_chains"]


@dataclass
class Side:
    """One author: its model, tokenizer, EOS ids and token table (where its words start and steps end)."""

    model: object
    tokenizer: object
    eos_ids: list[int]
    table: TokenTable = field(repr=False, default=None)  # type: ignore[assignment]

    def __post_init__(self) -> None:
        if not self.eos_ids:
            raise BridgeError(f"tokenizer {getattr(self.tokenizer, 'name_or_path', '?')!r} has no EOS id")
        if self.tokenizer.pad_token_id is None:
            raise BridgeError(f"tokenizer {getattr(self.tokenizer, 'name_or_path', '?')!r} has no pad token")
        if self.table is None:
            self.table = token_table(self.tokenizer, self.model.get_output_embeddings().weight.shape[0])


def make_side(model, tokenizer, eos_ids: Sequence[int] | None = None) -> Side:
    """A :class:`Side` whose EOS ids default to the tokenizer's and the model's generation config's."""
    if eos_ids is None:
        from tandem_rlvr.models import eos_ids as find_eos

        eos_ids = find_eos(tokenizer, model)
    return Side(model, tokenizer, [int(e) for e in eos_ids])


class Stream:
    """One model's incremental decoding state (its own KV cache), stepped with a growing 2-D mask."""

    def __init__(self, model, ids_BP: torch.Tensor, mask_BP: torch.Tensor):
        self.model = model
        self.cache = DynamicCache()
        self.pos_B1 = (mask_BP.long().cumsum(-1) - 1).clamp(min=0)
        self.logits_BV = self._forward(ids_BP, mask_BP, self.pos_B1)
        self.pos_B1 = self.pos_B1[:, -1:]

    def _forward(self, ids, mask, pos) -> torch.Tensor:
        out = self.model(input_ids=ids, attention_mask=mask, position_ids=pos, past_key_values=self.cache,
                         use_cache=True, logits_to_keep=1)
        self.cache = out.past_key_values
        return out.logits[:, -1, :]

    def step(self, tok_B: torch.Tensor, mask_BT: torch.Tensor) -> None:
        self.pos_B1 = self.pos_B1 + 1
        self.logits_BV = self._forward(tok_B[:, None], mask_BT, self.pos_B1)


@dataclass
class Turn:
    """What one author wrote in one turn of one row; ``ended``: the schedule ended it (a step end, or a
    coin that handed the next token over), as opposed to EOS or the budget."""

    ids: list[int]
    hit_eos: bool
    ended: bool


@dataclass
class Chain:
    """One row's chain: its schedule, budget and what is left of it (tokens), text with owner spans
    ``[start, end, owner]``, why it stopped (None while live) and each turn's ``(author, ids it wrote)``."""

    sched: SequenceSchedule
    budget: int
    remaining: int = -1
    text: str = ""
    spans: list[list[int]] = field(default_factory=list)
    stop: str | None = None
    turns: list[tuple[bool, list[int]]] = field(default_factory=list)

    def __post_init__(self) -> None:
        if self.remaining < 0:
            self.remaining = self.budget

    @property
    def author(self) -> bool:
        return self.sched.author

    @property
    def done(self) -> bool:
        return self.stop is not None

    @property
    def finished(self) -> bool:
        """Ended by EOS (the rollout closes it with the senior's EOS token)."""
        return self.stop == "eos"

    @property
    def last_author(self) -> bool:
        return self.turns[-1][0] if self.turns else self.sched.author

    @property
    def rounds(self) -> int:
        """Author turns as written: 1, plus 1 at every change of author between turns that wrote tokens (a turn
        the schedule starts after the last one, at EOS, the budget or past ``max_rounds``, is never written)."""
        authors = [a for a, ids in self.turns if ids]
        return 1 + sum(a != b for a, b in zip(authors, authors[1:]))

    def add(self, text: str, owner: int) -> None:
        """Append ``text``, extending the last span when the owner is unchanged."""
        if not text:
            return
        start, end = len(self.text), len(self.text) + len(text)
        self.text += text
        if self.spans and self.spans[-1][2] == owner:
            self.spans[-1][1] = end
        else:
            self.spans.append([start, end, owner])

    def trim(self, cut: int) -> None:
        """Cut the text (and its spans) to its first ``cut`` characters."""
        self.text = self.text[:cut]
        self.spans = [[s, min(e, cut), o] for s, e, o in self.spans if s < cut]


@dataclass(frozen=True)
class TurnRules:
    """How chains end besides EOS and the schedule. ``max_rounds``: a chain stops once it would start turn
    ``max_rounds + 1``. ``senior_budget``: the budget counts the senior's tokens of the whole text
    (re-encoded after every turn; a chain that passes it is cut at its last fitting token), else each
    author's own emitted tokens. ``stop_empty``: a turn of whitespace only ends the chain. ``contexts``:
    (senior, junior) positions each can read; a longer input is truncated from the left."""

    max_rounds: int | None = None
    senior_budget: bool = False
    stop_empty: bool = False
    contexts: tuple[int | None, int | None] = (None, None)


def start_chains(schedule: Schedule, coins: CoinStream, budget: int) -> list[Chain]:
    """``coins.n`` empty chains, each with its first author (the schedule's) and the whole budget."""
    return [Chain(SequenceSchedule(schedule, coins, b), budget) for b in range(coins.n)]


def encode_texts(tokenizer, texts: Sequence[str]) -> list[list[int]]:
    """Token ids of each rendered prompt (:func:`tandem_rlvr.data.encode_prompt_texts`: no special tokens, but a
    plain-template prompt's BOS where the tokenizer adds one); empty lists for empty texts."""
    from tandem_rlvr.data import encode_prompt_texts

    return [[] for _ in texts] if all(not t for t in texts) else encode_prompt_texts(tokenizer, texts)


def _encode_history(tokenizer, texts: Sequence[str]) -> list[list[int]]:
    """Token ids of each row's text so far (it follows the prompt: no special tokens)."""
    if all(not t for t in texts):
        return [[] for _ in texts]
    return tokenizer(list(texts), add_special_tokens=False)["input_ids"]


def run_turns(sides: tuple[Side, Side], prompt_ids: tuple[list[list[int]], list[list[int]]], chains: list[Chain],
              sampling: Sampling, gen: torch.Generator, rules: TurnRules) -> int:
    """Play turns until every chain has stopped (see the module docstring); returns how many turn
    inputs were truncated to fit a context. ``sides`` and ``prompt_ids`` are (senior, junior)."""
    step_level = chains[0].sched.schedule.level == "step"
    truncations = 0
    while not all(c.done for c in chains):
        for who, is_senior in ((0, True), (1, False)):
            side = sides[who]
            rows = [b for b, c in enumerate(chains) if not c.done and c.author == is_senior]
            if not rows:
                continue
            history = _encode_history(side.tokenizer, [chains[b].text for b in rows])
            seqs, caps, cut = truncate_to_context([prompt_ids[who][b] + h for b, h in zip(rows, history)],
                                                  [chains[b].remaining for b in rows], rules.contexts[who])
            truncations += cut
            turns = decode_turn(side, seqs, caps, sampling, gen, [chains[b].sched for b in rows])
            texts = [_turn_text(side, t, step_level, h[-CONTEXT_TOKENS:]) for t, h in zip(turns, history)]
            for b, turn, text in zip(rows, turns, texts):
                chains[b].turns.append((is_senior, turn.ids))
                chains[b].add(text, int(is_senior))
            used = senior_used(chains, rows, sides[0].tokenizer) if rules.senior_budget else [0] * len(rows)
            for b, turn, text, u in zip(rows, turns, texts, used):
                _after_turn(chains[b], turn, text, u, rules, step_level)
    return truncations


def _after_turn(ch: Chain, turn: Turn, text: str, used: int | None, rules: TurnRules, step_level: bool) -> None:
    """End row ``ch`` with its reason, or let its schedule say who writes next (``used``: the senior
    tokens of its text, None where it was cut to the budget; ignored without a senior budget)."""
    ch.remaining = (ch.budget - used if used is not None else 0) if rules.senior_budget else ch.remaining - len(turn.ids)
    if used is None:
        ch.stop = "budget"
    elif turn.hit_eos:
        ch.stop = "eos"
    elif ch.remaining <= 0 or not turn.ended:
        ch.stop = "budget"
    elif rules.stop_empty and not text.strip():
        ch.stop = "empty_turn"
    else:
        if step_level:
            ch.sched.end_step()  # the coin of the row's next step end (token-level coins fell while decoding)
        if ch.sched.over(rules.max_rounds):
            ch.stop = "max_rounds"


def _left_pad(seqs: list[list[int]], pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    batch = PromptBatch.left_padded(seqs, pad_id)
    return batch.ids_BP, batch.mask_BP


def _hands_over(sched: SequenceSchedule, tok: int, table: TokenTable) -> bool:
    """Feed one emitted token to the row's schedule; True where the coin after it changed the author."""
    before = sched.author
    sched.feed(tok, table)
    return sched.author != before


@torch.inference_mode()
def decode_turn(side: Side, seqs: list[list[int]], caps: list[int], sampling: Sampling, gen: torch.Generator,
                scheds: list[SequenceSchedule]) -> list[Turn]:
    """One author writes one turn for each row (batched, KV-cached): until EOS, the row's cap, or where its
    schedule ends the turn (a step end for step-level schedules; for token-level ones a coin, after a token
    fed to the schedule in this author's vocabulary, that hands the next token over)."""
    device = side.model.get_output_embeddings().weight.device
    ids_BP, mask_BP = _left_pad(seqs, side.tokenizer.pad_token_id)
    B, n_max, table = len(seqs), max(caps), side.table
    level = scheds[0].schedule.level
    cap, eos = torch.tensor(caps), torch.tensor(sorted(set(side.eos_ids)))
    stream = Stream(side.model, ids_BP.to(device), mask_BP.to(device))
    out_BT = torch.zeros(B, n_max, dtype=torch.long)
    length = torch.zeros(B, dtype=torch.long)
    done, turn_nl, hit_eos, ended = (torch.zeros(B, dtype=torch.bool) for _ in range(4))
    mask_BT = mask_BP.to(device)
    for t in range(n_max):
        tok = sample_tokens(stream.logits_BV, sampling, gen).cpu()
        tok = torch.where(done, torch.full_like(tok, side.tokenizer.pad_token_id), tok)
        live = ~done
        out_BT[:, t] = tok
        length += live.long()
        is_eos = torch.isin(tok, eos) & live
        if level == "step":
            is_end = step_end(table.nl2_V[tok], table.starts_nl_V[tok], turn_nl) & live & ~is_eos
            turn_nl = table.ends_nl_V[tok]
        elif level == "token":
            is_end = torch.tensor([bool(live[i]) and _hands_over(scheds[i], int(tok[i]), table) for i in range(B)])
            is_end &= ~is_eos
        else:
            is_end = torch.zeros(B, dtype=torch.bool)
        hit_eos, ended = hit_eos | is_eos, ended | is_end
        done = done | is_eos | is_end | (length >= cap)
        if bool(done.all()):
            break
        mask_BT = torch.cat([mask_BT, torch.ones(B, 1, dtype=mask_BT.dtype, device=device)], dim=1)
        stream.step(tok.to(device), mask_BT)
    return [Turn(out_BT[b, :length[b]].tolist(), bool(hit_eos[b]), bool(ended[b])) for b in range(B)]


CONTEXT_TOKENS = 8  # the author's last tokens of the text so far that a turn is decoded after


def _turn_text(side: Side, turn: Turn, step_level: bool, context: list[int]) -> str:
    """The text a turn adds: decoded without EOS after ``context`` (see :func:`decode_after`); a step-level
    turn cut after its first ``"\\n\\n"`` (the rest of that last token is dropped, as a stop string would)."""
    ids = turn.ids[:-1] if turn.hit_eos else turn.ids
    text = decode_after(side.tokenizer, context, ids)
    cut = text.find(STEP_END) if step_level else -1
    return text[:cut + len(STEP_END)] if cut >= 0 else text


def decode_after(tokenizer, context: list[int], ids: list[int]) -> str:
    """The text ``ids`` add after ``context`` (the author's own encoding of the text so far, its last few
    tokens): ``decode(context + ids)`` past ``decode(context)``. Decoded alone, a turn would lose what its first
    token means in context, e.g. the space of a SentencePiece ``"▁answer"`` (the decoder strips the first
    one), gluing ``"The" + "answer"``. Where the two decodings disagree on the context's own text (byte
    tokens of the turn that merge with the context's into one undecodable sequence) the turn is decoded alone:
    the text already written is never rewritten."""
    kw = {"skip_special_tokens": True, "clean_up_tokenization_spaces": False}
    if not context:
        return tokenizer.decode(ids, **kw)
    head, whole = tokenizer.decode(context, **kw), tokenizer.decode(list(context) + list(ids), **kw)
    return whole[len(head):] if whole.startswith(head) else tokenizer.decode(ids, **kw)


def truncate_to_context(seqs: list[list[int]], caps: list[int], context: int | None) -> tuple[list, list, int]:
    """Left-truncate each input so that input + turn fits ``context`` (a turn keeps at least half of it);
    returns ``(seqs, caps, how many inputs were cut)``."""
    if context is None:
        return seqs, caps, 0
    out_s, out_c, cut = [], [], 0
    for s, c in zip(seqs, caps):
        c = max(1, min(c, context // 2)) if len(s) + c > context else c
        keep = context - c
        cut += int(len(s) > keep)
        out_s.append(s[-keep:] if len(s) > keep else s)
        out_c.append(c)
    return out_s, out_c, cut


def _fit_cut(tok, text: str, offs, budget: int) -> int:
    """The longest prefix (in characters) that ends at a token end and re-encodes to <= ``budget`` tokens."""
    cut = int(offs[budget - 1][1]) if budget > 0 else 0
    while cut > 0 and len(tok(text[:cut], add_special_tokens=False)["input_ids"]) > budget:
        cut -= 1  # a character split over several byte tokens re-encodes whole: step back
    return cut


def senior_used(chains: list[Chain], rows: list[int], tok) -> list[int | None]:
    """Senior tokens of each row's text; a row past its budget is cut at its last fitting token (None)."""
    enc = tok([chains[b].text for b in rows], add_special_tokens=False, return_offsets_mapping=True)
    used: list[int | None] = []
    for b, ids, offs in zip(rows, enc["input_ids"], enc["offset_mapping"]):
        budget = chains[b].budget
        if len(ids) > budget:
            chains[b].trim(_fit_cut(tok, chains[b].text, offs, budget))
        used.append(len(ids) if len(ids) <= budget else None)
    return used


def senior_token_owner(text: str, spans: list[list[int]], offsets: list[tuple[int, int]]) -> list[int]:
    """Owner of each senior token: 1 iff every character it covers was written by the senior."""
    own_N = torch.zeros(len(text), dtype=torch.long)
    for start, end, owner in spans:
        own_N[start:end] = owner
    out = []
    for start, end in offsets:
        if end <= start:  # a zero-width token (e.g. a later piece of a split character): the char before
            start, end = max(start - 1, 0), max(start, 1)
        seg_N = own_N[start:end]
        out.append(int(seg_N.numel() > 0 and bool(seg_N.all())))
    return out


def chains_to_rollout(senior: Side, chains: list[Chain], prompt_ids: list[list[int]], schedule: str,
                      max_rounds: int | None) -> Rollout:
    """The senior-token :class:`Rollout` of the final texts (offset mapping -> owner per senior token); a
    chain ended by EOS gets the senior's EOS token, owned by whoever emitted it. The decision record
    counts turns (each turn's author was one decision of the schedule) and how many were the senior's."""
    tok = senior.tokenizer
    enc = tok([c.text for c in chains], add_special_tokens=False, return_offsets_mapping=True)
    eos_id = tok.eos_token_id if tok.eos_token_id is not None else senior.eos_ids[0]
    rows_ids, rows_own = [], []
    for c, ids, offs in zip(chains, enc["input_ids"], enc["offset_mapping"]):
        own = senior_token_owner(c.text, c.spans, offs)
        if c.finished:
            ids, own = ids + [eos_id], own + [int(c.last_author)]
        rows_ids.append(ids)
        rows_own.append(own)
    p_ids, p_mask = _left_pad(prompt_ids, tok.pad_token_id)
    dev = senior.model.get_output_embeddings().weight.device  # where the trainer's forwards run
    record = {"decisions_B": torch.tensor([len(c.turns) for c in chains], dtype=torch.long),
              "senior_decisions_B": torch.tensor([sum(a for a, _ in c.turns) for c in chains], dtype=torch.long)}
    return rollout_from_rows(p_ids.to(dev), p_mask.to(dev), rows_ids, rows_own, pad_token_id=tok.pad_token_id,
                             rounds=[c.rounds for c in chains], finished=[c.finished for c in chains],
                             max_rounds=max_rounds, schedule=schedule, record=record)
