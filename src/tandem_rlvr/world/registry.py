"""The built-in worlds, one :class:`World` record each, and their registry (:data:`WORLDS`, :func:`get_world`).

Everything that tells one world from another is in its record or in the modules the record names: its
data source (``load_examples("<source>/<split>")``), its build recipe (the module :mod:`tandem_rlvr.world.build`
builds it from), its compressed-style detector, its demo plan, its model aliases (``<prefix>:senior`` /
``<prefix>:junior``) and the wording of its demo report. The places that differ by world (the build, the
warm starts, ``load_examples``, ``load_causal_lm``'s aliases, the demo, ``tandem-rlvr demo --world``) read the
record; none of them switches on a world's name.

The record names modules and functions as ``"module:attribute"`` strings, imported on first use: this module
imports nothing of the package but its errors, so the data module and the CLI can look a world up without
importing the worlds (which import the data module). Adding a world: docs/architecture.md, "Add a world".
"""

from __future__ import annotations

import importlib
import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

from tandem_rlvr.errors import TandemError

__all__ = ["DEFAULT_WORLD", "MODEL_ROLES", "WORLDS", "UnknownWorldError", "World", "find_model_alias", "find_source",
           "get_world", "source_names"]

log = logging.getLogger(__name__)
MODEL_ROLES = ("senior", "junior")  # ``<prefix>:<role>`` names a built world's model


class UnknownWorldError(TandemError):
    """A world name that no record of :data:`WORLDS` has; the message lists the known ones."""


def _attr(ref: str):
    """The object a ``"module:attribute"`` reference names (the module imported now)."""
    module, _, name = ref.partition(":")
    return getattr(importlib.import_module(module), name)


@dataclass(frozen=True)
class World:
    """One built-in world: what the build, the data loader, the model loader, the demo and the CLI need of it.

    The recipe module (``recipe``) provides what :mod:`tandem_rlvr.world.build` and the warm starts use:
    ``VERSION``, ``recipe(seed)``, ``model_specs(seed, attempt)``, ``tokenizer_corpus(seed)``, the property gate
    (``measure_models(paths, count)``, ``property_failures``, ``models_to_retrain``, ``property_values``,
    ``PROPERTY_COUNT``, ``MAX_TRIES``) and the supervised data (``train_problem(rng, n_ops)``,
    ``sft_response(problem, rng, share)``: one warm-start target, compressed with probability ``share``).
    """

    name: str  # ``tandem-rlvr demo --world NAME``; ``results["world"]["name"]``
    source: str  # its data source: ``load_examples("<source>/<split>")``
    splits: str  # ``"module:function"``: ``load_split(split)`` -> the split's Examples
    recipe: str  # the module of its build recipe (interface above)
    style: str  # ``"module:function"``: the share of texts in the world's compressed style (the demo's jargon rate)
    description: str  # one line, for ``--world``'s help
    title: str  # the demo report's title, in parentheses after "Tandem RLVR demo"
    key_prefix: str  # its cache folder: ``<key_prefix>-v<VERSION>-<hash of the recipe>``
    model_prefixes: tuple[str, ...]  # ``<prefix>:senior`` / ``<prefix>:junior`` load its built models
    demo_plan: Mapping[str, Any] = field(default_factory=lambda: MappingProxyType({}))  # the demo plan's sizes
    # that differ from the default plan (tandem_rlvr.demo.plan.FULL / QUICK), for the full and the --quick demo
    source_aliases: tuple[str, ...] = ()  # deprecated names of its data source (still loaded, with a warning)

    def split_loader(self) -> Callable[[str], list]:
        """The world's ``load_split(split)``: a split's problems as :class:`tandem_rlvr.data.Example` records."""
        return _attr(self.splits)

    def recipe_module(self):
        """The world's recipe module (imported now)."""
        return importlib.import_module(self.recipe)

    def style_rate(self) -> Callable[[list[str]], float]:
        """The world's compressed-style detector over texts: the share of them written in that style."""
        return _attr(self.style)

    @property
    def model_aliases(self) -> tuple[str, ...]:
        """Every model alias of this world, ``<prefix>:<role>``."""
        return tuple(f"{p}:{r}" for p in self.model_prefixes for r in MODEL_ROLES)


