"""Handoff schedules: who writes the next token of each sequence. The one place that says what a
schedule means; every rollout engine asks it and none repeats a rule.

A schedule is a small immutable object. Its randomness comes from a :class:`CoinStream` (seeded, so
the same seed and token stream give the same authors). It decides, after each token:

- **who writes first**: the senior for ``none`` and ``alternate``, else coin 0;
- **when a coin falls** (METHOD.md §2):

  - ``none``: never (the senior writes everything: a vanilla GRPO rollout);
  - ``bernoulli``: after every token (a fresh coin P(senior)=p before every token);
  - ``word``: after each *boundary* token (a token whose text starts a word: byte-level ``Ġ``,
    SentencePiece ``▁`` or a leading space), or after ``max_gap`` tokens without one. Paper: p = 0.5, K = 32;
  - ``step``: after each step end (see below);
  - ``alternate``: like ``step``, but the author always changes (the senior writes the first step);
  - ``chunk``: after every ``chunk_size`` tokens;

- **where a step ends**: at the token that completes the first ``"\\n\\n"`` of the current step:
  a token whose text holds ``"\\n\\n"``, or a token starting with ``"\\n"`` right after one ending
  with ``"\\n"`` *in the same step* (a tokenizer may split ``"\\n\\n"`` in two; the newline that ended
  the previous step or the other author's turn never counts);
- **the coins**: draw ``k`` of one seeded stream, row ``b``: draw 0 picks the first author, the coin
  after response token ``t`` is draw ``t + 1`` (token-level engines share the token positions), and
  the text bridge (whose authors do not share token positions) takes draw ``k`` at a row's ``k``-th
  step end. A coin may keep the same author;
- **rounds**: author turns, 1 at the start, +1 at every change of author. A sequence ends once it
  would start turn ``max_rounds + 1`` (the evaluation's "at most 150 rounds").

Two views of the same rules: :meth:`Schedule.start` / :meth:`Schedule.advance` step a whole batch
at once (vectorised, for the in-process engine), :class:`SequenceSchedule` one sequence token by
token or turn by turn (for engines that write whole turns: vLLM, the text bridge).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property

import torch

from tandem_rlvr.names import LEVELS, NEEDS_TABLE, SCHEDULES, STEP_END, WORD_MARKERS, check_name

__all__ = ["SCHEDULES", "STEP_END", "SCHEDULE_SEED_OFFSET", "TokenTable", "token_table", "CoinStream", "HandoffState",
           "Schedule", "SequenceSchedule", "make_schedule", "simulate", "step_end", "over_rounds"]

SCHEDULE_SEED_OFFSET = 1_000_003  # the coin stream of seed s is seeded s + this (sampling uses s itself)


@dataclass(frozen=True)
class TokenTable:
    """Per-vocabulary-id flags derived once from a tokenizer (special tokens: all False).

    ``boundary_V``: the token starts a word. ``ends_nl_V``: its text ends with a newline.
    ``nl2_V``: its text holds ``"\\n\\n"``. ``starts_nl_V``: its text starts with a newline.
    """

    boundary_V: torch.Tensor
    ends_nl_V: torch.Tensor
    nl2_V: torch.Tensor
    starts_nl_V: torch.Tensor

    @property
    def vocab_size(self) -> int:
        return int(self.boundary_V.numel())

    @cached_property
    def rows(self) -> list[tuple[bool, bool, bool, bool]]:
        """``(boundary, ends_nl, nl2, starts_nl)`` per id as plain bools (fast per-token lookups)."""
        return list(zip(*(t.tolist() for t in (self.boundary_V, self.ends_nl_V, self.nl2_V, self.starts_nl_V))))


def token_table(tokenizer, vocab_size: int | None = None) -> TokenTable:
    """Build the :class:`TokenTable` of ``tokenizer`` (padded to ``vocab_size`` model rows if larger)."""
    n_tok = len(tokenizer)
    size = max(n_tok, vocab_size or 0)
    raw = tokenizer.convert_ids_to_tokens(list(range(n_tok)))
    special = set(getattr(tokenizer, "all_special_ids", []) or [])
    flags = torch.zeros(4, size, dtype=torch.bool)
    for i in range(n_tok):
        if i in special or raw[i] is None:
            continue
        text = tokenizer.decode([i], clean_up_tokenization_spaces=False)
        flags[:, i] = torch.tensor([raw[i].startswith(WORD_MARKERS), text.endswith("\n"), STEP_END in text,
                                    text.startswith("\n")])
    return TokenTable(flags[0], flags[1], flags[2], flags[3])


def step_end(nl2, starts_nl, turn_nl):
    """Whether a token ends the step: it holds ``"\\n\\n"``, or starts with ``"\\n"`` after a token of the
    same step that ended with one (``turn_nl``). Works on bools and on bool tensors alike."""
    return nl2 | (turn_nl & starts_nl)


def over_rounds(rounds, max_rounds: int | None):
    """Whether a sequence has started more turns than ``max_rounds`` allows (it stops there)."""
    return (rounds > max_rounds) if max_rounds is not None else (rounds < 0)


class CoinStream:
    """Seeded handoff coins: row ``b``'s draw ``k`` is ``(torch.rand(n) < p)[b]`` of the ``k``-th call.

    Draw ``k`` is the ``k``-th ``torch.rand(n)`` of a generator seeded ``seed + SCHEDULE_SEED_OFFSET``,
    so the coins do not depend on the order in which rows or engines read them.
    """

    def __init__(self, n: int, p: float, seed: int):
        self.n, self.p = int(n), float(p)
        self.gen = torch.Generator().manual_seed(int(seed) + SCHEDULE_SEED_OFFSET)
        self.table_KN = (torch.rand(self.n, generator=self.gen) < self.p)[None]

    def _grow(self, k: int) -> None:
        if k >= self.table_KN.shape[0]:
            more = [torch.rand(self.n, generator=self.gen) < self.p for _ in range(k + 1 - self.table_KN.shape[0])]
            self.table_KN = torch.cat([self.table_KN, torch.stack(more)])

    def draw(self, b: int, k: int) -> bool:
        """Row ``b``'s coin ``k`` (True = the senior writes next)."""
        self._grow(k)
        return bool(self.table_KN[k, b])

    def row(self, k: int) -> torch.Tensor:
        """Draw ``k`` of every row."""
        self._grow(k)
        return self.table_KN[k]


