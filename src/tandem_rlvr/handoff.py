"""Handoff schedules: who writes the next token of each sequence.

A schedule is a small immutable object. Its state lives in a :class:`HandoffState` that the rollout
engine threads through decoding, and all its randomness comes from a ``torch.Generator`` the caller
passes, so a schedule is pure and seeded: the same generator seed and token stream give the same
authors. Everything is vectorised over the batch (no per-sequence Python loop).

Schedules (METHOD.md §2):

- ``none``: the senior writes everything (a vanilla GRPO rollout).
- ``bernoulli``: a fresh coin P(senior)=p before every token.
- ``word``: a coin at the start and after each emitted *boundary* token (a token whose text starts a
  word: byte-level ``Ġ``, SentencePiece ``▁`` or a leading space), or after ``max_gap`` tokens
  without one. The coin may keep the same author. Paper: p = 0.5, K = 32.
- ``step``: a coin at the start and after each step end (the text so far ends with ``"\\n\\n"``).
- ``alternate``: the senior writes the first step, then strict alternation at step ends.
- ``chunk``: a coin at the start and after every ``chunk_size`` tokens.

``rounds_B`` counts author turns (1 at the start, +1 at every change of author); the engine uses it
for the evaluation's "at most 150 rounds".
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, replace

import torch

SCHEDULES = ("none", "bernoulli", "word", "step", "alternate", "chunk")
COIN_SCHEDULES = ("bernoulli", "word", "step", "chunk")  # authors drawn by coins with P(senior) = p
WORD_MARKERS = ("Ġ", "▁", " ")


@dataclass(frozen=True)
class TokenTable:
    """Per-vocabulary-id flags derived once from a tokenizer.

    ``boundary_V``: the token starts a word. ``ends_nl_V``: its text ends with a newline.
    ``ends_nl2_V``: its text ends with two newlines. ``starts_nl_V``: its text starts with a newline
    (so a ``"\\n"`` after a token ending in ``"\\n"`` closes a step even when the tokenizer splits
    ``"\\n\\n"`` in two).
    """

    boundary_V: torch.Tensor
    ends_nl_V: torch.Tensor
    ends_nl2_V: torch.Tensor
    starts_nl_V: torch.Tensor

    @property
    def vocab_size(self) -> int:
        return int(self.boundary_V.numel())


def token_table(tokenizer, vocab_size: int | None = None) -> TokenTable:
    """Build the :class:`TokenTable` of ``tokenizer`` (padded to ``vocab_size`` model rows if larger)."""
    n_tok = len(tokenizer)
    size = max(n_tok, vocab_size or 0)
    raw = tokenizer.convert_ids_to_tokens(list(range(n_tok)))
    special = set(getattr(tokenizer, "all_special_ids", []) or [])
    texts = [tokenizer.decode([i]) if i not in special else "" for i in range(n_tok)]
    flags = torch.zeros(4, size, dtype=torch.bool)
    for i in range(n_tok):
        if i in special or raw[i] is None:
            continue
        flags[0, i] = raw[i].startswith(WORD_MARKERS)
        flags[1, i] = texts[i].endswith("\n")
        flags[2, i] = texts[i].endswith("\n\n")
        flags[3, i] = texts[i].startswith("\n")
    if not bool(flags[0].any()):
        raise ValueError(
            f"tokenizer {getattr(tokenizer, 'name_or_path', '?')!r} has no word-start tokens "
            f"(none starts with {WORD_MARKERS}); the 'word' schedule cannot be used with it"
        )
    return TokenTable(flags[0], flags[1], flags[2], flags[3])


@dataclass(frozen=True)
class HandoffState:
    """Per-sequence schedule state. ``author_B``: True where the senior writes the next token;
    ``fresh_B``: True where that author was just decided (at the start, and at every redraw)."""

    author_B: torch.Tensor
    gap_B: torch.Tensor
    rounds_B: torch.Tensor
    prev_nl_B: torch.Tensor
    fresh_B: torch.Tensor


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
    def uses_junior(self) -> bool:
        """Whether the junior can ever author a token under this schedule."""
        return self.name != "none" and (self.name == "alternate" or self.p < 1.0)

    def start(self, batch_size: int, gen: torch.Generator) -> HandoffState:
        """Initial state: who writes the first response token."""
        if self.name == "none" or self.name == "alternate":
            author = torch.ones(batch_size, dtype=torch.bool)
        else:
            author = _coin(batch_size, self.p, gen)
        zeros = torch.zeros(batch_size, dtype=torch.long)
        return HandoffState(author, zeros, zeros + 1, torch.zeros(batch_size, dtype=torch.bool),
                            torch.ones(batch_size, dtype=torch.bool))

    def advance(self, state: HandoffState, tok_B: torch.Tensor, gen: torch.Generator) -> HandoffState:
        """State after each sequence emitted ``tok_B``: decides the author of the next token."""
        tok_B = tok_B.long().cpu()
        gap = state.gap_B + 1
        prev_nl = state.prev_nl_B
        if self.name == "none":
            return replace(state, gap_B=gap, fresh_B=torch.zeros_like(state.fresh_B))
        if self.name == "bernoulli":
            redraw = torch.ones_like(state.author_B)
        elif self.name == "chunk":
            redraw = gap >= self.chunk_size
        elif self.name == "word":
            redraw = self._table().boundary_V[tok_B] | (gap >= self.max_gap)
        else:  # step / alternate
            t = self._table()
            redraw = t.ends_nl2_V[tok_B] | (prev_nl & t.starts_nl_V[tok_B])
            prev_nl = t.ends_nl_V[tok_B]
        if self.name == "alternate":
            new_author = torch.where(redraw, ~state.author_B, state.author_B)
        else:
            # Draw coins for the whole batch every step, so the stream is independent of which rows redraw.
            coins = _coin(tok_B.numel(), self.p, gen)
            new_author = torch.where(redraw, coins, state.author_B)
        gap = torch.where(redraw, torch.zeros_like(gap), gap)
        rounds = state.rounds_B + (new_author != state.author_B).long()
        return HandoffState(new_author, gap, rounds, prev_nl, redraw)

    def _table(self) -> TokenTable:
        if self.table is None:
            raise ValueError(f"handoff schedule {self.name!r} needs a token table (pass a tokenizer)")
        return self.table


def _coin(n: int, p: float, gen: torch.Generator) -> torch.Tensor:
    return torch.rand(n, generator=gen) < p


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
    if name not in SCHEDULES:
        raise ValueError(f"unknown handoff schedule {name!r}; choose one of {', '.join(SCHEDULES)}")
    if not 0.0 <= p <= 1.0:
        raise ValueError(f"handoff.p must be in [0, 1], got {p}")
    if max_gap < 1 or chunk_size < 1:
        raise ValueError(f"handoff.max_gap and chunk_size must be >= 1, got {max_gap}, {chunk_size}")
    if name in ("word", "step", "alternate") and table is None:
        if tokenizer is None:
            raise ValueError(f"handoff schedule {name!r} needs the tokenizer to find its boundaries")
        table = token_table(tokenizer, vocab_size)
    return Schedule(name=name, p=float(p), max_gap=int(max_gap), chunk_size=int(chunk_size), table=table)


def simulate(schedule: Schedule, tokens_BT: torch.Tensor, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """Authors of a fixed token stream: returns ``(owner_BT, rounds_B)``; for tests and analysis."""
    gen = torch.Generator().manual_seed(seed)
    state = schedule.start(tokens_BT.shape[0], gen)
    owner = torch.zeros(tokens_BT.shape, dtype=torch.long)
    for t in range(tokens_BT.shape[1]):
        owner[:, t] = state.author_B.long()
        state = schedule.advance(state, tokens_BT[:, t], gen)
    return owner, state.rounds_B


# -- one sequence at a time (engines that serve turns, e.g. tandem_rlvr.vllm_turns) ------------------
TURN_SCHEDULES = ("none", "bernoulli", "word", "chunk")  # rules that need no look-back beyond the carry
CONTENT_FREE = ("none", "bernoulli", "chunk")  # where a coin is due does not depend on the tokens


@dataclass
class RowCarry:
    """One sequence's schedule state between two of its tokens: :class:`HandoffState` for one row."""

    author: bool
    gap: int = 0
    prev_nl: bool = False
    rounds: int = 1
    fresh: bool = True  # the author was just decided (start, redraw): HandoffState.fresh_B


