"""The handoff schedules, each defined once: the registry every other module derives its lists from.

A schedule is one registered rule (in the style of verl's ``register_policy_loss``; the decorator may also be
called after the function, as the built-in rules are, so that mutmut reaches them)::

    @register_schedule("word", flags=("boundary",), params=(MAX_GAP,), turn_tokens=lambda gap, prm: prm["max_gap"] - gap)
    def word(f, gap, carry, prm):
        return f["boundary"] | (gap >= prm["max_gap"]), None

The rule says, after each emitted token, whether a coin falls there (``due``). It reads the token's flags
``f[name]`` (the token table's, see :data:`TOKEN_FLAGS`), ``gap`` (tokens since the last coin, this one
included), ``carry`` (what the rule carried over from the previous token of the same turn, reset wherever
a coin fell; False at the start) and ``prm`` (its parameters). It returns ``(due, carry)`` (``carry`` None:
nothing carried). It is pure and works on plain bools and ints (one sequence) and on tensors (a batch)
alike: use ``|``, ``&``, ``^`` and comparisons, never ``and`` / ``or`` / ``if``.

Besides its rule a definition declares (:class:`ScheduleDef`):

- ``level``: where its coins fall: ``solo`` (never), ``token`` (after any token), ``step`` (only where a
  reasoning step ends, at ``"\\n\\n"``; the text bridge serves these only);
- ``authors``: how a decision picks the author: ``coins`` (first author and every redraw a seeded coin,
  P(senior) = p), ``senior`` (the senior writes everything) or ``alternate`` (the senior first, then every
  decision flips). ``senior`` and ``alternate`` are deterministic: the ownership check knows each decision;
- ``flags``: the token flags the rule reads (any: the schedule needs a token table built from the tokenizer);
  ``token_flags``: new flags it adds to every table, ``name -> fn(raw_token, text) -> bool``;
- ``params``: its parameters (:class:`Param`: name, default, minimum, config key), besides ``p`` which every
  schedule has; they are what travels into vLLM (:meth:`tandem_rlvr.engines.handoff.Schedule.to_dict`);
- ``turn_tokens(gap, prm)``: how many tokens the author may still write before a coin that does not depend
  on the text (engines that write whole turns); ``table_problem(has)``: why a table cannot serve it.

Torch-free: the configuration takes :data:`SCHEDULES` from here. What the rules mean for engines is
:mod:`tandem_rlvr.engines.handoff`; how to add a schedule: docs/architecture.md.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field

__all__ = ["STEP_END", "WORD_MARKERS", "LEVELS", "AUTHORS", "Param", "MAX_GAP", "CHUNK_SIZE", "ScheduleDef",
           "TOKEN_FLAGS", "register_schedule", "get_schedule", "schedule_names", "SCHEDULES", "coin_schedules",
           "table_schedules", "config_params", "step_end"]

STEP_END = "\n\n"
WORD_MARKERS = ("Ġ", "▁", " ")  # how a token that starts a word begins (byte-level BPE, SentencePiece, plain)
LEVELS = ("solo", "token", "step")
AUTHORS = ("coins", "senior", "alternate")


@dataclass(frozen=True)
class Param:
    """A schedule parameter: its keyword (``make_schedule(..., max_gap=8)``), default, least value and config key."""

    name: str
    default: int
    minimum: int = 1
    key: str = ""

    def check(self, value) -> int:
        """``value`` as an int; a ValueError naming the config key unless it is a whole number >= the minimum."""
        if isinstance(value, bool) or int(value) != value or value < self.minimum:
            raise ValueError(f"{self.key or self.name} must be a whole number >= {self.minimum}, got {value!r}")
        return int(value)


MAX_GAP = Param("max_gap", 32, key="handoff.max_gap")  # the paper's K = 32
CHUNK_SIZE = Param("chunk_size", 16, key="handoff.chunk_size")

# Per-token flags a rule may read, ``name -> fn(raw token, decoded text)``; definitions add their own.
TOKEN_FLAGS: dict[str, Callable[[str, str], bool]] = {
    "boundary": lambda raw, text: raw.startswith(WORD_MARKERS),  # the token starts a word
    "ends_nl": lambda raw, text: text.endswith("\n"),
    "nl2": lambda raw, text: STEP_END in text,
    "starts_nl": lambda raw, text: text.startswith("\n"),
}


@dataclass(frozen=True)
class ScheduleDef:
    """One registered handoff schedule (see the module docstring); built by :func:`register_schedule`."""

    name: str
    rule: Callable
    level: str = "token"
    authors: str = "coins"
    flags: tuple[str, ...] = ()
    params: tuple[Param, ...] = ()
    turn_tokens: Callable[[int, dict], int | None] | None = None
    table_problem: Callable[[Callable[[str], bool]], str | None] | None = None
    doc: str = field(default="", repr=False)

    @property
    def needs_table(self) -> bool:
        """Whether the rule reads the tokens' text (the schedule is built with a tokenizer's token table)."""
        return bool(self.flags)

    @property
    def deterministic(self) -> bool:
        """Whether every decision's author is known without coins (``senior``, ``alternate``)."""
        return self.authors != "coins"

    def fixed_author(self, k):
        """The author (1 = senior) of decision ``k`` (0, 1, ...; int or tensor) of a deterministic schedule; None
        for a coin schedule."""
        if self.authors == "senior":
            return k * 0 + 1
        if self.authors == "alternate":
            return (k % 2 == 0) * 1
        return None

    def param_values(self, given: dict) -> dict:
        """This schedule's parameters from ``given`` (defaults where absent), each checked."""
        return {p.name: p.check(given.get(p.name, p.default)) for p in self.params}