def _where(cond, a, b):
    if torch.is_tensor(cond):
        return torch.where(cond, torch.as_tensor(a), torch.as_tensor(b))
    return a if cond else b


def _int(x):
    return x.long() if torch.is_tensor(x) else int(x)


@dataclass(frozen=True)
class HandoffState:
    """Per-sequence schedule state. ``author_B``: True where the senior writes the next token;
    ``gap_B``: tokens since the last coin; ``turn_nl_B``: the last token of the current step ended with
    a newline; ``fresh_B``: the author was just decided (at the start and wherever a coin fell, even one
    that kept the author: the engines' record of decisions, ``Rollout.turn_author_BT``); ``t``: tokens
    emitted so far."""

    author_B: torch.Tensor
    gap_B: torch.Tensor
    rounds_B: torch.Tensor
    turn_nl_B: torch.Tensor
    fresh_B: torch.Tensor
    t: int = 0


@dataclass(frozen=True)
class Schedule:
    """A handoff schedule; build one with :func:`make_schedule`.

    ``p`` is P(senior) of each coin; ``max_gap`` the word schedule's K; ``chunk_size`` the chunk
    schedule's N. ``table`` is needed by ``word``, ``step`` and ``alternate``.
    """

    name: str
    p: float = 0.5
    max_gap: int = 32
    chunk_size: int = 16
    table: TokenTable | None = field(default=None, repr=False)

    @property
    def level(self) -> str:
        """``solo``, ``token`` or ``step``: where this schedule's coins can fall."""
        return LEVELS[self.name]

    @property
    def uses_junior(self) -> bool:
        """Whether the junior can ever author a token under this schedule."""
        return self.name != "none" and (self.name == "alternate" or self.p < 1.0)

    def coins(self, n: int, seed: int) -> CoinStream:
        """The seeded coin stream of ``n`` sequences."""
        return CoinStream(n, self.p, seed)

    def first_authors(self, coins: CoinStream) -> torch.Tensor:
        """Who writes the first response token of each sequence (True = senior)."""
        if self.name in ("none", "alternate"):
            return torch.ones(coins.n, dtype=torch.bool)
        return coins.table_KN[0].clone()

    def start(self, coins: CoinStream) -> HandoffState:
        """Initial state of a batch."""
        n = coins.n
        zeros = torch.zeros(n, dtype=torch.long)
        return HandoffState(self.first_authors(coins), zeros, zeros + 1, torch.zeros(n, dtype=torch.bool),
                            torch.ones(n, dtype=torch.bool), 0)

    def advance(self, state: HandoffState, tok_B: torch.Tensor, coins: CoinStream) -> HandoffState:
        """State after each sequence emitted ``tok_B``: decides the author of the next token."""
        tok_B = tok_B.long().cpu()
        if self.name in NEEDS_TABLE:
            self.needed_table()
        if self.table is not None:
            flags = (self.table.boundary_V[tok_B], self.table.ends_nl_V[tok_B], self.table.nl2_V[tok_B],
                     self.table.starts_nl_V[tok_B])
        else:
            flags = (torch.zeros_like(state.author_B),) * 4
        author, gap, rounds, turn_nl, due = self.after(state.author_B, state.gap_B, state.rounds_B, state.turn_nl_B,
                                                       flags, lambda: coins.row(state.t + 1))
        return HandoffState(author, gap, rounds, turn_nl, torch.as_tensor(due).expand_as(author).clone(), state.t + 1)

    def after(self, author, gap, rounds, turn_nl, flags, coin):
        """The rule, on one sequence (bools and ints) or a batch (tensors): the state after a token with
        ``flags = (boundary, ends_nl, nl2, starts_nl)``; ``coin()`` reads the coin due there. Returns
        ``(author, gap, rounds, turn_nl, due)``, ``due`` where a coin fell."""
        boundary, ends_nl, nl2, starts_nl = flags
        gap = gap + 1
        if self.name == "word":
            due = boundary | (gap >= self.max_gap)
        elif self.name == "chunk":
            due = gap >= self.chunk_size
        elif self.level == "step":
            due = step_end(nl2, starts_nl, turn_nl)
        else:  # bernoulli: after every token; none: never
            due = (gap > 0) if self.name == "bernoulli" else (gap < 0)
        if self.name == "alternate":
            new = author ^ due
        elif self.name == "none":
            new = author
        else:
            new = author ^ (due & (coin() ^ author))
        rounds = rounds + _int(new != author)
        return new, _where(due, 0, gap), rounds, ends_nl & (due ^ True), due

    def needed_table(self) -> TokenTable:
        """The token table, which ``word``, ``step`` and ``alternate`` need (a clear error without one)."""
        if self.table is None:
            raise ValueError(f"handoff schedule {self.name!r} needs a token table (pass a tokenizer)")
        return self.table


