"""The third built-in world, ``dialects``: long chains, a token budget, and two terse dialects that both fit it.

The problems are those of the arithmetic world (:mod:`tandem_rlvr.world.problems`: a start value and
2-8 operations, each one sentence led by an ordinal), drawn from their own seeded, hash-disjoint
splits. Three step styles:

* **plain** — exactly the arithmetic world's plain style (``- Second, she gives away 4: 12 - 4 = 8.``),
  about 15 tokens per operation;
* **shorthand** (dialect A, a per-step habit) — exactly the shorthand world's step (``> -4 = 8``, about
  6 tokens) and a bare ``\\boxed{..}`` answer line;
* **ledger** (dialect B, a whole-chain style) — a marker line of its own (``Ledger:``), then every
  operation as a terse line that keeps the old total, as a ledger keeps the balance brought forward
  (``12 -4 = 8``, about 7 tokens: no sentence and no ordinal), then a bare ``\\boxed{..}``.

The warm-started senior is taught whole chains in ledger with probability ``LEDGER_SHARE``; every other
chain is the shorthand world's per-step mixture (each step shorthand with probability
``SHORTHAND_SHARE``, else plain). So ledger is rare but, once its marker is written, continued — by the
senior and by its frozen copy (the self-paired junior) alike; shorthand is a habit of single steps, which
the copy does not keep up. The token budget (``BUDGET``) fits every shorthand and every ledger solution
but no 7-8 op plain one: reinforcement learning under the budget can be paid by either dialect, and a
chain co-written with the copy is paid only by the one the copy follows.
"""

from __future__ import annotations

import random
import re
from typing import Any

from tandem_rlvr.data import Example
from tandem_rlvr.world import problems as P
from tandem_rlvr.world import shorthand as S
from tandem_rlvr.world.problems import Problem, plain_solution, plain_steps

NAME = "dialects"
BUDGET = 80  # the demo's token budget: every shorthand and every ledger solution fits, no 7-8 op plain one
SHORTHAND_SHARE = 0.25  # share of the steps written in shorthand in the warm senior's non-ledger targets
LEDGER_SHARE = 0.15  # share of the warm senior's targets written, whole, in ledger
LEDGER_MARKER = "Ledger:\n\n"  # the first line of a ledger chain (its own tokens: no other style starts so)
STYLES = ("plain", "shorthand", "ledger")

SPLIT_SPECS: dict[str, dict[str, Any]] = {
    # name: size, chain lengths, hash bucket range (of 100), generator seed (not the other worlds')
    "train": {"size": 2000, "ops": (2, 8), "buckets": (10, 100), "seed": 3001},
    "val": {"size": 64, "ops": (2, 8), "buckets": (0, 3), "seed": 3002},
    "test": {"size": 128, "ops": (2, 8), "buckets": (3, 10), "seed": 3003},
}

shorthand_steps = S.shorthand_steps  # dialect A: the shorthand world's steps, unchanged


def ledger_step(x: int, op) -> str:
    """One ledger step: the old total, the operation and the new total; no sentence, no ordinal."""
    return f"{x} {op.symbol}{op.operand} = {op.apply(x)}\n\n"


def ledger_steps(problem: Problem) -> list[str]:
    """The ledger steps, one per operation, then a bare box (the marker line is not a step)."""
    steps, x = [], problem.start
    for op in problem.ops:
        steps.append(ledger_step(x, op))
        x = op.apply(x)
    steps.append(f"\\boxed{{{x}}}")
    return steps


def ledger_solution(problem: Problem) -> str:
    """The whole-chain terse style: the marker line, then every step in ledger."""
    return LEDGER_MARKER + "".join(ledger_steps(problem))


def solution(problem: Problem, style: str) -> str:
    """The solution of ``problem`` in ``style`` (``plain``, ``shorthand`` or ``ledger``)."""
    return {"plain": plain_solution, "shorthand": S.shorthand_solution, "ledger": ledger_solution}[style](problem)


def steps(problem: Problem, style: str) -> list[str]:
    """The steps of ``problem``'s solution in ``style``, each ending with ``\\n\\n`` but the last (ledger's
    marker line not among them)."""
    return {"plain": plain_steps, "shorthand": shorthand_steps, "ledger": ledger_steps}[style](problem)


