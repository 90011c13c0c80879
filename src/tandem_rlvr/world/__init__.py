"""The built-in arithmetic world: problem generator, local tokenizer, warm-started models.

* :mod:`tandem_rlvr.world.problems` — procedurally generated multi-step word problems, the plain and
  jargon solution styles, deterministic splits (``load_split``), the jargon detector and an exact grader.
* :mod:`tandem_rlvr.world.tokenizer` — a byte-level BPE trained locally, saved as a HF tokenizer.
* :mod:`tandem_rlvr.world.build` — ``build_world()``: tokenizer + weaker junior + senior warm start,
  cached on disk and built atomically.
* :mod:`tandem_rlvr.world.probe` — small accuracy / style probes of the built models.
* :mod:`tandem_rlvr.world.shorthand` — the second built-in world (``build_world(world="shorthand")``):
  long chains, a token budget, and a terse per-step style the warm senior writes as a rare habit; its
  recipe, probes and properties in :mod:`tandem_rlvr.world.shorthand_build`.

Heavy imports (torch, transformers) happen lazily inside the functions that need them.
"""

from tandem_rlvr.world.problems import (
    Problem,
    generate_problem,
    is_correct,
    is_jargon,
    jargon_rate,
    jargon_solution,
    load_split,
    plain_solution,
    solve_problem_text,
)

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