class SequenceSchedule:
    """One sequence's schedule state, for engines that write whole turns (vLLM, the text bridge).

    Feed it the tokens a turn produced (:meth:`feed`, one at a time); it answers who writes next.
    Before a turn, :meth:`max_turn_tokens` says how many tokens can come before the next possible coin
    and :meth:`stop_strings` which texts end the turn early (the engine may stop on them; the
    schedule, fed the tokens, decides).
    """

    def __init__(self, schedule: Schedule, coins: CoinStream, b: int, first_author: bool | None = None):
        self.schedule, self.coins, self.b = schedule, coins, b
        self.author = bool(schedule.first_authors(coins)[b]) if first_author is None else first_author
        self.gap, self.rounds, self.turn_nl = 0, 1, False
        self.t, self.steps = 0, 0  # tokens fed; step ends passed by end_step()
        self.fresh = True  # the author was just decided (start, or a coin fell): HandoffState.fresh_B

    def _after(self, flags, k: int) -> bool:
        self.author, self.gap, self.rounds, self.turn_nl, due = self.schedule.after(
            self.author, self.gap, self.rounds, self.turn_nl, flags, lambda: self.coins.draw(self.b, k))
        self.fresh = bool(due)
        return bool(due)

    def decision(self) -> int:
        """The record of the next token (``Rollout.turn_author_BT``): the author where it was just decided, else -1."""
        return int(self.author) if self.fresh else -1

    def feed(self, tok: int, table: TokenTable | None = None) -> bool:
        """Advance past one emitted token; True when a coin fell after it (the turn ends there, though
        the coin may keep the same author). ``table``: the flags of the vocabulary ``tok`` belongs to, where
        the authors' vocabularies differ (the turn driver); default the schedule's own table."""
        if table is None:
            table = self.schedule.needed_table() if self.schedule.name in NEEDS_TABLE else self.schedule.table
        flags = table.rows[tok] if table is not None else (False, False, False, False)
        self.t += 1
        return self._after(flags, self.t)

    def end_step(self) -> bool:
        """Advance past a turn that ended a step in another vocabulary (the text bridge): the coin
        of the row's next step end. Step-level schedules only."""
        if self.schedule.level != "step":
            raise ValueError(f"end_step() is for step-level schedules, not {self.schedule.name!r}")
        self.steps += 1
        return self._after((False, False, True, False), self.steps)

    def max_turn_tokens(self) -> int | None:
        """Tokens the current author may write before the next coin that does not depend on the text:
        ``bernoulli`` 1, ``chunk`` the rest of the chunk, ``word`` the rest of ``max_gap``; None otherwise."""
        s = self.schedule
        return {"bernoulli": 1, "chunk": s.chunk_size - self.gap, "word": s.max_gap - self.gap}.get(s.name)

    def stop_strings(self) -> list[str]:
        """Texts at which a turn of a step-level schedule ends (an engine's stop strings)."""
        return [STEP_END] if self.schedule.level == "step" else []

    def boundary_ids(self) -> list[int]:
        """Token ids after which the ``word`` schedule draws a coin (an engine's stop token ids)."""
        if self.schedule.name != "word":
            return []
        return self.schedule.needed_table().boundary_V.nonzero().flatten().tolist()

    def over(self, max_rounds: int | None) -> bool:
        """Whether this sequence has started more turns than ``max_rounds`` (it stops)."""
        return bool(over_rounds(self.rounds, max_rounds))


