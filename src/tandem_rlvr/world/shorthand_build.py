"""The ``shorthand`` world's recipe, probes and promised properties (built by :mod:`tandem_rlvr.world.build`; its
record is :data:`tandem_rlvr.world.registry.SHORTHAND`).

Recipe: a tokenizer trained on problems and both styles; a **senior** warm start taught solutions whose
every step is shorthand with probability ``SHORTHAND_SHARE`` (chains of 2-8 operations, length
curriculum); a plain-only **junior** (for ``--junior weak``). The demo's main setting here is
``--junior self``: the junior is a frozen copy of the senior's warm start.

The promised properties (``PROPERTIES``), what each is for, and the probe that measures it:

* the budget favours shorthand: the plain solution of no 7-8 op problem fits ``BUDGET`` tokens, the
  shorthand solution of every 2-8 op problem does (``budget_facts``, the tokenizer alone);
* the warm senior solves short problems (greedy, 2-3 ops) and writes few shorthand steps (sampled at
  t = 0.7, 2-8 ops): RL starts from a mostly plain writer;
* shorthand is a skill it has, so RL can select it: a shorthand step it is made to write (after the gold
  shorthand first half and the marker ``>``) is right;
* a reader with the warm start's habit does not continue a terse chain within the budget: given the
  gold shorthand first half of a 7-8 op problem, the warm senior (the self-paired junior) finishes
  few within the budget;
* the junior never writes shorthand and solves short plain problems.
"""

from __future__ import annotations

import random

from tandem_rlvr.world import shorthand as S
from tandem_rlvr.data import render_prompt
from tandem_rlvr.world.sft import ModelSpec

# MAX_TRIES is part of a recipe module's interface: build.py reads it here
from tandem_rlvr.world.rules import (MAX_TRIES, SEED, budget_recipe, failed_checks, measure_pair, models_failing,
                                     seeded_specs, short_accuracy, tokenizer_texts)

VERSION = 1

JUNIOR_SPEC = ModelSpec(name="junior", hidden=96, layers=3, intermediate=256, steps=2400, short_steps=500,
                        ramp_every=100, n_ops=(2, 6), seed=SEED + 1)
SENIOR_SPEC = ModelSpec(name="senior", hidden=96, layers=3, intermediate=320, steps=2400, short_steps=500,
                        ramp_every=100, jargon_share=S.SHORTHAND_SHARE, n_ops=(2, 8), seed=SEED + 2)

PROPERTIES = {
    "plain_over_budget": 1.0,  # share of 7-8 op problems whose plain solution exceeds the budget (at least)
    "shorthand_fits": 1.0,  # share of 2-8 op problems whose shorthand solution fits the budget (at least)
    "senior_short_min": 0.60,  # the warm senior alone (greedy) on 2-3 op problems
    "senior_step_share": [0.02, 0.30],  # the warm senior's sampled (t = 0.7) steps: few in shorthand...
    "senior_step_skill_min": 0.60,  # ...but a shorthand step it is made to write is right
    "finish_long_max": 0.50,  # the warm senior finishing a 7-8 op problem after a shorthand first half (at most)
    "junior_short_min": 0.60,  # the junior alone (greedy) on 2-3 op problems; it never writes shorthand
}
PROPERTY_COUNT = 32


def model_specs(seed: int = SEED, attempt: int = 0) -> dict[str, ModelSpec]:
    """The junior's and the senior's recipe for the build seed ``seed`` and its try ``attempt``."""
    return seeded_specs(JUNIOR_SPEC, SENIOR_SPEC, seed, attempt)


def recipe(seed: int = SEED) -> dict:
    """Everything that determines the built world; its hash names the cache folder."""
    return budget_recipe(S, VERSION, seed, model_specs(seed), format_fingerprint(), PROPERTIES, PROPERTY_COUNT)


