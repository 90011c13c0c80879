"""The allowed values of the config's fields, declared with each field and checked by one generic function.

A field of :mod:`tandem_rlvr.config` (or of :class:`~tandem_rlvr.evaluation.options.EvalOptions`) is declared
with :func:`option`, its documentation line and its range where it is defined, ``_f(0.0, "doc", ge=0)``:
``ge``/``gt``/``le``/``lt`` bound a number (each element of a list of numbers, which must not be empty),
``choices`` lists the words a string may take, ``note`` says why (printed after the error).
:func:`check_fields` checks every field of a config section or of the evaluation's options against its
declaration and raises one :class:`~tandem_rlvr.errors.ConfigError` line naming the key, the allowed values
and the value given. A float must be finite wherever a range is declared (``inf`` and ``nan`` are never a
setting).

Cross-field checks (a mini-batch that divides the step, a KL weight only for the kl_reg arm) stay in
:func:`tandem_rlvr.config.validate`. :func:`run_dir_problem` refuses a ``train.out_dir`` that is not a
run's own directory; :func:`model_checks` the GPU knobs of ``model`` (mixed precision, revisions) against the
keys they meet. This module imports nothing heavy (no torch).
"""

from __future__ import annotations

import dataclasses
import math
import os
import typing
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tandem_rlvr.errors import ConfigError

__all__ = ["Bounds", "allowed", "bounds_of", "check_fields", "default_of", "field_problem", "numeric_fields", "option",
           "run_dir_problem"]


def _num(x: float) -> str:
    """A bound as written: ``0`` not ``0.0``, ``1e-06`` as Python prints it."""
    return str(int(x)) if float(x).is_integer() and abs(x) < 1e15 else repr(x)


def words(choices: tuple) -> str:
    """``a or b`` for two words, ``one of a, b, c`` for more (the empty word shown as ``''``)."""
    shown = [repr(c) if c == "" else str(c) for c in choices]
    return " or ".join(shown) if len(shown) <= 2 else f"one of {', '.join(shown)}"


@dataclass(frozen=True)
class Bounds:
    """The values a field allows: numeric bounds (any of ``ge``, ``gt``, ``le``, ``lt``) or ``choices``."""

    ge: float | None = None
    gt: float | None = None
    le: float | None = None
    lt: float | None = None
    choices: tuple | None = None
    note: str = ""

    @property
    def numeric(self) -> bool:
        return any(b is not None for b in (self.ge, self.gt, self.le, self.lt))

    def allows(self, value: Any) -> bool:
        if isinstance(value, (list, tuple)):  # a list of numbers: every element, and at least one
            return bool(value) and all(self.allows(v) for v in value)
        if self.choices is not None:
            return value in self.choices
        if not self.numeric:
            return True
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            return False
        if isinstance(value, float) and not math.isfinite(value):
            return False
        return ((self.ge is None or value >= self.ge) and (self.gt is None or value > self.gt)
                and (self.le is None or value <= self.le) and (self.lt is None or value < self.lt))

    def describe(self, is_float: bool = False) -> str:
        """``in [0, 1]``, ``>= 2``, ``a finite number > 0``, ``lockstep or catchup``, ``one of a, b, c``."""
        if self.choices is not None:
            return words(self.choices)
        lo = f">= {_num(self.ge)}" if self.ge is not None else f"> {_num(self.gt)}" if self.gt is not None else ""
        hi = f"<= {_num(self.le)}" if self.le is not None else f"< {_num(self.lt)}" if self.lt is not None else ""
        if lo and hi:
            left = f"[{_num(self.ge)}" if self.ge is not None else f"({_num(self.gt)}"
            right = f"{_num(self.le)}]" if self.le is not None else f"{_num(self.lt)})"
            return f"in {left}, {right}"
        return f"a finite number {lo or hi}" if is_float else lo or hi


def option(default: Any, doc: str, *, ge: float | None = None, gt: float | None = None, le: float | None = None,
           lt: float | None = None, choices: tuple | None = None, note: str = "") -> Any:
    """A config field with its one documentation line and the values it allows (:class:`Bounds`: numeric bounds
    or ``choices``; ``note`` says why), checked by :func:`check_fields` before any work."""
    meta: dict[str, Any] = {"doc": doc}
    if any(b is not None for b in (ge, gt, le, lt, choices)):
        meta["bounds"] = Bounds(ge, gt, le, lt, tuple(choices) if choices is not None else None, note)
    if isinstance(default, (list, dict)):
        return dataclasses.field(default_factory=lambda: type(default)(default), metadata=meta)
    return dataclasses.field(default=default, metadata=meta)


def default_of(f: dataclasses.Field) -> Any:
    """The default value of a dataclass field (a fresh one for a list or dict)."""
    return f.default if f.default is not dataclasses.MISSING else f.default_factory()  # type: ignore[misc]


def bounds_of(f: dataclasses.Field) -> Bounds | None:
    """The declared :class:`Bounds` of a dataclass field (None: any value of its type)."""
    return f.metadata.get("bounds")


