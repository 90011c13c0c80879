"""Procedurally generated multi-step arithmetic word problems and their two solution styles.

A problem is a start value followed by a chain of 2–8 operations (add/subtract 1–9, double, triple,
halve), phrased in one of three short framings; each operation is one sentence led by an ordinal
(``Second, she gives away 4.``). Every intermediate value stays in ``[0, MAX_VALUE]``.

Two solution styles are taught to the warm-started models:

* **plain** — one operation per ``\\n\\n``-separated step: the step restates the operation's
  sentence, then the arithmetic with every intermediate result written out
  (``- Second, she gives away 4: 12 - 4 = 8.``), then ``The answer is \\boxed{..}.``
  The junior only ever sees this style.
* **jargon** — calculator-style ``<< a op b = c >>`` annotations, two operations packed per step,
  then a bare ``\\boxed{..}`` (``- First, add 3 << 9 + 3 = 12 >> Second, halve it << 12 / 2 = 6 >>``).
  Slightly shorter, as reliable for the senior, and foreign to the junior: a junior that picks up
  after a jargon step (or inside an annotation) has never seen that context.

Splits are assigned by a hash of the problem's arithmetic (start value and operation chain), so the
train / val / test / test_hard splits, and the SFT stream (train bucket only), never share a chain.
"""

from __future__ import annotations

import hashlib
import random
import re
from dataclasses import dataclass
from typing import Any

from tandem_rlvr.data import Example

MAX_VALUE = 30
MIN_OPS, MAX_OPS = 2, 8

# Operation kinds: (symbol, operand) with symbol in + - * /; the operand of * and / is fixed per kind.
OP_WEIGHTS = {"add": 0.34, "sub": 0.30, "double": 0.14, "triple": 0.06, "halve": 0.16}

# Framings: opening sentence, one clause per op kind, closing question. {x}=start, {b}=operand.
# Each op clause becomes a sentence "<Ordinal>, <clause>." — the ordinal is the step's anchor.
FRAMES: list[dict[str, Any]] = [
    {
        "start": ["{name} has {x} {item}."],
        "add": ["{pron} gets {b} more", "{pron} finds {b} more"],
        "sub": ["{pron} gives away {b}", "{pron} loses {b}"],
        "double": ["{pron} doubles them"],
        "triple": ["{pron} triples them"],
        "halve": ["{pron} gives away half"],
        "end": ["How many {item} does {name} have now?"],
    },
    {
        "start": ["Start with {x}."],
        "add": ["add {b}", "increase it by {b}"],
        "sub": ["subtract {b}", "take away {b}"],
        "double": ["double it"],
        "triple": ["triple it"],
        "halve": ["halve it"],
        "end": ["What is the result?"],
    },
    {
        "start": ["I think of {x}."],
        "add": ["I add {b}"],
        "sub": ["I subtract {b}"],
        "double": ["I double it"],
        "triple": ["I triple it"],
        "halve": ["I halve it"],
        "end": ["What number do I get?"],
    },
]
ORDINALS = ["First", "Second", "Third", "Fourth", "Fifth", "Sixth", "Seventh", "Eighth"]
NAMES = [("Ann", "she"), ("Tom", "he"), ("Mia", "she"), ("Sam", "he"), ("Eva", "she"), ("Max", "he")]
ITEMS = ["apples", "coins", "cards", "stamps", "books", "eggs"]
SYMBOL = {"add": "+", "sub": "-", "double": "*", "triple": "*", "halve": "/"}


@dataclass(frozen=True)
class Op:
    """One operation of a chain: ``kind`` in OP_WEIGHTS, ``operand`` the number it applies."""

    kind: str
    operand: int

    @property
    def symbol(self) -> str:
        """The arithmetic symbol written in solutions (+, -, *, /)."""
        return SYMBOL[self.kind]

    def apply(self, x: int) -> int:
        """The value after applying this operation to ``x``."""
        if self.kind == "add":
            return x + self.operand
        if self.kind == "sub":
            return x - self.operand
        if self.kind in ("double", "triple"):
            return x * self.operand
        return x // self.operand


