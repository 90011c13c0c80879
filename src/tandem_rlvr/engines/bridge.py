"""Text bridge: step-level tandem rollouts for a senior and a junior whose tokenizers differ.

The lockstep engine (:mod:`tandem_rlvr.engines.rollout`) needs one shared vocabulary. When the two models
tokenize differently, the shared history is kept as *text* instead:

1. The current author reads ``its own prompt + its own encoding of the response text so far`` and
   writes one reasoning step: it decodes until the text of its turn contains ``"\\n\\n"``, until EOS,
   or until the shared budget is spent. The turn's text is cut right after its first ``"\\n\\n"``
   (the rest of that last token is dropped, as a stop string would).
2. The new text is appended to the history and its character span is recorded with its owner
   (1 senior, 0 junior). The next author re-encodes the whole history with its own tokenizer.
3. At the end, the final text is encoded with the senior's tokenizer and each senior token gets
   the owner of the characters it covers (from the offset mapping). A token that straddles a
   junior/senior boundary counts as the junior's: the senior is only trained on tokens it wrote
   entirely. If the chain ended with EOS, the senior's EOS token closes the response, owned by
   whoever emitted it.

The result is a :class:`~tandem_rlvr.engines.rollout.Rollout` over the senior's tokens, so the trainer's
loss mask (``response_mask * owner``) works unchanged. ``junior_logps_BT`` is None: the junior's
log-probs live on its own tokens, which do not line up with the senior's.

Only step-level schedules can be bridged (``step``: a coin with P(senior)=p at every step end;
``alternate``: the senior writes the first step, then strict alternation). Word- and token-level
schedules hand off every few tokens, where a token of one vocabulary is no unit of the other; they
raise :class:`BridgeError`.

Budget: ``max_new_tokens`` counts the tokens each author emitted, in its own vocabulary.
Cost: every turn re-encodes and re-reads the whole history (no KV cache survives a handoff).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import torch

from tandem_rlvr.engines.base import EngineBase, PromptBatch
from tandem_rlvr.engines.serving import BRIDGE
from tandem_rlvr.errors import BridgeError
from tandem_rlvr.engines.handoff import STEP_END, CoinStream, Schedule, SequenceSchedule, TokenTable, step_end, token_table
from tandem_rlvr.engines.rollout import Rollout, Sampling, _logp_of, _Stream, rollout_from_rows, sample_tokens

__all__ = ["BridgeEngine", "BridgeError", "BridgeRollout", "bridge_generate", "check_bridge_schedule", "decode_turn",
           "make_side", "senior_token_owner", "tokenizers_differ"]


def tokenizers_differ(senior_tok, junior_tok) -> bool:
    """True when the two tokenizers do not map every token string to the same id."""
    return senior_tok.get_vocab() != junior_tok.get_vocab()


def check_bridge_schedule(name: str) -> None:
    """Raise :class:`BridgeError` unless ``name`` is a step-level schedule the bridge can run."""
    BRIDGE.check(name)


@dataclass
class Side:
    """One author of the bridge: its model, tokenizer, EOS ids and token table (where its steps end)."""

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
            rows = self.model.get_output_embeddings().weight.shape[0]
            self.table = token_table(self.tokenizer, rows)


def make_side(model, tokenizer, eos_ids: Sequence[int] | None = None) -> Side:
    """A :class:`Side` whose EOS ids default to the tokenizer's and the model's generation config's."""
    if eos_ids is None:
        from tandem_rlvr.models import eos_ids as find_eos

        eos_ids = find_eos(tokenizer, model)
    return Side(model, tokenizer, [int(e) for e in eos_ids])


@dataclass
class BridgeRollout:
    """A bridged batch: the senior-token :class:`Rollout`, the final texts and their owner spans.

    ``spans[b]`` lists maximal ``(start, end, owner)`` character runs covering ``texts[b]``.
    """

    rollout: Rollout
    texts: list[str]
    spans: list[list[tuple[int, int, int]]]


@dataclass
class _Turn:
    """What one author wrote in one turn of one row."""

    ids: list[int]
    hit_eos: bool
    step_end: bool


