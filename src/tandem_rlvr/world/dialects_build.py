"""The ``dialects`` world's recipe, probes and promised properties (built by :mod:`tandem_rlvr.world.build`; its
record is :data:`tandem_rlvr.world.registry.DIALECTS`).

Recipe: a tokenizer trained on problems and all three styles; a **senior** warm start taught whole ledger
chains with probability ``LEDGER_SHARE`` (its spec's ``jargon_share``) and otherwise the shorthand world's
per-step mixture (each step shorthand with probability ``SHORTHAND_SHARE``); a plain-only **junior** (for
``--junior weak``). The demo's main setting here is ``--junior self``.

The promised properties (``PROPERTIES``), what each is for, and the probe that measures it:

* the budget pays only terse chains on long problems: the plain solution of no 7-8 op problem fits
  ``BUDGET`` tokens, the shorthand and the ledger solution of every 2-8 op problem do (``budget_facts``);
* the warm senior solves short problems (greedy, 2-3 ops); sampled at the demo's training temperature
  (t = 0.6, 2-8 ops) it writes few shorthand steps and few ledger chains, but some: RL can find both;
* both dialects are skills it has: a shorthand step it is made to write is right; made to start in
  ledger (after the marker line) it solves 5-8 op problems within the budget;
* its copy follows ledger but not shorthand: after the gold ledger first half of a 7-8 op problem the
  warm senior (the self-paired junior) finishes it within the budget, right; after the gold shorthand
  first half it finishes few within the budget;
* the junior writes neither dialect and solves short plain problems.
"""

from __future__ import annotations

import random
from functools import partial

from tandem_rlvr.world import dialects as D
# MAX_TRIES is part of a recipe module's interface: build.py reads it here
from tandem_rlvr.world.rules import (MAX_TRIES, SEED, budget_recipe, failed_checks, measure_pair, models_failing,
                                     seeded_specs, short_accuracy, tokenizer_texts)
from tandem_rlvr.world.sft import ModelSpec
from tandem_rlvr.world.shorthand_build import budget_accuracy, shorthand_step_accuracy  # dialect A: its steps

VERSION = 1
TEMPERATURE = 0.6  # the demo's rollout temperature: the sampled-style probes use it

JUNIOR_SPEC = ModelSpec(name="junior", hidden=96, layers=3, intermediate=256, steps=2400, short_steps=500,
                        ramp_every=100, n_ops=(2, 6), seed=SEED + 1)
SENIOR_SPEC = ModelSpec(name="senior", hidden=96, layers=3, intermediate=320, steps=3000, short_steps=500,
                        ramp_every=100, jargon_share=D.LEDGER_SHARE, n_ops=(2, 8), seed=SEED + 2)

PROPERTIES = {
    "plain_over_budget": 1.0,  # share of 7-8 op problems whose plain solution exceeds the budget (at least)
    "shorthand_fits": 1.0,  # share of 2-8 op problems whose shorthand solution fits the budget (at least)
    "ledger_fits": 1.0,  # share of 2-8 op problems whose ledger solution fits the budget (at least)
    "senior_short_min": 0.60,  # the warm senior alone (greedy) on 2-3 op problems
    "senior_step_share": [0.02, 0.30],  # its sampled (t = 0.6) steps: few in shorthand...
    "senior_ledger_rate": [0.01, 0.10],  # ...and few chains in ledger, but some (64 rollouts a step find them)
    "senior_step_skill_min": 0.60,  # a shorthand step it is made to write is right
    # made to start in ledger, it solves 5-8 op problems within the budget: far above what plain chains can
    # there (no 7-8 op plain chain fits the budget, and few 5 op ones), so a ledger chain RL finds pays. Set
    # from a first design's measure: its senior solved .375 of 5 and of 7 op problems in plain with no
    # budget at all, so no dialect can be asked for much more (docs/demo.md, "The third world")
    "senior_ledger_skill_min": 0.30,
    "finish_ledger_min": 0.50,  # the warm senior finishing a 7-8 op problem after a gold ledger first half
    "finish_long_max": 0.50,  # ...and after a gold shorthand first half (at most)
    "junior_short_min": 0.60,  # the junior alone (greedy) on 2-3 op problems; it writes neither dialect
}
PROPERTY_COUNT = 32
_accuracy = partial(budget_accuracy, budget=D.BUDGET)  # (accuracy, texts) of chains within this world's budget


def model_specs(seed: int = SEED, attempt: int = 0) -> dict[str, ModelSpec]:
    """The junior's and the senior's recipe for the build seed ``seed`` and its try ``attempt``."""
    return seeded_specs(JUNIOR_SPEC, SENIOR_SPEC, seed, attempt)