ARITH = World(
    name="arith", source="arith", source_aliases=("world",),
    splits="tandem_rlvr.world.problems:load_split", recipe="tandem_rlvr.world.arith_build",
    style="tandem_rlvr.world.problems:jargon_rate",
    description="the arithmetic world (default)", title="built-in arithmetic world",
    key_prefix="world", model_prefixes=("world", "arith"),
)
SHORTHAND = World(
    name="shorthand", source="shorthand",
    splits="tandem_rlvr.world.shorthand:load_split", recipe="tandem_rlvr.world.shorthand_build",
    style="tandem_rlvr.world.shorthand:shorthand_rate",
    description="long chains under a token budget and a terse style the warm start rarely writes (for --junior self)",
    title="built-in shorthand world, `--world shorthand`; its jargon rate is the shorthand rate",
    key_prefix="shorthand", model_prefixes=("shorthand",),
    # its token budget (world.shorthand.BUDGET: every shorthand solution fits, no 7-8 op plain one) and learning
    # rate (at 1e-4, 20 steps left the senior within 0.002 nats/token of its warm start; at 1e-3 GRPO collapsed:
    # docs/demo.md, "Designs and learning rates measured")
    demo_plan=MappingProxyType({"max_new_tokens": 80, "lr": 3e-4}),
)
DIALECTS = World(
    name="dialects", source="dialects",
    splits="tandem_rlvr.world.dialects:load_split", recipe="tandem_rlvr.world.dialects_build",
    style="tandem_rlvr.world.dialects:shorthand_rate",
    description="long chains under a token budget and two terse dialects, one the copy follows (for --junior self)",
    title="built-in dialects world, `--world dialects`; its jargon rate is the shorthand (dialect A) rate",
    key_prefix="dialects", model_prefixes=("dialects",),
    # the shorthand world's budget and learning rate for now (world.dialects.BUDGET fits every shorthand and
    # every ledger solution, no 7-8 op plain one)
    demo_plan=MappingProxyType({"max_new_tokens": 80, "lr": 3e-4}),
)
SLIPS = World(
    name="slips", source="slips",
    splits="tandem_rlvr.world.slips:load_split", recipe="tandem_rlvr.world.slips_build",
    style="tandem_rlvr.world.slips:ledger_rate",
    description="long chains under a token budget and a terse dialect whose warm-start steps slip (for --junior self)",
    title="built-in slips world, `--world slips`; its jargon rate is the ledger rate",
    key_prefix="slips", model_prefixes=("slips",),
    # the other budget worlds' budget and learning rate (world.slips.BUDGET fits every ledger solution, no 7-8 op
    # plain one)
    demo_plan=MappingProxyType({"max_new_tokens": 80, "lr": 3e-4}),
)
WORLDS: Mapping[str, World] = MappingProxyType({w.name: w for w in (ARITH, SHORTHAND, DIALECTS, SLIPS)})
DEFAULT_WORLD = ARITH.name


def get_world(name: str, what: str = "world") -> World:
    """The record of the built-in world ``name``; :class:`UnknownWorldError` (naming ``what`` and the known
    worlds) on any other name."""
    world = WORLDS.get(name) if isinstance(name, str) else None
    if world is None:
        raise UnknownWorldError(f"{what} must be one of {', '.join(WORLDS)}, got {name!r}")
    return world


def source_names() -> list[str]:
    """Every built-in data source name, deprecated aliases included."""
    return [n for w in WORLDS.values() for n in (w.source, *w.source_aliases)]


_WARNED: set[str] = set()  # deprecated names already warned about in this process


def find_source(name: str) -> World | None:
    """The world whose data source is ``name`` (None if none is); a deprecated alias warns once per process."""
    for world in WORLDS.values():
        if name == world.source:
            return world
        if name in world.source_aliases:
            if name not in _WARNED:
                _WARNED.add(name)
                log.warning("data: '%s/<split>' is the old name of the %s world's problems; write '%s/<split>' "
                            "(the same problems; the old name will go)", name, world.name, world.source)
            return world
    return None


def find_model_alias(name: str) -> tuple[World, str] | None:
    """``(world, role)`` for a model alias ``<prefix>:<role>`` of a built-in world, else None."""
    prefix, sep, role = name.partition(":") if isinstance(name, str) else ("", "", "")
    if not sep or role not in MODEL_ROLES:
        return None
    return next(((w, role) for w in WORLDS.values() if prefix in w.model_prefixes), None)
