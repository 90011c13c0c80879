"""The fail-closed check of a tandem step's ownership mask, independent of the batch size.

The trlvr loss trains only on senior tokens (``response_mask * owner``). A lost or wrong mask would
silently turn the run into something else, so every step checks the mask against the schedule's own
record of its decisions (see :class:`~tandem_rlvr.engines.types.Rollout`), and the decisions against
``handoff.p``:

1. **Mask vs. record.** Where the engine records ``turn_author_BT`` (the in-process engine and the
   vLLM backend), the author of every response token must be the author the schedule chose at the
   last decision before it; a deterministic schedule's decisions must be the ones its definition gives
   (:meth:`~tandem_rlvr.engines.schedules.ScheduleDef.fixed_author`: ``alternate`` starts with the senior and
   alternates, ``none`` is all senior). One disagreeing token stops the run. The text bridge
   re-encodes the final text, so it has no token-level record: it records each row's turns, and a
   row whose turns all went to one author must be owned entirely by that author (an all-senior or
   all-junior mask on a row with turns of both authors is caught by 2. under ``step``; ``alternate``
   has no coins, so there only the rows are checked). A rollout with no record at all stops the run.
2. **Coins vs. p.** For coin schedules (``authors="coins"``: bernoulli, word, step, chunk, sentence) the
   outcomes of the coins that decided who writes are i.i.d. Bernoulli(p): each coin is drawn before,
   and independently of, the decision to use it (a redraw depends on the tokens so far only). Their expectation is p
   whatever the word or step lengths, unlike the senior *token* share. With ``n`` coins of which
   ``k`` chose the senior, the step stops when ``|k/n - p| > eps(n)`` with
   ``eps(n) = sqrt(ln(2 N / delta) / (2 n))``, ``N`` an upper bound on ``n`` fixed before the step
   (rows × max_new_tokens) and ``delta = 1e-6``: by Hoeffding's inequality
   ``P(|k_m/m - p| >= eps(m)) <= 2 exp(-2 m eps(m)^2) = delta / N`` for each fixed ``m``, and a
   union bound over ``m = 1..N`` keeps the false-alarm rate of a correct step below ``delta``.
   With p = 0 or 1 every coin must come out that way.

The senior *token* share stays a logged metric (``rollout/senior_token_frac``); ``algo.senior_frac_band``
adds an explicit band on it when set (the paper config sets [0.3, 0.7] for its large batches).
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch

from tandem_rlvr.errors import TandemError
from tandem_rlvr.engines.handoff import Schedule
from tandem_rlvr.engines.schedules import get_schedule
from tandem_rlvr.engines.types import Rollout

FALSE_ALARM = 1e-6  # per step: the chance that a correct step fails the coin test


def coin_tolerance(n: int, n_max: int, delta: float = FALSE_ALARM) -> float:
    """Half-width of the allowed band of the senior coin share over ``n`` coins (see the module docstring)."""
    return math.sqrt(math.log(2 * max(n_max, n, 1) / delta) / (2 * max(n, 1)))


def _expected_owner(turn_BT: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The author of each token by the record (the latest decision at or before it) and where one exists."""
    T = turn_BT.shape[1]
    pos = torch.arange(T, device=turn_BT.device).expand_as(turn_BT)
    last = torch.where(turn_BT >= 0, pos, torch.full_like(pos, -1)).cummax(-1).values
    return turn_BT.gather(1, last.clamp(min=0)), last >= 0


def token_disagreements(rollout: Rollout) -> int:
    """Response tokens whose owner is not the author the schedule's record gives them (or that have no decision)."""
    turn = rollout.turn_author_BT.long()
    live = rollout.response_mask_BT.bool()
    expected, decided = _expected_owner(turn)
    bad = live & (~decided | (expected != rollout.owner_BT.long()))
    decision = live & (turn >= 0)
    fixed = get_schedule(rollout.schedule).fixed_author(decision.long().cumsum(-1) - 1)  # decision k's author
    if fixed is not None:  # a deterministic schedule (none: all senior; alternate: senior first, then alternating)
        bad |= decision & (turn != fixed.long())
    return int(bad.sum())


def row_disagreements(rollout: Rollout) -> int:
    """Rows (text bridge) whose tokens contradict their turns (``decisions_B``: the row's turns,
    ``senior_decisions_B``: the senior's): a row with tokens but no turn, or whose turns all went to one
    author while its tokens are not all that author's."""
    live = rollout.response_mask_BT.bool().cpu()
    own = (rollout.owner_BT.long().cpu() * live).sum(-1)
    n_live = live.sum(-1)
    turns, senior = rollout.decisions_B.long().cpu(), rollout.senior_decisions_B.long().cpu()
    one_author = (senior == 0) | (senior == turns)
    expected = torch.where(senior == 0, torch.zeros_like(n_live), n_live)  # its senior tokens if one author wrote it
    bad = (n_live > 0) & ((turns == 0) | (one_author & (own != expected)))
    return int(bad.sum())


def check_ownership(rollout: Rollout, schedule: Schedule, budget: int,
                    reduce: Callable[[float], float] = float) -> dict:
    """Stop the run when the ownership mask disagrees with the record of ``schedule`` (the run's: its name and
    its ``p``); returns the coin metrics.

    ``reduce`` sums a number over the processes (identity in one process); ``budget`` is
    ``rollout.max_new_tokens`` (for the bound on the number of coins).
    """
    name, p = schedule.name, schedule.p
    if rollout.owner_BT is None:
        raise TandemError("the trlvr arm needs ownership records, but the rollout has none")
    if rollout.schedule != name:
        raise TandemError(f"the rollout was written under handoff schedule {rollout.schedule!r}, "
                          f"but the run's schedule is {name!r}; refusing to train on its ownership mask")
    if rollout.turn_author_BT is not None:
        bad, what = token_disagreements(rollout), "tokens"
    elif rollout.decisions_B is not None:
        bad, what = row_disagreements(rollout), "rows (text bridge: per-row check)"
    else:
        raise TandemError("the rollout engine recorded none of the handoff schedule's decisions "
                          "(Rollout.turn_author_BT / decisions_B); refusing to train on an ownership mask that cannot be checked")
    bad = reduce(float(bad))
    if bad:
        raise TandemError(f"the ownership mask disagrees with the handoff schedule's record of authors at {int(bad)} "
                          f"{what} of this step (handoff.schedule={name}); refusing to train on it")
    if schedule.spec.deterministic:  # no coins to test
        return {}
    n = reduce(float(rollout.decisions_B.sum()))
    k = reduce(float(rollout.senior_decisions_B.sum()))
    if n == 0:
        return {}
    n_max = reduce(float(rollout.batch_size)) * budget
    share = k / n
    tol = 0.0 if p in (0.0, 1.0) else coin_tolerance(int(n), int(n_max))
    if abs(share - p) > tol:
        raise TandemError(f"{int(k)} of {int(n)} handoff coins chose the senior ({share:.3f}), outside p={p} ± {tol:.3f} "
                          f"(false-alarm rate < {FALSE_ALARM:g} per step); the handoff is not doing what the config says")
    return {"rollout/coins": n, "rollout/senior_coin_frac": share}