def recipe(seed: int = SEED) -> dict:
    """Everything that determines the built world; its hash names the cache folder."""
    styles = {"ledger_chain_share": D.LEDGER_SHARE, "shorthand_step_share": D.SHORTHAND_SHARE,
              "ledger_marker": D.LEDGER_MARKER}
    return budget_recipe(D, VERSION, seed, model_specs(seed), format_fingerprint(), PROPERTIES, PROPERTY_COUNT,
                         styles, temperature=TEMPERATURE)


def format_fingerprint() -> str:
    """A hash of a few generated problems in every style, so a change of wording or format misses the cache."""
    import hashlib

    from tandem_rlvr.world.problems import generate_problem

    rng = random.Random(0)
    sample = [generate_problem(rng, n) for n in (2, 5, 8)]
    text = "".join(p.text + "".join(D.solution(p, s) for s in D.STYLES) for p in sample)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def tokenizer_corpus(seed: int = SEED) -> list[str]:
    """Deterministic tokenizer training text: chat-framed problems and their solutions in every style."""
    return tokenizer_texts(D.sft_problems(seed), lambda p: [D.solution(p, s) for s in D.STYLES], seed)


train_problem = D.train_problem  # the warm starts' problem sampler: this world's train bucket


def sft_response(problem, rng: random.Random, share: float) -> str:
    """One warm-start target. ``share`` (the spec's ``jargon_share``) is the share of whole ledger chains; a
    model taught any (the senior) writes its other chains as per-step mixtures with shorthand steps at
    ``SHORTHAND_SHARE``; a model taught none (``share`` 0: the junior) writes plain only."""
    if share <= 0.0:
        return D.solution(problem, "plain")
    return D.dialect_solution(problem, rng, share, D.SHORTHAND_SHARE)


# ------------------------------------------------------------------------------------- probes


def budget_facts(tok, count: int = PROPERTY_COUNT, budget: int = D.BUDGET) -> dict:
    """Token lengths against the budget: share of 7-8 op plain solutions over it, of 2-8 op shorthand and
    ledger solutions within it, and mean and longest tokens per style and length."""
    def n_tokens(text: str) -> int:
        return len(tok(text + tok.eos_token, add_special_tokens=False)["input_ids"])

    lengths = {n: {s: [n_tokens(D.solution(p, s)) for p in D.probe_problems(n, count)] for s in D.STYLES}
               for n in range(2, 9)}
    over = [t > budget for n in (7, 8) for t in lengths[n]["plain"]]

    def fits(style: str) -> float:
        ok = [t <= budget for n in range(2, 9) for t in lengths[n][style]]
        return sum(ok) / len(ok)

    return {"budget": budget, "plain_over_budget_7_8": sum(over) / len(over), "shorthand_fits": fits("shorthand"),
            "ledger_fits": fits("ledger"),
            "mean_tokens": {n: {s: round(sum(v) / len(v), 1) for s, v in d.items()} for n, d in lengths.items()},
            "max_tokens": {n: {s: max(v) for s, v in d.items()} for n, d in lengths.items()}}


def sampled_style(model, tok, problems) -> dict:
    """The model's chains sampled at the demo's temperature (within the budget): accuracy and style shares."""
    acc, texts = _accuracy(model, tok, problems, [""] * len(problems), temperature=TEMPERATURE)
    return {"accuracy": acc, "shorthand_rate": D.shorthand_rate(texts), "ledger_rate": D.ledger_rate(texts),
            "shorthand_step_share": D.shorthand_step_share(texts), "ledger_step_share": D.ledger_step_share(texts)}