def make_schedule(
    name: str,
    tokenizer=None,
    *,
    p: float = 0.5,
    max_gap: int = 32,
    chunk_size: int = 16,
    vocab_size: int | None = None,
    table: TokenTable | None = None,
) -> Schedule:
    """Build a schedule by name (one of :data:`SCHEDULES`); unknown names and bad values raise."""
    check_name(name)
    if not 0.0 <= p <= 1.0:
        raise ValueError(f"handoff.p must be in [0, 1], got {p}")
    if max_gap < 1 or chunk_size < 1:
        raise ValueError(f"handoff.max_gap and chunk_size must be >= 1, got {max_gap}, {chunk_size}")
    if name in NEEDS_TABLE and table is None:
        if tokenizer is None:
            raise ValueError(f"handoff schedule {name!r} needs the tokenizer to find its boundaries")
        table = token_table(tokenizer, vocab_size)
    if name == "word" and not bool(table.boundary_V.any()):
        raise ValueError(
            f"tokenizer {getattr(tokenizer, 'name_or_path', '?')!r} has no word-start tokens "
            f"(none starts with {WORD_MARKERS}); the 'word' schedule cannot be used with it"
        )
    return Schedule(name=name, p=float(p), max_gap=int(max_gap), chunk_size=int(chunk_size), table=table)


def simulate(schedule: Schedule, tokens_BT: torch.Tensor, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """Authors of a fixed token stream: returns ``(owner_BT, rounds_B)``; for tests and analysis.
    ``seed`` is a rollout's seed: the coins are those an engine draws for it."""
    coins = schedule.coins(tokens_BT.shape[0], seed)
    state = schedule.start(coins)
    owner = torch.zeros(tokens_BT.shape, dtype=torch.long)
    for t in range(tokens_BT.shape[1]):
        owner[:, t] = state.author_B.long()
        state = schedule.advance(state, tokens_BT[:, t], coins)
    return owner, state.rounds_B