@dataclass(frozen=True)
class Problem:
    """A generated problem: its text, the integer answer, the start value and the op chain."""

    text: str
    answer: int
    start: int
    ops: tuple[Op, ...]
    phrases: tuple[str, ...] = ()  # each operation's sentence in the text, without its period

    @property
    def values(self) -> list[int]:
        """The running values after each operation (the last one is the answer)."""
        out, x = [], self.start
        for op in self.ops:
            x = op.apply(x)
            out.append(x)
        return out

    @property
    def signature(self) -> str:
        """The problem's arithmetic, independent of wording (used for split assignment)."""
        return f"{self.start}|" + ",".join(f"{o.symbol}{o.operand}" for o in self.ops)


def valid_ops(x: int) -> list[Op]:
    """All operations that keep the running value inside ``[0, MAX_VALUE]`` (halving needs even)."""
    ops = [Op("add", b) for b in range(1, 10) if x + b <= MAX_VALUE]
    ops += [Op("sub", b) for b in range(1, 10) if x - b >= 0]
    if 2 <= x * 2 <= MAX_VALUE:
        ops.append(Op("double", 2))
    if 3 <= x * 3 <= MAX_VALUE:
        ops.append(Op("triple", 3))
    if x >= 2 and x % 2 == 0:
        ops.append(Op("halve", 2))
    return ops


def _sample_op(rng: random.Random, x: int) -> Op:
    """Draw a kind by OP_WEIGHTS among the valid ones, then a valid operand uniformly."""
    valid = valid_ops(x)
    kinds = sorted({o.kind for o in valid}, key=list(OP_WEIGHTS).index)
    kind = rng.choices(kinds, weights=[OP_WEIGHTS[k] for k in kinds])[0]
    return rng.choice([o for o in valid if o.kind == kind])


def generate_problem(rng: random.Random, n_ops: int) -> Problem:
    """Generate one problem with ``n_ops`` operations, deterministically from ``rng``'s state."""
    if not 1 <= n_ops <= len(ORDINALS):
        raise ValueError(f"n_ops must be in [1, {len(ORDINALS)}]")
    frame = rng.choice(FRAMES)
    name, pron = rng.choice(NAMES)
    item = rng.choice(ITEMS)
    x = start = rng.randint(2, 20)
    ops: list[Op] = []
    for _ in range(n_ops):
        op = _sample_op(rng, x)
        ops.append(op)
        x = op.apply(x)
    fill = {"name": name, "pron": pron, "item": item}
    phrases = tuple(
        f"{ORDINALS[k]}, " + rng.choice(frame[op.kind]).format(b=op.operand, **fill) for k, op in enumerate(ops)
    )
    parts = [rng.choice(frame["start"]).format(x=start, **fill), *(p + "." for p in phrases)]
    parts.append(rng.choice(frame["end"]).format(**fill))
    return Problem(text=" ".join(parts), answer=x, start=start, ops=tuple(ops), phrases=phrases)


def plain_steps(problem: Problem) -> list[str]:
    """The plain-style steps, each ending with ``\\n\\n``; the last is the boxed answer line."""
    steps, x = [], problem.start
    for op, phrase in zip(problem.ops, problem.phrases):
        y = op.apply(x)
        steps.append(f"- {phrase}: {x} {op.symbol} {op.operand} = {y}.\n\n")
        x = y
    steps.append(f"The answer is \\boxed{{{x}}}.")
    return steps


def jargon_steps(problem: Problem) -> list[str]:
    """The jargon-style steps: two ``<< a op b = c >>`` annotations per step, then a bare box."""
    notes, x = [], problem.start
    for op, phrase in zip(problem.ops, problem.phrases):
        y = op.apply(x)
        notes.append(f"{phrase} << {x} {op.symbol} {op.operand} = {y} >>")
        x = y
    steps = ["- " + " ".join(notes[i : i + 2]) + "\n\n" for i in range(0, len(notes), 2)]
    steps.append(f"\\boxed{{{x}}}")
    return steps