def row_start(schedule: Schedule, coin0: bool) -> RowCarry:
    """A row's carry before its first response token; ``coin0`` is the row's draw 0 (see :meth:`Schedule.start`)."""
    return RowCarry(author=True if schedule.name in ("none", "alternate") else bool(coin0))


def row_redraws(schedule: Schedule, carry: RowCarry, tok: int) -> bool:
    """Whether a coin is due after ``tok`` (the row's gap already counts ``tok``): :meth:`Schedule.advance`'s rule."""
    name = schedule.name
    if name == "none":
        return False
    if name == "bernoulli":
        return True
    if name == "chunk":
        return carry.gap >= schedule.chunk_size
    if name == "word":
        return bool(schedule._table().boundary_V[tok]) or carry.gap >= schedule.max_gap
    t = schedule._table()
    return bool(t.ends_nl2_V[tok]) or (carry.prev_nl and bool(t.starts_nl_V[tok]))


def row_advance(schedule: Schedule, carry: RowCarry, tok: int, coin: Callable[[], bool]) -> bool:
    """Advance one row's carry past ``tok`` in place, exactly as :meth:`Schedule.advance` does for that row.

    ``coin()`` returns the row's draw for this position (called only when a coin is due). Returns
    whether the author changed (``rounds`` counts it).
    """
    carry.gap += 1
    redraw = row_redraws(schedule, carry, tok)
    carry.fresh = bool(redraw)
    if schedule.name in ("step", "alternate"):
        carry.prev_nl = bool(schedule._table().ends_nl_V[tok])
    if not redraw:
        return False
    new = (not carry.author) if schedule.name == "alternate" else bool(coin())
    carry.gap = 0
    switched = new != carry.author
    carry.author = new
    carry.rounds += int(switched)
    return switched