_REGISTRY: dict[str, ScheduleDef] = {}


def register_schedule(name: str, *, level: str = "token", authors: str = "coins", flags: tuple[str, ...] = (),
                      params: tuple[Param, ...] = (), token_flags: dict | None = None, turn_tokens=None,
                      table_problem=None):
    """Decorator: register the rule it decorates as handoff schedule ``name`` (see the module docstring)."""
    if level not in LEVELS or authors not in AUTHORS:
        raise ValueError(f"schedule {name!r}: level must be one of {LEVELS}, authors one of {AUTHORS}")
    new_flags = dict(token_flags or {})
    unknown = [f for f in flags if f not in TOKEN_FLAGS and f not in new_flags]
    if unknown:
        raise ValueError(f"schedule {name!r} reads token flags nobody defines: {', '.join(unknown)}")

    def decorate(rule):
        if name in _REGISTRY:
            raise ValueError(f"handoff schedule {name!r} is already registered")
        clash = [f for f in new_flags if f in TOKEN_FLAGS]
        if clash:
            raise ValueError(f"schedule {name!r} redefines token flags {', '.join(clash)}")
        TOKEN_FLAGS.update(new_flags)
        _REGISTRY[name] = ScheduleDef(name, rule, level, authors, tuple(flags), tuple(params), turn_tokens,
                                      table_problem, (rule.__doc__ or "").strip())
        return rule

    return decorate


def schedule_names() -> tuple[str, ...]:
    """Every registered schedule, in registration order."""
    return tuple(_REGISTRY)


def get_schedule(name: str) -> ScheduleDef:
    """The definition of schedule ``name``; a ValueError listing the known ones for any other name."""
    try:
        return _REGISTRY[name]
    except (KeyError, TypeError):
        raise ValueError(f"unknown handoff schedule {name!r}; choose one of {', '.join(_REGISTRY)}") from None


def coin_schedules() -> tuple[str, ...]:
    """Schedules whose authors are drawn by coins, P(senior) = p (the ownership check tests their coins)."""
    return tuple(n for n, d in _REGISTRY.items() if not d.deterministic)


def table_schedules() -> tuple[str, ...]:
    """Schedules that read the tokens' text (they need a token table)."""
    return tuple(n for n, d in _REGISTRY.items() if d.needs_table)