def plain_solution(problem: Problem) -> str:
    """A plain step-by-step solution: one op per step, every intermediate result written out."""
    return "".join(plain_steps(problem))


def jargon_solution(problem: Problem) -> str:
    """A compressed calculator-style solution the junior never sees in training."""
    return "".join(jargon_steps(problem))


# ----------------------------------------------------------------------------------------- splits

SPLIT_SPECS: dict[str, dict[str, Any]] = {
    # name: size, chain lengths, hash bucket range (of 100), generator seed
    "train": {"size": 2000, "ops": (2, 6), "buckets": (10, 100), "seed": 1001},
    "val": {"size": 64, "ops": (2, 6), "buckets": (0, 3), "seed": 1002},
    "test": {"size": 128, "ops": (2, 6), "buckets": (3, 10), "seed": 1003},
    "test_hard": {"size": 64, "ops": (7, 8), "buckets": (3, 10), "seed": 1004},
}


def split_bucket(problem: Problem) -> int:
    """A stable bucket in ``[0, 100)`` from the problem's arithmetic signature."""
    digest = hashlib.sha256(problem.signature.encode()).digest()
    return int.from_bytes(digest[:4], "big") % 100


def in_buckets(problem: Problem, buckets: tuple[int, int]) -> bool:
    """Whether the problem's bucket lies in ``[lo, hi)``."""
    lo, hi = buckets
    return lo <= split_bucket(problem) < hi


def generate_split(split: str, specs: dict | None = None) -> list[Problem]:
    """The problems of a split, deterministic, unique by signature, from the split's bucket range
    (``specs``: a world's split table, this world's :data:`SPLIT_SPECS` by default)."""
    specs = SPLIT_SPECS if specs is None else specs
    if split not in specs:
        raise ValueError(f"unknown split {split!r}; choose from {sorted(specs)}")
    spec = specs[split]
    rng = random.Random(spec["seed"])
    lo, hi = spec["ops"]
    seen: set[str] = set()
    out: list[Problem] = []
    while len(out) < spec["size"]:
        p = generate_problem(rng, rng.randint(lo, hi))
        if in_buckets(p, spec["buckets"]) and p.signature not in seen:
            seen.add(p.signature)
            out.append(p)
    return out


def load_split(split: str, specs: dict | None = None, prefix: str = "arith") -> list[Example]:
    """The split as :class:`tandem_rlvr.data.Example` records (id ``<prefix>-<split>-<i>``, problem text, answer)."""
    return [Example(id=f"{prefix}-{split}-{i:05d}", problem=p.text, answer=str(p.answer))
            for i, p in enumerate(generate_split(split, specs))]


def sft_problems(seed: int, n_ops_range: tuple[int, int] = (MIN_OPS, MAX_OPS), specs: dict | None = None):
    """An endless stream of (n_ops, Problem) for supervised warm starts, train bucket only."""
    rng = random.Random(seed)
    while True:
        n = rng.randint(*n_ops_range)
        yield n, train_problem(rng, n, specs)


def held_out_problems(n_ops: int, count: int, specs: dict, seed: int) -> list[Problem]:
    """``count`` held-out problems with exactly ``n_ops`` operations: the test split's (``specs``: a world's split
    table), then fresh ones from its test buckets drawn with ``seed + n_ops`` (a world's probes)."""
    rng, out = random.Random(seed + n_ops), [p for p in generate_split("test", specs) if len(p.ops) == n_ops]
    while len(out) < count:
        p = generate_problem(rng, n_ops)
        if in_buckets(p, specs["test"]["buckets"]):
            out.append(p)
    return out[:count]