def allowed(cls: type, f: dataclasses.Field) -> str:
    """The values field ``f`` of dataclass ``cls`` allows, in words (``in [0, 1]``, ``a finite number > 0``),
    or '' where it declares none."""
    b = bounds_of(f)
    return "" if b is None else _describe(b, typing.get_type_hints(cls)[f.name])


def _describe(b: Bounds, tp: Any) -> str:
    """The allowed values of a field typed ``tp`` in words; a list field's bounds hold for each element."""
    if tp is list or typing.get_origin(tp) is list:
        return f"a non-empty list of numbers {b.describe()}"
    return b.describe(_numeric_type(tp) is float)


def _numeric_type(tp: Any) -> type | None:
    """``int`` or ``float`` for a field typed ``int``, ``float`` or ``X | None`` of them; else None."""
    args = [a for a in typing.get_args(tp) if a is not type(None)] if typing.get_args(tp) else [tp]
    return args[0] if len(args) == 1 and args[0] in (int, float) else None


def numeric_fields(cls: type) -> list[tuple[dataclasses.Field, type]]:
    """Every field of dataclass ``cls`` typed int or float (optionally None), with that type."""
    hints = typing.get_type_hints(cls)
    return [(f, t) for f in dataclasses.fields(cls) if (t := _numeric_type(hints[f.name])) is not None]


def field_problem(f: dataclasses.Field, tp: Any, value: Any) -> str | None:
    """What is wrong with ``value`` for field ``f`` (typed ``tp``): ``must be ..., got ...``; None if allowed."""
    b = bounds_of(f)
    if b is None or (value is None and type(None) in typing.get_args(tp)) or b.allows(value):
        return None
    why = f" ({b.note})" if b.note else ""
    return f"must be {_describe(b, tp)}, got {value!r}{why}"


def check_fields(obj: Any, key: Callable[[str], str]) -> None:
    """Raise a one-line :class:`ConfigError` for the first field of dataclass ``obj`` outside its declared
    bounds; ``key(name)`` names the field in the message (``'algo.lr'``, ``eval option 'n' (--n)``)."""
    hints = typing.get_type_hints(type(obj))
    for f in dataclasses.fields(obj):
        problem = field_problem(f, hints[f.name], getattr(obj, f.name))
        if problem is not None:
            raise ConfigError(f"{key(f.name)} {problem}")


def run_dir_problem(path: str) -> str | None:
    """Why ``path`` (``~`` already expanded) cannot be a run directory, or None: empty, the filesystem root,
    the home directory, the current directory, or a directory that holds the home or current directory
    (a run keeps its files there and ``--restart`` clears it)."""
    if not str(path).strip():
        return "must name a directory of its own, got '' (the current directory)"
    where = Path(path).resolve()
    for what, place in (("the filesystem root", Path(os.sep)), ("the home directory", Path.home()),
                        ("the current directory", Path.cwd())):
        place = place.resolve()
        if where == place or where in place.parents:
            why = what if where == place else f"it holds {what}, {str(place)!r}"
            return (f"must name a directory of its own, got {str(path)!r} ({why}): a run keeps its files "
                    "there and --restart clears it")
    return None


def model_checks(cfg) -> list:
    """The GPU knobs against the keys they meet: mixed precision over float32 weights only (fp16 not with FSDP:
    no loss scaling for the sharded senior), a fully trained senior's weights in float32 (AdamW on half-precision
    weights: a bf16 weight does not move by a step of 1e-6, a review measured 98% of a model's weights unchanged
    after steps at the paper's lr; fp16's eps of 1e-8 rounds to 0 and the first step writes inf and NaN; LoRA's
    adapters are float32 over any base), revisions where they reach the models that load."""
    m = cfg.model
    half = m.mixed_precision in ("bf16", "fp16")
    return [
        (not half or m.dtype == "float32", "model.mixed_precision",
         f"is {m.mixed_precision}: half-precision compute over float32 weights; with model.dtype={m.dtype} set "
         "model.dtype=float32 (float32 weights and optimizer, half-precision compute)"),
        (m.dtype == "float32" or m.lora_r > 0, "model.dtype",
         f"is {m.dtype}, the weights AdamW updates in a full fine-tune (model.lora_r=0): in {m.dtype} an update of "
         f"algo.lr={cfg.algo.lr:g} rounds away or overflows; use model.dtype=float32 with model.mixed_precision=bf16 "
         "(float32 weights, bf16 compute), or LoRA (model.lora_r > 0: float32 adapters over a half-precision base)"),
        (m.mixed_precision != "fp16" or cfg.train.fsdp == "off", "model.mixed_precision",
         f"is fp16, which train.fsdp={cfg.train.fsdp} does not support (no loss scaling for the sharded senior); use bf16"),
        (not m.junior_revision or not m.self_paired, "model.junior_revision",
         "must be empty when model.self_paired is true (the junior is the senior's model.revision)"),
    ]
