"""The fourth built-in world, ``slips``: long chains, a token budget, and one terse dialect the warm start
writes rarely and executes unreliably.

The problems are those of the arithmetic world (:mod:`tandem_rlvr.world.problems`), drawn from their own
seeded, hash-disjoint splits. Two step styles:

* **plain** — exactly the arithmetic world's plain style (``- Second, she gives away 4: 12 - 4 = 8.``),
  about 15 tokens per operation, always computed right in the warm start's targets;
* **ledger** — the dialects world's whole-chain style (a ``Ledger:`` marker line, then ``12 -4 = 8`` per
  operation, about 7 tokens, then a bare ``\\boxed{..}``), but in the warm start's targets each ledger
  line after the first ``SLIP_FROM`` **slips** (its new total one too high) with probability ``SLIP_RATE``,
  and the chain carries the slip forward (the next line starts from the written total, and so does the
  box). A short chain's ledger is clean; a long one's late lines are not.

The warm-started senior is taught whole chains in ledger with probability ``LEDGER_SHARE``, plain
otherwise. The token budget (``BUDGET``) fits every ledger solution but no 7-8 op plain one, so on long
problems only ledger can pay, and there only when its late lines do not slip. What the world is for (issue
38, design 8): slips are noise that reinforcement learning on the senior's own chains can sharpen away,
while its frozen copy (the self-paired junior) keeps slipping. A solo GRPO chain in ledger pays once the
senior stops slipping; a chain co-written with the copy still holds the copy's slips in its late lines, so
TRLVR's rollouts pay the sharpening less, and a senior handing a long ledger chain over hands the copy
lines it gets wrong. Unlike the shorthand and dialects worlds, the copy's part makes a co-written chain
*wrong*, not merely long. Measured (docs/demo.md, designs 7 and 8): with every line slipping
(``SLIP_FROM = 0``, design 7's build) RL drops ledger in both arms; with this build both arms adopt it and
drift from the copy alike, so the world does not separate the arms either.
"""

from __future__ import annotations

import random
import re
from typing import Any

from tandem_rlvr.data import Example
from tandem_rlvr.world import problems as P
from tandem_rlvr.world.dialects import LEDGER_MARKER, ledger_solution, ledger_steps
from tandem_rlvr.world.problems import Problem, plain_solution, plain_steps

NAME = "slips"
BUDGET = 80  # the demo's token budget: every ledger solution fits, no 7-8 op plain one
LEDGER_SHARE = 0.30  # share of the warm senior's targets written, whole, in ledger
SLIP_RATE = 0.35  # share of a warm-start ledger line's new totals written one too high (carried forward)...
SLIP_FROM = 4  # ...after its first SLIP_FROM lines, which never slip
STYLES = ("plain", "ledger")

SPLIT_SPECS: dict[str, dict[str, Any]] = {
    # name: size, chain lengths, hash bucket range (of 100), generator seed (not the other worlds')
    "train": {"size": 2000, "ops": (2, 8), "buckets": (10, 100), "seed": 4001},
    "val": {"size": 64, "ops": (2, 8), "buckets": (0, 3), "seed": 4002},
    "test": {"size": 128, "ops": (2, 8), "buckets": (3, 10), "seed": 4003},
}


def solution(problem: Problem, style: str) -> str:
    """The gold solution of ``problem`` in ``style`` (``plain`` or ``ledger``; no slip)."""
    return {"plain": plain_solution, "ledger": ledger_solution}[style](problem)


def steps(problem: Problem, style: str) -> list[str]:
    """The gold steps of ``problem``'s solution in ``style``, each ending with ``\\n\\n`` but the last (ledger's
    marker line not among them)."""
    return {"plain": plain_steps, "ledger": ledger_steps}[style](problem)


def head(problem: Problem, style: str, n: int) -> str:
    """The gold solution's first ``n`` steps in ``style`` (ledger's with its marker line)."""
    return (LEDGER_MARKER if style == "ledger" else "") + "".join(steps(problem, style)[:n])