def format_fingerprint() -> str:
    """A hash of a few generated problems in both styles, so a change of wording or format misses the cache."""
    import hashlib

    from tandem_rlvr.world.problems import generate_problem

    rng = random.Random(0)
    sample = [generate_problem(rng, n) for n in (2, 5, 8)]
    text = "".join(p.text + S.solution(p, "plain") + S.shorthand_solution(p) for p in sample)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def tokenizer_corpus(seed: int = SEED) -> list[str]:
    """Deterministic tokenizer training text: chat-framed problems and both solution styles."""
    return tokenizer_texts(S.sft_problems(seed), lambda p: [S.solution(p, "plain"), S.solution(p, "shorthand")], seed)


train_problem = S.train_problem  # the warm starts' problem sampler: this world's train bucket


def sft_response(problem, rng: random.Random, share: float) -> str:
    """One warm-start target: every step (and the answer line) drawn alone, shorthand with probability ``share``
    (the style is a per-step habit, :func:`tandem_rlvr.world.shorthand.mixed_solution`)."""
    return S.mixed_solution(problem, rng, share)


# ------------------------------------------------------------------------------------- probes


def budget_facts(tok, count: int = PROPERTY_COUNT, budget: int = S.BUDGET) -> dict:
    """Token lengths against the budget: share of 7-8 op plain solutions over it, of 2-8 op shorthand
    solutions within it, and mean tokens per style and length."""
    def n_tokens(text: str) -> int:
        return len(tok(text + tok.eos_token, add_special_tokens=False)["input_ids"])

    lengths = {n: {s: [n_tokens(S.solution(p, s)) for p in S.probe_problems(n, count)] for s in ("plain", "shorthand")}
               for n in range(2, 9)}
    over = [t > budget for n in (7, 8) for t in lengths[n]["plain"]]
    fits = [t <= budget for n in range(2, 9) for t in lengths[n]["shorthand"]]
    return {"budget": budget, "plain_over_budget_7_8": sum(over) / len(over), "shorthand_fits": sum(fits) / len(fits),
            "mean_tokens": {n: {s: round(sum(v) / len(v), 1) for s, v in d.items()} for n, d in lengths.items()}}


def budget_accuracy(model, tok, problems, prefixes, temperature: float = 0.0, seed: int = 0, budget: int = S.BUDGET,
                    top_k: int = 0, top_p: float = 1.0):
    """Accuracy (and texts, prefix included, cut to ``budget`` tokens) of ``model`` continuing ``prompt + prefix``
    (sampled at ``temperature``, filtered by ``top_k`` / ``top_p`` where set; greedy at 0)."""
    from tandem_rlvr.world.probe import complete
    from tandem_rlvr.world.problems import is_correct

    prompts = [render_prompt(tok, p.text) + pre for p, pre in zip(problems, prefixes)]
    widths = [budget - len(tok(pre, add_special_tokens=False)["input_ids"]) for pre in prefixes]
    texts = complete(model, tok, prompts, temperature=temperature, max_new_tokens=max(widths), seed=seed,
                     top_k=top_k, top_p=top_p)
    texts = [pre + tok.decode(tok(t, add_special_tokens=False)["input_ids"][:w])
             for pre, t, w in zip(prefixes, texts, widths)]
    return sum(is_correct(t, p.answer) for t, p in zip(texts, problems)) / len(problems), texts