def turn_limits(schedule: Schedule, carry: RowCarry, coin_at: Callable[[int], bool], room: int) -> tuple[int, bool]:
    """How far the current author may write in one request: ``(max_tokens, stop_at_word_starts)``.

    Where a coin is due does not depend on the tokens (``none``, ``bernoulli``, ``chunk``), the
    pre-drawn coins give the exact turn length: the request ends at the first coin that changes the
    author (``coin_at(k)`` is the coin after the turn's ``k``-th token). Under ``word`` the turn may
    end at any word start (the second value) and at the latest at the ``max_gap`` cap. Never more
    than ``room`` tokens.
    """
    if schedule.name == "word":
        return max(1, min(room, schedule.max_gap - carry.gap)), True
    if schedule.name not in CONTENT_FREE:
        raise ValueError(f"handoff schedule {schedule.name!r} has no turn-level rule; one of {', '.join(TURN_SCHEDULES)}")
    probe = RowCarry(carry.author, carry.gap, carry.prev_nl, carry.rounds)
    for k in range(1, room + 1):
        if row_advance(schedule, probe, 0, lambda: coin_at(k)):
            return k, False
    return max(1, room), False


def word_start_ids(schedule: Schedule) -> list[int]:
    """The token ids after which the ``word`` schedule draws a coin (stop ids of a word turn)."""
    return schedule._table().boundary_V.nonzero().flatten().tolist()