def config_params(section) -> dict:
    """Every registered parameter's value in a config section (``cfg.handoff``), each read by its config key:
    what :func:`tandem_rlvr.engines.handoff.make_schedule` takes as ``**params``."""
    known = {p.name: p for d in _REGISTRY.values() for p in d.params}
    return {name: getattr(section, p.key.split(".", 1)[1]) for name, p in known.items()}


def step_end(nl2, starts_nl, turn_nl):
    """Whether a token ends the step: it holds ``"\\n\\n"``, or starts with ``"\\n"`` after a token of the
    same step that ended with one (``turn_nl``). Works on bools and on bool tensors alike."""
    return nl2 | (turn_nl & starts_nl)


# -- the built-in schedules (docs/engines.md "Handoff schedules") -------------------------------------------
# Registered by calling the decorator after each rule rather than with ``@``: mutmut does not mutate decorated
# functions, and these rules are in `make mutate`'s scope. A new schedule may use either form.


def none(f, gap, carry, prm):
    """No handoff: the senior writes everything (a vanilla GRPO rollout)."""
    return gap < 0, None


register_schedule("none", level="solo", authors="senior")(none)


def bernoulli(f, gap, carry, prm):
    """A fresh coin before every token."""
    return gap > 0, None


register_schedule("bernoulli", turn_tokens=lambda gap, prm: 1)(bernoulli)


def word(f, gap, carry, prm):
    """A coin after each word-start token (byte-level ``Ġ``, SentencePiece ``▁`` or a leading space), or after
    ``max_gap`` tokens without one. Paper: p = 0.5, K = 32."""
    return f["boundary"] | (gap >= prm["max_gap"]), None


register_schedule("word", flags=("boundary",), params=(MAX_GAP,), turn_tokens=lambda gap, prm: prm["max_gap"] - gap,
                  table_problem=lambda has: None if has("boundary") else
                  f"has no word-start tokens (none starts with {WORD_MARKERS})")(word)


def step(f, gap, carry, prm):
    """A coin at each step end: the token that completes the first ``"\\n\\n"`` of the current step (one holding
    it, or one starting with ``"\\n"`` right after one of the same step ending with ``"\\n"``)."""
    return step_end(f["nl2"], f["starts_nl"], carry), f["ends_nl"]


register_schedule("step", level="step", flags=("nl2", "starts_nl", "ends_nl"))(step)


def alternate(f, gap, carry, prm):
    """Like ``step``, but the author always changes (the senior writes the first step)."""
    return step_end(f["nl2"], f["starts_nl"], carry), f["ends_nl"]


register_schedule("alternate", level="step", authors="alternate", flags=("nl2", "starts_nl", "ends_nl"))(alternate)


def chunk(f, gap, carry, prm):
    """A coin after every ``chunk_size`` tokens."""
    return gap >= prm["chunk_size"], None


register_schedule("chunk", params=(CHUNK_SIZE,), turn_tokens=lambda gap, prm: prm["chunk_size"] - gap)(chunk)


_SENTENCE_END = re.compile(r"[.!?]\s")


def sentence(f, gap, carry, prm):
    """A coin after the token that completes a sentence end, a ``.``, ``!`` or ``?`` followed by whitespace: a
    token whose text holds one (``".\\n"``), or a token starting with whitespace (``" The"``, ``"\\n"``) right
    after one of the same turn ending with the mark; or after ``max_gap`` tokens without one."""
    end = f["sentence_end"] | (carry & f["starts_space"])
    return end | (gap >= prm["max_gap"]), f["ends_stop"]


register_schedule(
    "sentence", flags=("sentence_end", "starts_space", "ends_stop"), params=(MAX_GAP,),
    token_flags={"sentence_end": lambda raw, text: bool(_SENTENCE_END.search(text)),
                 "starts_space": lambda raw, text: raw.startswith(WORD_MARKERS) or text[:1].isspace(),
                 "ends_stop": lambda raw, text: text.endswith((".", "!", "?"))},
    turn_tokens=lambda gap, prm: prm["max_gap"] - gap,
    table_problem=lambda has: None if has("ends_stop") or has("sentence_end") else "has no token ending with . ! or ?",
)(sentence)


SCHEDULES = schedule_names()  # the built-in schedules (handoff.schedule's choices)
