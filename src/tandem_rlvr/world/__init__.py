"""The built-in worlds: problem generators, a local tokenizer, warm-started models.

* :mod:`tandem_rlvr.world.registry` — one record per built-in world (:data:`~tandem_rlvr.world.registry.WORLDS`:
  ``arith``, the default, ``shorthand`` and ``dialects``): its data source, recipe, style detector, demo plan, model aliases.
* :mod:`tandem_rlvr.world.problems` — procedurally generated multi-step word problems, the plain and
  jargon solution styles, deterministic splits (``load_split``), the jargon detector and an exact grader.
* :mod:`tandem_rlvr.world.tokenizer` — a byte-level BPE trained locally, saved as a HF tokenizer.
* :mod:`tandem_rlvr.world.build` — ``build_world()``: tokenizer + weaker junior + senior warm start,
  cached on disk and built atomically, from the recipe its world's record names
  (:mod:`tandem_rlvr.world.arith_build`, :mod:`tandem_rlvr.world.shorthand_build`,
  :mod:`tandem_rlvr.world.dialects_build`).
* :mod:`tandem_rlvr.world.probe` — small accuracy / style probes of the built models.
* :mod:`tandem_rlvr.world.shorthand` — the second built-in world (``build_world(world="shorthand")``):
  long chains, a token budget, and a terse per-step style the warm senior writes as a rare habit.
* :mod:`tandem_rlvr.world.dialects` — the third (``build_world(world="dialects")``): the same budget and two
  terse dialects, the shorthand habit and a whole-chain ``ledger`` style that the senior's copy continues.

Importing this package imports none of its modules (the registry is read by the data module and the CLI);
the names below come from :mod:`tandem_rlvr.world.problems` on first use. Heavy imports (torch,
transformers) happen lazily inside the functions that need them.
"""

from __future__ import annotations

import importlib

__all__ = [
    "Problem",
    "generate_problem",
    "is_correct",
    "is_jargon",
    "jargon_rate",
    "jargon_solution",
    "load_split",
    "plain_solution",
    "solve_problem_text",
]


def __getattr__(name: str):
    """``tandem_rlvr.world.<name>`` for the problem generator's public names, imported on first use."""
    if name in __all__:
        return getattr(importlib.import_module("tandem_rlvr.world.problems"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