def slipped_ledger_solution(problem: Problem, rng: random.Random, slip: float = SLIP_RATE,
                            slip_from: int = SLIP_FROM) -> str:
    """A warm-start ledger chain: each line after the first ``slip_from`` has its new total one too high with
    probability ``slip``, the written total carried into the next line and the box (so a slip in the last
    line, or one the later operations do not absorb, ends the chain on a wrong answer)."""
    lines, x = [], problem.start
    for i, op in enumerate(problem.ops):
        y = op.apply(x) + (1 if i >= slip_from and rng.random() < slip else 0)
        lines.append(f"{x} {op.symbol}{op.operand} = {y}\n\n")
        x = y
    return LEDGER_MARKER + "".join(lines) + f"\\boxed{{{x}}}"


def warm_solution(problem: Problem, rng: random.Random, ledger_share: float = LEDGER_SHARE,
                  slip: float = SLIP_RATE, slip_from: int = SLIP_FROM) -> str:
    """A warm-start target: the whole chain in (slipping) ledger with probability ``ledger_share``, else plain."""
    if rng.random() < ledger_share:
        return slipped_ledger_solution(problem, rng, slip, slip_from)
    return plain_solution(problem)


# ----------------------------------------------------------------------------------------- splits


def generate_split(split: str) -> list[Problem]:
    """The problems of a split (:func:`tandem_rlvr.world.problems.generate_split` over this world's splits)."""
    return P.generate_split(split, SPLIT_SPECS)


def load_split(split: str) -> list[Example]:
    """The split as :class:`tandem_rlvr.data.Example` records (ids ``slip-<split>-<i>``)."""
    return P.load_split(split, SPLIT_SPECS, "slip")


def train_problem(rng: random.Random, n_ops: int) -> Problem:
    """A fresh problem with ``n_ops`` operations from this world's train bucket (never in val/test)."""
    return P.train_problem(rng, n_ops, SPLIT_SPECS)


def sft_problems(seed: int, n_ops_range: tuple[int, int] = (2, 8)):
    """An endless stream of (n_ops, Problem) from this world's train bucket."""
    return P.sft_problems(seed, n_ops_range, SPLIT_SPECS)


def probe_problems(n_ops: int, count: int) -> list[Problem]:
    """``count`` held-out problems (test buckets) with exactly ``n_ops`` operations."""
    return P.held_out_problems(n_ops, count, SPLIT_SPECS, 9100)


# ------------------------------------------------------------------------------------ style

_PLAIN = re.compile(r"(?m)^- ")
_LEDGER = re.compile(r"(?m)^(\d+) ([-+*/])(\d+) = (\d+)$")


def style_counts(text: str) -> tuple[int, int]:
    """(plain steps, ledger steps) written in ``text``."""
    return len(_PLAIN.findall(text)), len(_LEDGER.findall(text))


def is_ledger(text: str) -> bool:
    """Whether a chain is in ledger: it has ledger steps, at least as many as its plain ones."""
    plain, ledger = style_counts(text)
    return ledger > 0 and ledger >= plain


def ledger_rate(texts) -> float:
    """Share of ``texts`` written in ledger (the demo's jargon rate in this world); 0.0 for an empty list."""
    texts = list(texts)
    return sum(map(is_ledger, texts)) / len(texts) if texts else 0.0


def _apply(x: int, symbol: str, operand: int) -> int:
    return {"+": x + operand, "-": x - operand, "*": x * operand, "/": x // operand if operand else -1}[symbol]


def line_slips(text: str) -> list[bool]:
    """Whether each ledger line of ``text``, in order, slips: its new total is not its old total with the
    operation applied (each line read on its own, so a slip carried forward counts once)."""
    return [_apply(int(x), symbol, int(operand)) != int(y) for x, symbol, operand, y in _LEDGER.findall(text)]


def ledger_slips(texts, first: int = 0) -> tuple[int, int]:
    """(slipping ledger lines, ledger lines) over ``texts``, counting each text's lines from its ``first``
    (0-based) on."""
    flags = [f for text in texts for f in line_slips(text)[first:]]
    return sum(flags), len(flags)


def slip_rate(texts, first: int = 0) -> float:
    """Share of the ledger lines in ``texts`` (each from its line ``first`` on) that slip; 0.0 when there are
    none."""
    wrong, total = ledger_slips(texts, first)
    return wrong / total if total else 0.0