def _half(problem, style: str) -> str:
    """The gold solution's first half of steps (rounded down) in ``style``."""
    return "".join(S.steps(problem, style)[: len(problem.ops) // 2])


def shorthand_step_accuracy(model, tok, problems) -> float:
    """Share of shorthand steps written right (greedy) when the model is made to write one: after the gold
    shorthand first half and the step marker ``>``."""
    from tandem_rlvr.world.probe import complete

    prefixes = [_half(p, "shorthand") + ">" for p in problems]  # the marker's own token; the space starts the next
    golds = [S.steps(p, "shorthand")[len(p.ops) // 2][1:].rstrip("\n") for p in problems]
    texts = complete(model, tok, [render_prompt(tok, p.text) + pre for p, pre in zip(problems, prefixes)],
                     max_new_tokens=10)
    return sum(t.startswith(g) for t, g in zip(texts, golds)) / len(problems)


def measure_model(model, tok, count: int) -> dict:
    """One model's probes (every chain within the budget): greedy accuracy by length; sampled chains
    (t = 0.7, 2-8 ops): accuracy, shorthand chains, shorthand steps; the skill of a forced shorthand step
    (3-6 ops); finishing a 7-8 op problem after its gold first half in shorthand (greedy)."""
    by_len = {n: S.probe_problems(n, count) for n in range(2, 9)}
    pooled = [p for n in range(2, 9) for p in by_len[n]]
    greedy = {n: budget_accuracy(model, tok, ps, [""] * len(ps))[0] for n, ps in by_len.items()}
    sampled_acc, texts = budget_accuracy(model, tok, pooled, [""] * len(pooled), temperature=0.7)
    long = [p for n in (7, 8) for p in by_len[n]]
    return {
        "greedy_accuracy_by_length": greedy,
        "sampled_t0.7": {"accuracy": sampled_acc, "shorthand_rate": S.shorthand_rate(texts),
                         "shorthand_step_share": S.shorthand_step_share(texts)},
        "shorthand_step_accuracy": shorthand_step_accuracy(model, tok, [p for n in (3, 4, 5, 6) for p in by_len[n]]),
        "finish_long_after_shorthand_half": budget_accuracy(model, tok, long, [_half(p, "shorthand") for p in long])[0],
    }


def measure_models(paths, count: int = PROPERTY_COUNT) -> dict:
    """The budget facts and both models' probes, single-threaded (one machine measures the same numbers)."""
    return measure_pair(paths, count, budget_facts, lambda model, tok, n, role: measure_model(model, tok, n))


# --------------------------------------------------------------------------------- properties


def property_values(measured: dict) -> dict:
    """The numbers the properties are about, from :func:`measure_models`."""
    j, s, b = measured["junior"], measured["senior"], measured["budget"]

    return {
        "plain_over_budget": b["plain_over_budget_7_8"], "shorthand_fits": b["shorthand_fits"],
        "senior_short": short_accuracy(s), "senior_step_share": s["sampled_t0.7"]["shorthand_step_share"],
        "senior_step_skill": s["shorthand_step_accuracy"], "senior_finish_long": s["finish_long_after_shorthand_half"],
        "junior_short": short_accuracy(j), "junior_step_share": j["sampled_t0.7"]["shorthand_step_share"],
    }


def _checks(measured: dict, props: dict) -> list[tuple[str, bool, str]]:
    """``(model to retrain, holds, what it says)`` for every promised property."""
    v, (lo, hi) = property_values(measured), props["senior_step_share"]
    return [
        ("senior", v["plain_over_budget"] >= props["plain_over_budget"],
         f"only {v['plain_over_budget']:.3f} of 7-8 op plain solutions exceed the budget"),
        ("senior", v["shorthand_fits"] >= props["shorthand_fits"], f"only {v['shorthand_fits']:.3f} of shorthand solutions fit"),
        ("senior", v["senior_short"] >= props["senior_short_min"],
         f"senior short-chain accuracy {v['senior_short']:.3f} < {props['senior_short_min']}"),
        ("senior", lo <= v["senior_step_share"] <= hi, f"senior shorthand step share {v['senior_step_share']:.3f} outside {[lo, hi]}"),
        ("senior", v["senior_step_skill"] >= props["senior_step_skill_min"],
         f"senior's forced shorthand steps right {v['senior_step_skill']:.3f} < {props['senior_step_skill_min']}"),
        ("senior", v["senior_finish_long"] <= props["finish_long_max"],
         f"senior finishes long problems after a shorthand half {v['senior_finish_long']:.3f} > {props['finish_long_max']}"),
        ("junior", v["junior_short"] >= props["junior_short_min"],
         f"junior short-chain accuracy {v['junior_short']:.3f} < {props['junior_short_min']}"),
        ("junior", v["junior_step_share"] == 0.0, f"junior writes shorthand steps ({v['junior_step_share']:.3f} of steps)"),
    ]


def property_failures(measured: dict, props: dict = PROPERTIES) -> list[str]:
    """The promised properties that ``measured`` breaks, one readable line each (empty: all hold)."""
    return failed_checks(_checks(measured, props))


def models_to_retrain(measured: dict, props: dict = PROPERTIES) -> list[str]:
    """The models whose properties fail."""
    return models_failing(_checks(measured, props))