def _left_pad(seqs: list[list[int]], pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    batch = PromptBatch.left_padded(seqs, pad_id)
    return batch.ids_BP, batch.mask_BP


@torch.inference_mode()
def decode_turn(side: Side, seqs: list[list[int]], budget_B: list[int], sampling: Sampling,
                gen: torch.Generator) -> list[_Turn]:
    """One author writes one step for each row (batched, KV-cached): stops at step end, EOS or budget."""
    device = side.model.get_output_embeddings().weight.device
    ids_BP, mask_BP = _left_pad(seqs, side.tokenizer.pad_token_id)
    ids_BP, mask_BP = ids_BP.to(device), mask_BP.to(device)
    B, n_max = len(seqs), max(budget_B)
    budget = torch.tensor(budget_B)
    eos = torch.tensor(sorted(set(side.eos_ids)))
    table = side.table
    stream = _Stream(side.model, ids_BP, mask_BP)
    out_BT = torch.zeros(B, n_max, dtype=torch.long)
    done, turn_nl = torch.zeros(B, dtype=torch.bool), torch.zeros(B, dtype=torch.bool)
    hit_eos, ended = torch.zeros(B, dtype=torch.bool), torch.zeros(B, dtype=torch.bool)
    length = torch.zeros(B, dtype=torch.long)
    mask_BT = mask_BP
    for t in range(n_max):
        tok = sample_tokens(stream.logits_BV, sampling, gen).cpu()
        tok = torch.where(done, torch.full_like(tok, side.tokenizer.pad_token_id), tok)
        out_BT[:, t] = tok
        length += (~done).long()
        is_eos = torch.isin(tok, eos) & ~done
        is_end = step_end(table.nl2_V[tok], table.starts_nl_V[tok], turn_nl) & ~done & ~is_eos
        turn_nl = table.ends_nl_V[tok]
        hit_eos, ended = hit_eos | is_eos, ended | is_end
        done = done | is_eos | is_end | (length >= budget)
        if bool(done.all()):
            break
        mask_BT = torch.cat([mask_BT, torch.ones(B, 1, dtype=mask_BT.dtype, device=device)], dim=1)
        stream.step(tok.to(device), mask_BT)
    return [_Turn(out_BT[b, :length[b]].tolist(), bool(hit_eos[b]), bool(ended[b])) for b in range(B)]


def _turn_text(side: Side, turn: _Turn) -> str:
    """The text a turn adds to the history: decoded without EOS, cut after its first ``"\\n\\n"``."""
    ids = turn.ids[:-1] if turn.hit_eos else turn.ids
    text = side.tokenizer.decode(ids, skip_special_tokens=True, clean_up_tokenization_spaces=False)
    cut = text.find(STEP_END)
    return text[:cut + len(STEP_END)] if cut >= 0 else text


@dataclass
class _Chains:
    """Per-row state of a bridged batch (plain Python: turns are few and rows are independent).
    Who writes next is each row's :class:`~tandem_rlvr.engines.handoff.SequenceSchedule`'s to say."""

    texts: list[str]
    spans: list[list[list[int]]]
    sched: list[SequenceSchedule]
    remaining: list[int]
    done: list[bool]
    finished: list[bool]
    last_author: list[bool]
    played: list[list[bool]] = field(default_factory=list)  # the author of each turn played, per row

    @classmethod
    def start(cls, schedule: Schedule, coins: CoinStream, budget: int) -> _Chains:
        """``coins.n`` empty chains with their first authors and the whole budget each."""
        n = coins.n
        sched = [SequenceSchedule(schedule, coins, b) for b in range(n)]
        return cls([""] * n, [[] for _ in range(n)], sched, [budget] * n, [False] * n, [False] * n,
                   [s.author for s in sched], [[] for _ in range(n)])

    @property
    def author(self) -> list[bool]:
        return [s.author for s in self.sched]

    def add_text(self, b: int, text: str, owner: int) -> None:
        append_owned_text(self.texts, self.spans, b, text, owner)


def append_owned_text(texts: list[str], spans: list[list[list[int]]], b: int, text: str, owner: int) -> None:
    """Append ``text`` to row ``b`` of ``texts``, extending its last ``[start, end, owner]`` span when the
    owner is unchanged (the text chains of the training bridge and of the evaluation's bridges)."""
    if not text:
        return
    start, end = len(texts[b]), len(texts[b]) + len(text)
    texts[b] += text
    if spans[b] and spans[b][-1][2] == owner:
        spans[b][-1][1] = end
    else:
        spans[b].append([start, end, owner])


def _after_turn(ch: _Chains, b: int, turn: _Turn, max_rounds: int | None) -> None:
    """Update row ``b`` after its author's turn: end the chain, or let the schedule pick the next author."""
    ch.remaining[b] -= len(turn.ids)
    ch.last_author[b] = ch.sched[b].author
    if turn.hit_eos:
        ch.done[b], ch.finished[b] = True, True
    elif ch.remaining[b] <= 0 or not turn.step_end:
        ch.done[b] = True
    else:
        ch.sched[b].end_step()
        ch.done[b] = ch.sched[b].over(max_rounds)


def _encode(tokenizer, texts: list[str]) -> list[list[int]]:
    if all(not t for t in texts):
        return [[] for _ in texts]
    return tokenizer(texts, add_special_tokens=False)["input_ids"]


def _encode_prompts(tokenizer, prompts: Sequence[str]) -> list[list[int]]:
    return tokenizer(list(prompts), add_special_tokens=False)["input_ids"]


def _run_turns(senior: Side, junior: Side, prompt_ids: dict, ch: _Chains, sampling: Sampling,
               gen: torch.Generator, max_rounds: int | None) -> None:
    """Play turns until every chain is done; each pass runs the senior's rows, then the junior's."""
    while not all(ch.done):
        for is_senior, side in ((True, senior), (False, junior)):
            rows = [b for b in range(len(ch.done)) if not ch.done[b] and ch.author[b] == is_senior]
            if not rows:
                continue
            history = _encode(side.tokenizer, [ch.texts[b] for b in rows])
            seqs = [prompt_ids[is_senior][b] + h for b, h in zip(rows, history)]
            turns = decode_turn(side, seqs, [ch.remaining[b] for b in rows], sampling, gen)
            for b, turn in zip(rows, turns):
                ch.played[b].append(is_senior)
                ch.add_text(b, _turn_text(side, turn), int(is_senior))
                _after_turn(ch, b, turn, max_rounds)


def _char_owner(spans: list[list[int]], n: int) -> torch.Tensor:
    own_N = torch.zeros(n, dtype=torch.long)
    for start, end, owner in spans:
        own_N[start:end] = owner
    return own_N


def senior_token_owner(text: str, spans: list[list[int]], offsets: list[tuple[int, int]]) -> list[int]:
    """Owner of each senior token: 1 iff every character it covers was written by the senior."""
    own_N = _char_owner(spans, len(text))
    out = []
    for start, end in offsets:
        if end <= start:  # a zero-width token (e.g. a later piece of a split character): the char before
            start, end = max(start - 1, 0), max(start, 1)
        seg_N = own_N[start:end]
        out.append(int(seg_N.numel() > 0 and bool(seg_N.all())))
    return out


def _to_rollout(senior: Side, ch: _Chains, prompt_ids: list[list[int]], schedule: str,
                max_rounds: int | None) -> Rollout:
    """The senior-token Rollout of the final texts (offset mapping → owner per senior token)."""
    tok = senior.tokenizer
    enc = tok(ch.texts, add_special_tokens=False, return_offsets_mapping=True)
    eos_id = tok.eos_token_id if tok.eos_token_id is not None else senior.eos_ids[0]
    rows_ids, rows_own = [], []
    for b, (ids, offs) in enumerate(zip(enc["input_ids"], enc["offset_mapping"])):
        own = senior_token_owner(ch.texts[b], ch.spans[b], offs)
        if ch.finished[b]:
            ids, own = ids + [eos_id], own + [int(ch.last_author[b])]
        rows_ids.append(ids)
        rows_own.append(own)
    p_ids, p_mask = _left_pad(prompt_ids, tok.pad_token_id)
    dev = senior.model.get_output_embeddings().weight.device  # where the trainer's forwards run
    return rollout_from_rows(p_ids.to(dev), p_mask.to(dev), rows_ids, rows_own, pad_token_id=tok.pad_token_id,
                             rounds=[q.rounds for q in ch.sched], finished=ch.finished, max_rounds=max_rounds,
                             schedule=schedule, record=_turn_record(ch))


def _turn_record(ch: _Chains) -> dict:
    """Each row's turns for the ownership check: how many authors were chosen, how many were the senior
    (under ``step`` each is a coin's outcome). The bridge has no token-level record (turns are text,
    re-encoded at the end), so the trainer checks its mask per row (:mod:`tandem_rlvr.training.ownership`).
    The evaluation's bridges (:mod:`tandem_rlvr.evaluation.textfit` chains) keep no such record: none is returned."""
    if not hasattr(ch, "played"):
        return {}
    return {"decisions_B": torch.tensor([len(t) for t in ch.played], dtype=torch.long),
            "senior_decisions_B": torch.tensor([sum(t) for t in ch.played], dtype=torch.long)}


@torch.inference_mode()
def score_senior(model, rollout: Rollout, temperature: float) -> torch.Tensor:
    """Teacher-forced log-probs of the response tokens under ``model`` (zero on padding)."""
    ids = torch.cat([rollout.prompt_ids_BP, rollout.response_ids_BT], 1)
    mask = torch.cat([rollout.prompt_mask_BP.long(), rollout.response_mask_BT.long()], 1)
    device = model.get_output_embeddings().weight.device
    pos = (mask.cumsum(-1) - 1).clamp(min=0)
    P, T = rollout.prompt_ids_BP.shape[1], rollout.response_ids_BT.shape[1]
    logits = model(input_ids=ids.to(device), attention_mask=mask.to(device), position_ids=pos.to(device),
                   use_cache=False).logits
    ids_BT = rollout.response_ids_BT.to(device)
    logps_BT = torch.stack([_logp_of(logits[b, P - 1:P + T - 1], ids_BT[b], temperature)  # one row at a time
                            for b in range(ids_BT.shape[0])])
    return logps_BT.cpu() * rollout.response_mask_BT.cpu()


def bridge_generate(
    senior: Side,
    junior: Side,
    senior_prompts: Sequence[str],
    junior_prompts: Sequence[str] | None,
    schedule: str,
    sampling: Sampling,
    *,
    p: float = 0.5,
    seed: int = 0,
    max_rounds: int | None = None,
    score: bool = True,
) -> BridgeRollout:
    """Co-write responses through text; see the module docstring.

    ``senior_prompts`` / ``junior_prompts``: the prompts already rendered with each model's chat
    template (``junior_prompts`` None = the same strings). ``schedule``: ``step`` (coin with
    P(senior)=``p`` at each step end) or ``alternate``. ``max_rounds`` ends a chain once it would
    start turn ``max_rounds + 1``. ``score`` fills ``senior_logps_BT`` by one teacher-forced pass.
    """
    check_bridge_schedule(schedule)
    if not 0.0 <= p <= 1.0:
        raise BridgeError(f"handoff p must be in [0, 1], got {p}")
    junior_prompts = senior_prompts if junior_prompts is None else junior_prompts
    if len(junior_prompts) != len(senior_prompts) or not senior_prompts:
        raise BridgeError(f"need one junior prompt per senior prompt, got {len(junior_prompts)} and {len(senior_prompts)}")
    coins = CoinStream(len(senior_prompts), p, seed)
    ch = _Chains.start(Schedule(schedule, p), coins, sampling.max_new_tokens)
    prompt_ids = {True: _encode_prompts(senior.tokenizer, senior_prompts),
                  False: _encode_prompts(junior.tokenizer, junior_prompts)}
    gen = torch.Generator().manual_seed(int(seed))
    _run_turns(senior, junior, prompt_ids, ch, sampling, gen, max_rounds)
    rollout = _to_rollout(senior, ch, prompt_ids[True], schedule, max_rounds)
    if score:
        rollout.senior_logps_BT = score_senior(senior.model, rollout, sampling.temperature)
    spans = [[(s, e, o) for s, e, o in row] for row in ch.spans]
    return BridgeRollout(rollout, ch.texts, spans)


class BridgeEngine(EngineBase):
    """The text bridge behind the :class:`~tandem_rlvr.engines.base.Engine` interface: it renders each
    prompt's problem with both chat templates (``prompts.problems`` is required). ``score`` fills
    ``senior_logps_BT`` (the trainer recomputes them itself)."""

    serving = BRIDGE

    def __init__(self, senior, tokenizer, junior, junior_tokenizer, *, eos_token_ids: Sequence[int] | None = None,
                 score: bool = False):
        self.senior, self.tok, self.junior, self.jtok = senior, tokenizer, junior, junior_tokenizer
        self.eos, self.score = eos_token_ids, score

    def generate(self, prompts: PromptBatch, schedule: Schedule, sampling: Sampling, *, seed: int = 0,
                 max_rounds: int | None = None) -> Rollout:
        from tandem_rlvr.data import render_prompt

        self.check(schedule)
        if prompts.problems is None:
            raise BridgeError("the text bridge renders each prompt with both chat templates: pass the problems "
                              "(PromptBatch.problems)")
        out = bridge_generate(
            make_side(self.senior, self.tok, self.eos), make_side(self.junior, self.jtok),
            [render_prompt(self.tok, q) for q in prompts.problems], [render_prompt(self.jtok, q) for q in prompts.problems],
            schedule.name, sampling, p=schedule.p, seed=seed, max_rounds=max_rounds, score=self.score,
        )
        return out.rollout

    def sync_senior(self, model) -> None:
        self.senior = model
