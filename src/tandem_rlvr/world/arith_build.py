"""The ``arith`` world's recipe (built by :mod:`tandem_rlvr.world.build`): tokenizer corpus, warm starts, property gate.

Recipe: a tokenizer trained on chat-framed problems and both solution styles; a weaker **junior** (plain style
only, chains of 2-6 operations, a narrower MLP) and a **senior** warm start (a wider MLP, both styles, 45 %
jargon, chains of 2-8 operations), both with a length curriculum. The promised properties and their probes are
:mod:`tandem_rlvr.world.properties` and :mod:`tandem_rlvr.world.probe`. Its record is
:data:`tandem_rlvr.world.registry.ARITH`.
"""

from __future__ import annotations

import hashlib
import random

from tandem_rlvr.data import PROMPT_SUFFIX
from tandem_rlvr.world.problems import (  # noqa: F401 (train_problem: the warm starts' sampler, World API)
    Problem,
    generate_problem,
    jargon_solution,
    plain_solution,
    sft_problems,
    train_problem,
)
from tandem_rlvr.world.properties import (  # noqa: F401 (the property gate, World API)
    PROPERTIES,
    PROPERTY_COUNT,
    models_to_retrain,
    property_failures,
    property_values,
)
from tandem_rlvr.world.rules import (MAX_TRIES, SEED, TOKENIZER_CORPUS, TOKENIZER_VOCAB, TRY_SEED_STEP, seeded_specs,
                                     tokenizer_texts)
from tandem_rlvr.world.sft import ModelSpec
from tandem_rlvr.world.tokenizer import CHAT_TEMPLATE, DIGIT_PATTERN

VERSION = 1

# Both warm starts use a length curriculum: 2-4 op chains first, then one op longer every 100 steps.
# The weaker junior: plain style only, chains of 2-6 operations (the RL train range), a narrower MLP.
JUNIOR_SPEC = ModelSpec(
    name="junior",
    hidden=96,
    layers=3,
    intermediate=256,
    steps=1600,
    short_steps=500,
    ramp_every=100,
    n_ops=(2, 6),
    seed=SEED + 1,
)
# The senior warm start: a wider MLP, both styles (45 % jargon), chains of 2-8 operations.
SENIOR_SPEC = ModelSpec(
    name="senior",
    hidden=96,
    layers=3,
    intermediate=320,
    steps=1500,
    short_steps=500,
    ramp_every=100,
    jargon_share=0.45,
    n_ops=(2, 8),
    seed=SEED + 2,
)


def model_specs(seed: int = SEED, attempt: int = 0) -> dict[str, ModelSpec]:
    """The junior's and the senior's recipe for the build seed ``seed`` and its try ``attempt`` (0-based)."""
    return seeded_specs(JUNIOR_SPEC, SENIOR_SPEC, seed, attempt)


def recipe(seed: int = SEED) -> dict:
    """Everything that determines the built world; its hash names the cache folder."""
    specs = model_specs(seed)
    return {
        "version": VERSION,
        "seed": seed,
        "tokenizer": {"vocab": TOKENIZER_VOCAB, "corpus": TOKENIZER_CORPUS, "pattern": DIGIT_PATTERN},
        "chat_template": CHAT_TEMPLATE,
        "instruction": PROMPT_SUFFIX,
        "junior": specs["junior"].to_dict(),
        "senior": specs["senior"].to_dict(),
        "formats": format_fingerprint(),
        "gate": {"properties": PROPERTIES, "count": PROPERTY_COUNT, "max_tries": MAX_TRIES, "seed_step": TRY_SEED_STEP,
                 "retrain": "each model whose properties fail"},
    }


def format_fingerprint() -> str:
    """A hash of a few generated problems in both styles, so a change of wording or format misses the cache."""
    rng = random.Random(0)
    sample = [generate_problem(rng, n) for n in (2, 5, 8)]
    text = "".join(p.text + plain_solution(p) + jargon_solution(p) for p in sample)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def tokenizer_corpus(seed: int = SEED) -> list[str]:
    """Deterministic tokenizer training text: chat-framed problems and both solution styles.

    The constant instruction is not in it: it becomes one added token (see ``build_tokenizer``).
    """
    return tokenizer_texts(sft_problems(seed, (2, 8)), lambda p: [plain_solution(p), jargon_solution(p)], seed)


def measure_models(paths, count: int) -> dict:
    """The probes of the promised properties on a built world's models (:func:`tandem_rlvr.world.probe.measure_models`)."""
    from tandem_rlvr.world import probe

    return probe.measure_models(paths, count=count)


def sft_response(problem: Problem, rng: random.Random, share: float) -> str:
    """One warm-start target: the whole solution in jargon with probability ``share``, else plain."""
    return jargon_solution(problem) if rng.random() < share else plain_solution(problem)