def measure_model(model, tok, count: int, skills: bool = True) -> dict:
    """One model's probes (every chain within the budget): greedy accuracy by length; sampled chains (t = 0.6,
    2-8 ops); with ``skills`` (the senior) the skill of a forced shorthand step (3-6 ops), of a chain forced to
    start in ledger (5-8 ops) and, for reference, its greedy accuracy there with no budget, and finishing a 7-8 op problem after its gold first half in either dialect."""
    by_len = {n: D.probe_problems(n, count) for n in range(2, 9)}
    out = {"greedy_accuracy_by_length": {n: _accuracy(model, tok, ps, [""] * len(ps))[0] for n, ps in by_len.items()},
           "sampled": sampled_style(model, tok, [p for n in range(2, 9) for p in by_len[n]])}
    if skills:
        mid, late, long = ([p for n in ns for p in by_len[n]] for ns in ((3, 4, 5, 6), (5, 6, 7, 8), (7, 8)))
        out["shorthand_step_accuracy"] = shorthand_step_accuracy(model, tok, mid)
        out["forced_ledger_accuracy_5_8"] = _accuracy(model, tok, late, [D.LEDGER_MARKER] * len(late))[0]
        out["greedy_accuracy_5_8_no_budget"] = _accuracy(model, tok, late, [""] * len(late), budget=4 * D.BUDGET)[0]
        for style in ("shorthand", "ledger"):
            out[f"finish_long_after_{style}_half"] = _accuracy(
                model, tok, long, [D.head(p, style, len(p.ops) // 2) for p in long])[0]
    return out


def measure_models(paths, count: int = PROPERTY_COUNT) -> dict:
    """The budget facts and both models' probes, single-threaded (one machine measures the same numbers)."""
    return measure_pair(paths, count, budget_facts,
                        lambda model, tok, n, role: measure_model(model, tok, n, skills=role == "senior"))


# --------------------------------------------------------------------------------- properties


def property_values(measured: dict) -> dict:
    """The numbers the properties are about, from :func:`measure_models`."""
    j, s, b = measured["junior"], measured["senior"], measured["budget"]

    return {
        "plain_over_budget": b["plain_over_budget_7_8"], "shorthand_fits": b["shorthand_fits"],
        "ledger_fits": b["ledger_fits"],
        "senior_short": short_accuracy(s), "senior_step_share": s["sampled"]["shorthand_step_share"],
        "senior_ledger_rate": s["sampled"]["ledger_rate"],
        "senior_step_skill": s["shorthand_step_accuracy"], "senior_ledger_skill": s["forced_ledger_accuracy_5_8"],
        "senior_finish_ledger": s["finish_long_after_ledger_half"],
        "senior_finish_long": s["finish_long_after_shorthand_half"],
        "junior_short": short_accuracy(j),
        "junior_dialect_steps": j["sampled"]["shorthand_step_share"] + j["sampled"]["ledger_step_share"],
    }


def _window(v: dict, props: dict, key: str, what: str) -> tuple[str, bool, str]:
    lo, hi = props[key]
    return "senior", lo <= v[key] <= hi, f"senior {what} {v[key]:.3f} outside {[lo, hi]}"


def _floor(v: dict, props: dict, key: str, bound: str, what: str, who: str = "senior") -> tuple[str, bool, str]:
    return who, v[key] >= props[bound], f"{what} {v[key]:.3f} < {props[bound]}"


def _checks(measured: dict, props: dict) -> list[tuple[str, bool, str]]:
    """``(model to retrain, holds, what it says)`` for every promised property."""
    v = property_values(measured)
    return [
        _floor(v, props, "plain_over_budget", "plain_over_budget", "share of 7-8 op plain solutions over the budget"),
        _floor(v, props, "shorthand_fits", "shorthand_fits", "share of shorthand solutions within the budget"),
        _floor(v, props, "ledger_fits", "ledger_fits", "share of ledger solutions within the budget"),
        _floor(v, props, "senior_short", "senior_short_min", "senior short-chain accuracy"),
        _window(v, props, "senior_step_share", "shorthand step share"),
        _window(v, props, "senior_ledger_rate", "ledger chain share"),
        _floor(v, props, "senior_step_skill", "senior_step_skill_min", "senior's forced shorthand steps right"),
        _floor(v, props, "senior_ledger_skill", "senior_ledger_skill_min", "senior's forced ledger chains (5-8 ops) right"),
        _floor(v, props, "senior_finish_ledger", "finish_ledger_min", "senior finishing long problems after a ledger half"),
        ("senior", v["senior_finish_long"] <= props["finish_long_max"],
         f"senior finishes long problems after a shorthand half {v['senior_finish_long']:.3f} > {props['finish_long_max']}"),
        _floor(v, props, "junior_short", "junior_short_min", "junior short-chain accuracy", "junior"),
        ("junior", v["junior_dialect_steps"] == 0.0,
         f"junior writes shorthand or ledger steps ({v['junior_dialect_steps']:.3f} of steps)"),
    ]


def property_failures(measured: dict, props: dict = PROPERTIES) -> list[str]:
    """The promised properties that ``measured`` breaks, one readable line each (empty: all hold)."""
    return failed_checks(_checks(measured, props))


def models_to_retrain(measured: dict, props: dict = PROPERTIES) -> list[str]:
    """The models whose properties fail."""
    return models_failing(_checks(measured, props))
