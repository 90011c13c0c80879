"""Handoff schedules: who writes the next token of each sequence. What each schedule *is* (its rule, its
level, how it picks authors, its parameters) is registered once in :mod:`tandem_rlvr.engines.schedules`; this
module runs those rules for every rollout engine, and no engine repeats one.

A :class:`Schedule` is a small immutable object: a registered definition, P(senior) ``p``, the definition's
parameters and the token table its rule reads. Its randomness comes from a :class:`CoinStream` (seeded, so
the same seed and token stream give the same authors). It decides, after each token:

- **who writes first**: the senior for deterministic schedules (``none``, ``alternate``), else coin 0;
- **when a coin falls**: where the definition's rule says so (docs/engines.md "Handoff schedules"; each
  rule's docstring in :mod:`tandem_rlvr.engines.schedules`): ``none`` never, ``bernoulli`` after every token, ``word`` after each
  word-start token or ``max_gap`` tokens without one, ``step`` / ``alternate`` at each step end, ``chunk``
  after every ``chunk_size`` tokens, ``sentence`` after each sentence end or ``max_gap`` tokens without one;
- **where a step ends**: at the token that completes the first ``"\\n\\n"`` of the current step:
  a token whose text holds ``"\\n\\n"``, or a token starting with ``"\\n"`` right after one ending
  with ``"\\n"`` *in the same step* (a tokenizer may split ``"\\n\\n"`` in two; the newline that ended
  the previous step or the other author's turn never counts);
- **the coins**: draw ``k`` of one seeded stream, row ``b``: draw 0 picks the first author, the coin
  after response token ``t`` is draw ``t + 1`` (token-level engines share the token positions), and
  the text bridge (whose authors do not share token positions) takes draw ``k`` at a row's ``k``-th
  step end. A coin may keep the same author; ``alternate`` flips at each decision, ``none`` never decides;
- **rounds**: author turns, 1 at the start, +1 at every change of author. A sequence ends once it
  would start turn ``max_rounds + 1`` (the evaluation's "at most 150 rounds").

Two views of the same rules: :meth:`Schedule.start` / :meth:`Schedule.advance` step a whole batch
at once (vectorised, for the in-process engine), :class:`SequenceSchedule` one sequence token by
token or turn by turn (for engines that write whole turns: vLLM, the text bridge).
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from functools import cached_property

import torch

from tandem_rlvr.engines.schedules import (SCHEDULES, STEP_END, TOKEN_FLAGS, ScheduleDef, get_schedule,
                                           schedule_names, step_end)

__all__ = ["SCHEDULES", "STEP_END", "SCHEDULE_SEED_OFFSET", "TokenTable", "token_table", "CoinStream", "HandoffState",
           "Schedule", "SequenceSchedule", "make_schedule", "simulate", "step_end", "over_rounds"]

SCHEDULE_SEED_OFFSET = 1_000_003  # the coin stream of seed s is seeded s + this (sampling uses s itself)
CORE_FLAGS = ("boundary", "ends_nl", "nl2", "starts_nl")  # read by the turn driver too (step ends)


class TokenTable:
    """Per-vocabulary-id flags derived once from a tokenizer (special tokens: all False), one bool tensor per
    flag of :data:`~tandem_rlvr.engines.schedules.TOKEN_FLAGS`, passed as ``<flag>_V``.

    ``boundary_V``: the token starts a word. ``ends_nl_V``: its text ends with a newline.
    ``nl2_V``: its text holds ``"\\n\\n"``. ``starts_nl_V``: its text starts with a newline. Flags a
    hand-built table leaves out are False for every id.
    """

    def __init__(self, boundary_V=None, ends_nl_V=None, nl2_V=None, starts_nl_V=None, **more_V):
        given = dict(zip(CORE_FLAGS, (boundary_V, ends_nl_V, nl2_V, starts_nl_V)))
        for key, value in more_V.items():
            if not key.endswith("_V") or key[:-2] not in TOKEN_FLAGS:
                raise TypeError(f"TokenTable: unknown flag {key!r}; flags: {', '.join(f + '_V' for f in TOKEN_FLAGS)}")
            given[key[:-2]] = value
        size = next(int(v.numel()) for v in given.values() if v is not None)
        self.flags_V = {k: v if v is not None else torch.zeros(size, dtype=torch.bool) for k, v in given.items()}

    def flag(self, name: str) -> torch.Tensor:
        """The flag ``name`` of every id (False everywhere for a flag registered after this table was built)."""
        if name not in self.flags_V:
            if name not in TOKEN_FLAGS:
                raise KeyError(f"unknown token flag {name!r}")
            self.flags_V[name] = torch.zeros(self.vocab_size, dtype=torch.bool)
        return self.flags_V[name]

    boundary_V = property(lambda self: self.flags_V["boundary"])
    ends_nl_V = property(lambda self: self.flags_V["ends_nl"])
    nl2_V = property(lambda self: self.flags_V["nl2"])
    starts_nl_V = property(lambda self: self.flags_V["starts_nl"])

    @property
    def vocab_size(self) -> int:
        return int(self.flags_V["boundary"].numel())

    @cached_property
    def rows(self) -> list[tuple[bool, bool, bool, bool]]:
        """``(boundary, ends_nl, nl2, starts_nl)`` per id as plain bools."""
        return list(zip(*(self.flags_V[f].tolist() for f in CORE_FLAGS)))

    @cached_property
    def lists(self) -> dict[str, list[bool]]:
        """Every flag as a plain list of bools (fast per-token lookups: the sequence view)."""
        return {k: self.flag(k).tolist() for k in TOKEN_FLAGS}


def token_table(tokenizer, vocab_size: int | None = None) -> TokenTable:
    """Build the :class:`TokenTable` of ``tokenizer`` (padded to ``vocab_size`` model rows if larger)."""
    n_tok = len(tokenizer)
    size = max(n_tok, vocab_size or 0)
    raw = tokenizer.convert_ids_to_tokens(list(range(n_tok)))
    special = set(getattr(tokenizer, "all_special_ids", []) or [])
    names = tuple(TOKEN_FLAGS)
    flags = torch.zeros(len(names), size, dtype=torch.bool)
    for i in range(n_tok):
        if i in special or raw[i] is None:
            continue
        text = tokenizer.decode([i], clean_up_tokenization_spaces=False)
        flags[:, i] = torch.tensor([TOKEN_FLAGS[n](raw[i], text) for n in names])
    return TokenTable(**{f"{n}_V": flags[j] for j, n in enumerate(names)})


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
    ``gap_B``: tokens since the last coin; ``turn_nl_B``: what the rule carries over from the last token of
    the current turn (``step``: it ended with a newline; ``sentence``: with a sentence mark); ``fresh_B``: the
    author was just decided (at the start and wherever a coin fell, even one that kept the author: the
    engines' record of decisions, ``Rollout.turn_author_BT``); ``t``: tokens emitted so far."""

    author_B: torch.Tensor
    gap_B: torch.Tensor
    rounds_B: torch.Tensor
    turn_nl_B: torch.Tensor
    fresh_B: torch.Tensor
    t: int = 0