def train_problem(rng: random.Random, n_ops: int, specs: dict | None = None) -> Problem:
    """A fresh problem with ``n_ops`` operations from the train bucket (never in val/test)."""
    buckets = (SPLIT_SPECS if specs is None else specs)["train"]["buckets"]
    while True:
        p = generate_problem(rng, n_ops)
        if in_buckets(p, buckets):
            return p


# ------------------------------------------------------------------------- styles and grading

_JARGON_NOTE = re.compile(r"<<\s*\d+\s*[-+*/]\s*\d+\s*=\s*\d+\s*>>")
_PLAIN_STEP = re.compile(r"\d+\s*[-+*/]\s*\d+\s*=\s*\d+")


def style_counts(text: str) -> tuple[int, int]:
    """(plain operations, jargon annotations) written in ``text``."""
    jargon = len(_JARGON_NOTE.findall(text))
    plain = len(_PLAIN_STEP.findall(_JARGON_NOTE.sub(" ", text)))
    return plain, jargon


def is_jargon(text: str) -> bool:
    """Whether a chain is in the compressed style: it has jargon annotations, at least as many as plain steps."""
    plain, jargon = style_counts(text)
    return jargon > 0 and jargon >= plain


def jargon_rate(texts) -> float:
    """Share of ``texts`` written in the compressed (jargon) style; 0.0 for an empty list."""
    texts = list(texts)
    return sum(is_jargon(t) for t in texts) / len(texts) if texts else 0.0


def world_boxed(text: str) -> str | None:
    """The content of the last ``\\boxed{...}`` opener (balanced braces), or None.

    Not :func:`tandem_rlvr.rewards.extract_boxed`, on purpose: this is the world's own grader, which
    checks a world build (probes, warm starts) independently of the rewards it is built to test, and
    the world may not import ``rewards`` (tests/test_structure.py). It reads only the world's own
    ``\\boxed{<integer>}`` endings: the last opener, no ``\\fbox``, bare ``\\boxed x``, escaped braces
    or box-in-box unwrapping, which the reward's extractor handles for model text in general."""
    start = text.rfind("\\boxed{")
    if start < 0:
        return None
    depth, i = 0, start + len("\\boxed")
    for j in range(i, len(text)):
        depth += {"{": 1, "}": -1}.get(text[j], 0)
        if depth == 0:
            return text[i + 1 : j].strip()
    return None


def is_correct(completion: str, answer: str | int) -> bool:
    """Exact integer check of the last boxed answer (an independent, math-verify-free grader)."""
    got = world_boxed(completion)
    if got is None or not re.fullmatch(r"-?\d+", got):
        return False
    return int(got) == int(answer)


_START_RULES = [r"has (\d+) ", r"Start with (\d+)", r"think of (\d+)"]
_OP_RULES: list[tuple[str, Any]] = [
    (r"\b(?:gets|finds|add|increase it by) (\d+)", lambda x, b: x + b),
    (r"\b(?:gives away|loses|subtract|take away) (\d+)", lambda x, b: x - b),
    (r"\bdoubles?\b", lambda x, b: 2 * x),
    (r"\btriples?\b", lambda x, b: 3 * x),
    (r"\b(?:away half|halve)\b", lambda x, b: x // 2),
]


def solve_problem_text(text: str) -> int:
    """Solve a generated problem from its English text alone (independent of the generator's op chain)."""
    sentences = [s.strip() for s in re.split(r"(?<=[.?])\s+", text) if s.strip()]
    start = re.search("|".join(_START_RULES), sentences[0])
    if start is None:
        raise ValueError(f"no start value in {sentences[0]!r}")
    x = int(next(g for g in start.groups() if g is not None))
    for sentence in sentences[1:-1]:
        for pattern, fn in _OP_RULES:
            m = re.search(pattern, sentence, flags=re.IGNORECASE)
            if m:
                x = fn(x, int(m.group(1)) if m.groups() else 0)
                break
        else:
            raise ValueError(f"unparsed sentence {sentence!r}")
    return x
