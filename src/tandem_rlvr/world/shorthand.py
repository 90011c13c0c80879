"""The second built-in world, ``shorthand``: long chains, a token budget, and a terse style as a rare habit.

The problems are those of the arithmetic world (:mod:`tandem_rlvr.world.problems`: a start value and
2-8 operations, each one sentence led by an ordinal), drawn from their own seeded, hash-disjoint
splits. Two step styles:

* **plain** — exactly the arithmetic world's plain style: one operation per ``\\n\\n`` step that
  restates the operation's sentence (with its ordinal) and writes the old and the new total
  (``- Second, she gives away 4: 12 - 4 = 8.``), about 15 tokens per operation;
* **shorthand** — one operation per step, without the sentence, the ordinal or the old total:
  ``> -4 = 8`` (about 6 tokens), and a bare ``\\boxed{..}`` for the answer line.

The warm-started senior is taught solutions whose every step is drawn alone: shorthand with
probability ``SHORTHAND_SHARE``, else plain. Its style is a per-step habit: it writes a shorthand
step now and then, and a plain one after a shorthand one as readily as after a plain one. The demo's
token budget (``BUDGET``) fits the all-shorthand solution of every problem but the all-plain solution
of no 7-8 op problem, so reinforcement learning under the budget rewards chains with many shorthand
steps. A frozen copy of the warm start (the self-paired junior) keeps the rare habit: a chain it
shares with a senior turned terse gets the copy's verbose steps and runs out of budget; and a plain
step after shorthand steps has to find the next operation without the ordinal that plain steps carry.
"""

from __future__ import annotations

import random
import re
from typing import Any

from tandem_rlvr.data import Example
from tandem_rlvr.world import problems as P
from tandem_rlvr.world.problems import (
    Problem,
    plain_solution,
    plain_steps,
)

NAME = "shorthand"
BUDGET = 80  # the demo's token budget (max new tokens): every shorthand solution fits, long plain ones do not
SHORTHAND_SHARE = 0.25  # share of the warm senior's supervised steps written in shorthand (each step drawn alone)

SPLIT_SPECS: dict[str, dict[str, Any]] = {
    # name: size, chain lengths, hash bucket range (of 100), generator seed (not the arithmetic world's)
    "train": {"size": 2000, "ops": (2, 8), "buckets": (10, 100), "seed": 2001},
    "val": {"size": 64, "ops": (2, 8), "buckets": (0, 3), "seed": 2002},
    "test": {"size": 128, "ops": (2, 8), "buckets": (3, 10), "seed": 2003},
}


def shorthand_step(x: int, op) -> str:
    """One shorthand step: the operation and the new total; no sentence, no ordinal, no old total."""
    return f"> {op.symbol}{op.operand} = {op.apply(x)}\n\n"


def shorthand_steps(problem: Problem) -> list[str]:
    """The shorthand steps, one per operation, then a bare box."""
    steps, x = [], problem.start
    for op in problem.ops:
        steps.append(shorthand_step(x, op))
        x = op.apply(x)
    steps.append(f"\\boxed{{{x}}}")
    return steps


def shorthand_solution(problem: Problem) -> str:
    """The terse style: about half the plain solution's tokens."""
    return "".join(shorthand_steps(problem))


def mixed_solution(problem: Problem, rng: random.Random, share: float) -> str:
    """A solution whose every step (and the answer line) is drawn alone: shorthand with probability ``share``,
    else plain. The warm senior is taught these: its style is a per-step habit, not a per-chain plan."""
    plain, short = plain_steps(problem), shorthand_steps(problem)
    return "".join(b if rng.random() < share else a for a, b in zip(plain, short))


def solution(problem: Problem, style: str) -> str:
    """The solution of ``problem`` in ``style`` (``plain`` or ``shorthand``)."""
    return {"plain": plain_solution, "shorthand": shorthand_solution}[style](problem)


def steps(problem: Problem, style: str) -> list[str]:
    """The steps of ``problem``'s solution in ``style``, each ending with ``\\n\\n`` but the last."""
    return {"plain": plain_steps, "shorthand": shorthand_steps}[style](problem)


# ----------------------------------------------------------------------------------------- splits


def generate_split(split: str) -> list[Problem]:
    """The problems of a split (:func:`tandem_rlvr.world.problems.generate_split` over this world's splits)."""
    return P.generate_split(split, SPLIT_SPECS)


def load_split(split: str) -> list[Example]:
    """The split as :class:`tandem_rlvr.data.Example` records (ids ``short-<split>-<i>``)."""
    return P.load_split(split, SPLIT_SPECS, "short")


def train_problem(rng: random.Random, n_ops: int) -> Problem:
    """A fresh problem with ``n_ops`` operations from this world's train bucket (never in val/test)."""
    return P.train_problem(rng, n_ops, SPLIT_SPECS)


def sft_problems(seed: int, n_ops_range: tuple[int, int] = (2, 8)):
    """An endless stream of (n_ops, Problem) from this world's train bucket."""
    return P.sft_problems(seed, n_ops_range, SPLIT_SPECS)


def probe_problems(n_ops: int, count: int) -> list[Problem]:
    """``count`` held-out problems (test buckets) with exactly ``n_ops`` operations."""
    return P.held_out_problems(n_ops, count, SPLIT_SPECS, 7000)


# ------------------------------------------------------------------------------------ style


_SHORT_STEP = re.compile(r"(?m)^> ")
_PLAIN_STEP = re.compile(r"(?m)^- ")


def shorthand_step_share(texts) -> float:
    """Share of all written steps (over ``texts``) that are shorthand steps; 0.0 when there are none."""
    counts = [style_counts(t) for t in texts]
    total = sum(a + b for a, b in counts)
    return sum(b for _, b in counts) / total if total else 0.0


def style_counts(text: str) -> tuple[int, int]:
    """(plain steps, shorthand steps) written in ``text``."""
    return len(_PLAIN_STEP.findall(text)), len(_SHORT_STEP.findall(text))


def is_shorthand(text: str) -> bool:
    """Whether a chain is in shorthand: it has shorthand steps, at least as many as plain steps."""
    plain, short = style_counts(text)
    return short > 0 and short >= plain


def shorthand_rate(texts) -> float:
    """Share of ``texts`` written in shorthand; 0.0 for an empty list."""
    texts = list(texts)
    return sum(map(is_shorthand, texts)) / len(texts) if texts else 0.0