def head(problem: Problem, style: str, n: int) -> str:
    """The gold solution's first ``n`` steps in ``style`` (ledger's with its marker line)."""
    return (LEDGER_MARKER if style == "ledger" else "") + "".join(steps(problem, style)[:n])


def dialect_solution(problem: Problem, rng: random.Random, ledger_share: float = LEDGER_SHARE,
                     shorthand_share: float = SHORTHAND_SHARE) -> str:
    """A warm-start target: the whole chain in ledger with probability ``ledger_share``, else a per-step
    mixture (each step shorthand with probability ``shorthand_share``, else plain)."""
    if rng.random() < ledger_share:
        return ledger_solution(problem)
    return S.mixed_solution(problem, rng, shorthand_share)


# ----------------------------------------------------------------------------------------- splits


def generate_split(split: str) -> list[Problem]:
    """The problems of a split (:func:`tandem_rlvr.world.problems.generate_split` over this world's splits)."""
    return P.generate_split(split, SPLIT_SPECS)


def load_split(split: str) -> list[Example]:
    """The split as :class:`tandem_rlvr.data.Example` records (ids ``dial-<split>-<i>``)."""
    return P.load_split(split, SPLIT_SPECS, "dial")


def train_problem(rng: random.Random, n_ops: int) -> Problem:
    """A fresh problem with ``n_ops`` operations from this world's train bucket (never in val/test)."""
    return P.train_problem(rng, n_ops, SPLIT_SPECS)


def sft_problems(seed: int, n_ops_range: tuple[int, int] = (2, 8)):
    """An endless stream of (n_ops, Problem) from this world's train bucket."""
    return P.sft_problems(seed, n_ops_range, SPLIT_SPECS)


def probe_problems(n_ops: int, count: int) -> list[Problem]:
    """``count`` held-out problems (test buckets) with exactly ``n_ops`` operations."""
    return P.held_out_problems(n_ops, count, SPLIT_SPECS, 9000)


# ------------------------------------------------------------------------------------ style

_STEP = {"plain": re.compile(r"(?m)^- "), "shorthand": re.compile(r"(?m)^> "), "ledger": re.compile(r"(?m)^\d+ [-+*/]")}


def style_counts(text: str) -> tuple[int, int, int]:
    """(plain steps, shorthand steps, ledger steps) written in ``text``."""
    plain, short, ledger = (len(_STEP[s].findall(text)) for s in STYLES)
    return plain, short, ledger


def _step_share(texts, index: int) -> float:
    counts = [style_counts(t) for t in texts]
    total = sum(map(sum, counts))
    return sum(c[index] for c in counts) / total if total else 0.0


def shorthand_step_share(texts) -> float:
    """Share of all written steps (over ``texts``) that are shorthand steps; 0.0 when there are none."""
    return _step_share(texts, 1)


def ledger_step_share(texts) -> float:
    """Share of all written steps (over ``texts``) that are ledger steps; 0.0 when there are none."""
    return _step_share(texts, 2)


def is_shorthand(text: str) -> bool:
    """Whether a chain is in dialect A: it has shorthand steps, at least as many as all its other steps."""
    plain, short, ledger = style_counts(text)
    return short > 0 and short >= plain + ledger


def is_ledger(text: str) -> bool:
    """Whether a chain is in dialect B: it has ledger steps, at least as many as all its other steps."""
    plain, short, ledger = style_counts(text)
    return ledger > 0 and ledger >= plain + short


def shorthand_rate(texts) -> float:
    """Share of ``texts`` written in shorthand (dialect A, the one the copy does not keep up: the demo's
    jargon rate in this world); 0.0 for an empty list."""
    texts = list(texts)
    return sum(map(is_shorthand, texts)) / len(texts) if texts else 0.0


def ledger_rate(texts) -> float:
    """Share of ``texts`` written in ledger (dialect B, the one the copy follows); 0.0 for an empty list."""
    texts = list(texts)
    return sum(map(is_ledger, texts)) / len(texts) if texts else 0.0