def _known_params() -> dict:
    """Every parameter any registered schedule declares, by name."""
    return {p.name: p for n in schedule_names() for p in get_schedule(n).params}


class _Flags:
    """The flags of the token(s) just emitted, read lazily by a rule: ``f[name]`` is ``read(table(), name)``
    (a schedule whose rule reads no flag needs no table)."""

    def __init__(self, table, read):
        self.table, self.read = table, read

    def __getitem__(self, name: str):
        return self.read(self.table(), name)


@dataclass(frozen=True, init=False)
class Schedule:
    """A handoff schedule: ``Schedule(name, p=0.5, table=None, **params)`` or :func:`make_schedule` (which
    also builds the table from a tokenizer).

    ``p`` is P(senior) of each coin; ``params`` the definition's parameters (``max_gap``: the word and
    sentence schedules' K; ``chunk_size``: the chunk schedule's N), also readable as attributes (a parameter
    this schedule does not declare reads as its default). ``table`` is needed where the definition reads
    token flags (``word``, ``step``, ``alternate``, ``sentence``).
    """

    name: str
    p: float
    params: tuple[tuple[str, int], ...]
    table: TokenTable | None = field(repr=False, compare=False)

    def __init__(self, name: str, p: float = 0.5, table: TokenTable | None = None, **params):
        spec, known = get_schedule(name), _known_params()
        unknown = [k for k in params if k not in known]
        if unknown:
            raise ValueError(f"unknown handoff parameter(s) {', '.join(unknown)}; known: {', '.join(known)}")
        given = {k: known[k].check(v) for k, v in params.items()}  # every value given is checked, used or not
        object.__setattr__(self, "name", name)
        object.__setattr__(self, "p", float(p))
        object.__setattr__(self, "params", tuple(spec.param_values(given).items()))
        object.__setattr__(self, "table", table)

    def __getattr__(self, key: str):
        if key.startswith("_") or key in ("name", "p", "params", "table"):
            raise AttributeError(key)
        values = dict(self.params)
        if key in values:
            return values[key]
        known = _known_params()
        if key in known:
            return known[key].default
        raise AttributeError(f"{type(self).__name__!r} object has no attribute {key!r}")

    @property
    def spec(self) -> ScheduleDef:
        """The registered definition (:mod:`tandem_rlvr.engines.schedules`)."""
        return get_schedule(self.name)

    @property
    def level(self) -> str:
        """``solo``, ``token`` or ``step``: where this schedule's coins can fall."""
        return self.spec.level

    @property
    def uses_junior(self) -> bool:
        """Whether the junior can ever author a token under this schedule."""
        authors = self.spec.authors
        return authors == "alternate" or (authors == "coins" and self.p < 1.0)

    def to_dict(self) -> dict:
        """The schedule as plain values (name, p, its parameters): what an engine in another process needs
        (the dual vLLM engine's request arguments); :meth:`from_dict` rebuilds it."""
        return {"schedule": self.name, "p": self.p, **dict(self.params)}

    @classmethod
    def from_dict(cls, args: dict, table: TokenTable | None = None) -> Schedule:
        """The schedule of :meth:`to_dict`'s ``args`` (other keys are ignored) with ``table``."""
        spec = get_schedule(args["schedule"])
        missing = [p.name for p in spec.params if p.name not in args]
        if missing:
            raise ValueError(f"handoff schedule {spec.name!r} arguments lack {', '.join(missing)}")
        return cls(spec.name, p=args["p"], table=table, **{p.name: args[p.name] for p in spec.params})

    def coins(self, n: int, seed: int) -> CoinStream:
        """The seeded coin stream of ``n`` sequences."""
        return CoinStream(n, self.p, seed)

    def first_authors(self, coins: CoinStream) -> torch.Tensor:
        """Who writes the first response token of each sequence (True = senior)."""
        if self.spec.deterministic:
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
        flags = _Flags(self.needed_table, lambda table, name: table.flag(name)[tok_B])
        author, gap, rounds, carry, due = self.after(state.author_B, state.gap_B, state.rounds_B, state.turn_nl_B,
                                                     flags, lambda: coins.row(state.t + 1))
        due = torch.as_tensor(due).expand_as(author).clone()
        return HandoffState(author, gap, rounds, torch.as_tensor(carry).expand_as(author).clone(), due, state.t + 1)

    def after(self, author, gap, rounds, carry, flags, coin):
        """The rule, on one sequence (bools and ints) or a batch (tensors): the state after a token whose
        flags ``flags[name]`` reads; ``coin()`` reads the coin due there. Returns
        ``(author, gap, rounds, carry, due)``, ``due`` where a coin fell."""
        spec = self.spec
        gap = gap + 1
        due, carry = spec.rule(flags, gap, carry, dict(self.params))
        if spec.authors == "alternate":
            new = author ^ due
        elif spec.authors == "senior":
            new = author
        else:
            new = author ^ (due & (coin() ^ author))
        rounds = rounds + _int(new != author)
        carry = (carry & (due ^ True)) if carry is not None else (due & False)
        return new, _where(due, 0, gap), rounds, carry, due

    def needed_table(self) -> TokenTable:
        """The token table, which schedules that read token flags need (a clear error without one)."""
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
        flags = _Flags(self.schedule.needed_table if table is None else lambda: table,
                       lambda tab, name: tab.lists[name][tok])
        self.t += 1
        return self._after(flags, self.t)

    def end_step(self) -> bool:
        """Advance past a turn that ended a step in another vocabulary (the text bridge): the coin
        of the row's next step end. Step-level schedules only."""
        if self.schedule.level != "step":
            raise ValueError(f"end_step() is for step-level schedules, not {self.schedule.name!r}")
        self.steps += 1
        return self._after(defaultdict(bool, nl2=True), self.steps)

    def max_turn_tokens(self) -> int | None:
        """Tokens the current author may write before the next coin that does not depend on the text
        (``bernoulli`` 1, ``chunk`` the rest of the chunk, ``word`` and ``sentence`` the rest of ``max_gap``);
        None where every coin depends on the text."""
        turn_tokens = self.schedule.spec.turn_tokens
        return turn_tokens(self.gap, dict(self.schedule.params)) if turn_tokens else None

    def stop_strings(self) -> list[str]:
        """Texts at which a turn of a step-level schedule ends (an engine's stop strings)."""
        return [STEP_END] if self.schedule.level == "step" else []

    def boundary_ids(self) -> list[int]:
        """Token ids after which the ``word`` schedule draws a coin (an engine's stop token ids)."""
        if "boundary" not in self.schedule.spec.flags:
            return []
        return self.schedule.needed_table().boundary_V.nonzero().flatten().tolist()

    def over(self, max_rounds: int | None) -> bool:
        """Whether this sequence has started more turns than ``max_rounds`` (it stops)."""
        return bool(over_rounds(self.rounds, max_rounds))


def make_schedule(name: str, tokenizer=None, *, p: float = 0.5, vocab_size: int | None = None,
                  table: TokenTable | None = None, **params) -> Schedule:
    """Build a schedule by name (one of :data:`SCHEDULES`); ``params`` its parameters (``max_gap``,
    ``chunk_size``; any registered parameter is accepted and checked, used or not). Unknown names and bad
    values raise."""
    spec = get_schedule(name)
    if not 0.0 <= p <= 1.0:
        raise ValueError(f"handoff.p must be in [0, 1], got {p}")
    schedule = Schedule(name, p=float(p), **params)
    if spec.needs_table and table is None:
        if tokenizer is None:
            raise ValueError(f"handoff schedule {name!r} needs the tokenizer to find its boundaries")
        table = token_table(tokenizer, vocab_size)
    problem = spec.table_problem(lambda flag: bool(table.flag(flag).any())) if spec.table_problem else None
    if problem:
        raise ValueError(f"tokenizer {getattr(tokenizer, 'name_or_path', '?')!r} {problem}; "
                         f"the {name!r} schedule cannot be used with it")
    return Schedule(name, p=schedule.p, table=table, **dict(schedule.params))


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
