"""The ``slips`` world's recipe, probes and promised properties (built by :mod:`tandem_rlvr.world.build`; its
record is :data:`tandem_rlvr.world.registry.SLIPS`).

Recipe: a tokenizer trained on problems and both styles; a **senior** warm start taught whole ledger chains
with probability ``LEDGER_SHARE`` (its spec's ``jargon_share``), each ledger line after the first ``SLIP_FROM``
slipping one too high with probability ``SLIP_RATE``, plain chains otherwise; a plain-only **junior** (for
``--junior weak``). The demo's main setting here is ``--junior self``.

The promised properties (``PROPERTIES``), what each is for, and the probe that measures it:

* the budget pays only ledger on long problems: no 7-8 op plain solution fits ``BUDGET`` tokens, every 2-8
  op ledger solution does (``budget_facts``);
* the warm senior solves short problems (greedy, 2-3 ops); sampled at the demo's training temperature
  (t = 0.6, 2-8 ops) it writes few ledger chains, but some: RL can find them;
* its short ledger is clean and its long ledger slips, often enough to cost a chain but not so often that
  none pays: made to start in ledger (after the marker line) and sampled at t = 0.6, it solves 2-4 op
  problems about as well as in plain (so RL does not drop ledger on the short problems, as design 7's
  senior, slipping on every line, made it do), a share of its late lines (after the first ``SLIP_FROM``)
  slip on 5-8 op problems, and some of those chains are still right within the budget;
* its copy keeps slipping where the demo evaluates: continuing after the gold ledger first half of a 5-8
  op problem with the evaluation's decoding (t = 0.7, top-k 20, top-p 0.8), a share of its late ledger
  lines (all its own) slip: the nucleus does not cut the slip away;
* the junior writes no ledger and solves short plain problems.
"""

from __future__ import annotations

import random
from functools import partial

from tandem_rlvr.world import slips as W
# MAX_TRIES is part of a recipe module's interface: build.py reads it here
from tandem_rlvr.world.rules import (MAX_TRIES, SEED, budget_recipe, failed_checks, measure_pair, models_failing,
                                     seeded_specs, short_accuracy, tokenizer_texts)
from tandem_rlvr.world.sft import ModelSpec
from tandem_rlvr.world.shorthand_build import budget_accuracy

VERSION = 1
TEMPERATURE = 0.6  # the demo's rollout temperature: the sampled probes use it
EVAL_DECODING = {"temperature": 0.7, "top_k": 20, "top_p": 0.8}  # the demo's (and the paper's) evaluation decoding

JUNIOR_SPEC = ModelSpec(name="junior", hidden=96, layers=3, intermediate=256, steps=2400, short_steps=500,
                        ramp_every=100, n_ops=(2, 6), seed=SEED + 1)
SENIOR_SPEC = ModelSpec(name="senior", hidden=96, layers=3, intermediate=320, steps=3000, short_steps=500,
                        ramp_every=100, jargon_share=W.LEDGER_SHARE, n_ops=(2, 8), seed=SEED + 2)

PROPERTIES = {
    "plain_over_budget": 1.0,  # share of 7-8 op problems whose plain solution exceeds the budget (at least)
    "ledger_fits": 1.0,  # share of 2-8 op problems whose (gold) ledger solution fits the budget (at least)
    "senior_short_min": 0.60,  # the warm senior alone (greedy) on 2-3 op problems
    "senior_ledger_rate": [0.03, 0.30],  # its sampled (t = 0.6) chains in ledger: few, but some
    "senior_short_ledger_min": 0.80,  # its forced ledger chains (t = 0.6) on 2-4 op problems, right
    "senior_slip_rate": [0.10, 0.50],  # share of its forced ledger lines after the first SLIP_FROM that slip (5-8 ops)
    "senior_ledger_skill_min": 0.15,  # its forced ledger chains (t = 0.6, 5-8 ops) right within the budget
    "copy_eval_slip_min": 0.10,  # share of the copy's late ledger lines that slip under the evaluation's decoding
    "junior_short_min": 0.60,  # the junior alone (greedy) on 2-3 op problems; it writes no ledger
}
PROPERTY_COUNT = 32
_accuracy = partial(budget_accuracy, budget=W.BUDGET)  # (accuracy, texts) of chains within this world's budget


def model_specs(seed: int = SEED, attempt: int = 0) -> dict[str, ModelSpec]:
    """The junior's and the senior's recipe for the build seed ``seed`` and its try ``attempt``."""
    return seeded_specs(JUNIOR_SPEC, SENIOR_SPEC, seed, attempt)


def recipe(seed: int = SEED) -> dict:
    """Everything that determines the built world; its hash names the cache folder."""
    styles = {"ledger_chain_share": W.LEDGER_SHARE, "slip_rate": W.SLIP_RATE, "slip_from": W.SLIP_FROM,
              "ledger_marker": W.LEDGER_MARKER}
    return budget_recipe(W, VERSION, seed, model_specs(seed), format_fingerprint(), PROPERTIES, PROPERTY_COUNT,
                         styles, temperature=TEMPERATURE, eval_decoding=EVAL_DECODING)


def format_fingerprint() -> str:
    """A hash of a few generated problems in every style (a slipped ledger chain too), so a change of wording
    or format misses the cache."""
    import hashlib

    from tandem_rlvr.world.problems import generate_problem

    rng = random.Random(0)
    sample = [generate_problem(rng, n) for n in (2, 5, 8)]
    text = "".join(p.text + "".join(W.solution(p, s) for s in W.STYLES) + W.slipped_ledger_solution(p, rng)
                   for p in sample)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def tokenizer_corpus(seed: int = SEED) -> list[str]:
    """Deterministic tokenizer training text: chat-framed problems and their solutions in both styles."""
    return tokenizer_texts(W.sft_problems(seed), lambda p: [W.solution(p, s) for s in W.STYLES], seed)


train_problem = W.train_problem  # the warm starts' problem sampler: this world's train bucket


def sft_response(problem, rng: random.Random, share: float) -> str:
    """One warm-start target: a whole (slipping) ledger chain with probability ``share`` (the spec's
    ``jargon_share``), else plain; a model taught none (the junior) writes plain only."""
    if share <= 0.0:
        return W.solution(problem, "plain")
    return W.warm_solution(problem, rng, share)


# ------------------------------------------------------------------------------------- probes


def budget_facts(tok, count: int = PROPERTY_COUNT, budget: int = W.BUDGET) -> dict:
    """Token lengths against the budget: share of 7-8 op plain solutions over it, of 2-8 op ledger solutions
    within it, and mean and longest tokens per style and length."""
    def n_tokens(text: str) -> int:
        return len(tok(text + tok.eos_token, add_special_tokens=False)["input_ids"])

    lengths = {n: {s: [n_tokens(W.solution(p, s)) for p in W.probe_problems(n, count)] for s in W.STYLES}
               for n in range(2, 9)}
    over = [t > budget for n in (7, 8) for t in lengths[n]["plain"]]
    fits = [t <= budget for n in range(2, 9) for t in lengths[n]["ledger"]]
    return {"budget": budget, "plain_over_budget_7_8": sum(over) / len(over), "ledger_fits": sum(fits) / len(fits),
            "mean_tokens": {n: {s: round(sum(v) / len(v), 1) for s, v in d.items()} for n, d in lengths.items()},
            "max_tokens": {n: {s: max(v) for s, v in d.items()} for n, d in lengths.items()}}


def measure_model(model, tok, count: int, skills: bool = True) -> dict:
    """One model's probes (every chain within the budget): greedy accuracy by length; sampled chains (t = 0.6,
    2-8 ops); with ``skills`` (the senior) its forced ledger chains sampled at t = 0.6 on 2-4 op problems
    (accuracy) and on 5-8 op problems (accuracy, slips of the late lines) and greedy (reference), and its
    continuation after the gold ledger first half of a 5-8 op problem under the evaluation's decoding
    (accuracy, slips of the late lines: all its own, since a half is at most ``SLIP_FROM`` lines)."""
    by_len = {n: W.probe_problems(n, count) for n in range(2, 9)}
    greedy = {n: _accuracy(model, tok, ps, [""] * len(ps))[0] for n, ps in by_len.items()}
    every = [p for n in range(2, 9) for p in by_len[n]]
    acc, texts = _accuracy(model, tok, every, [""] * len(every), temperature=TEMPERATURE)
    out = {"greedy_accuracy_by_length": greedy,
           "sampled": {"accuracy": acc, "ledger_rate": W.ledger_rate(texts), "slip_rate": W.slip_rate(texts)}}
    if skills:
        short, late = ([p for n in ns for p in by_len[n]] for ns in ((2, 3, 4), (5, 6, 7, 8)))
        short_ledger = [W.LEDGER_MARKER] * len(short)
        out["forced_ledger_2_4"] = _accuracy(model, tok, short, short_ledger, temperature=TEMPERATURE)[0]
        marker = [W.LEDGER_MARKER] * len(late)
        acc, texts = _accuracy(model, tok, late, marker, temperature=TEMPERATURE)
        out["forced_ledger_5_8"] = {"accuracy": acc, "slip_rate": W.slip_rate(texts, W.SLIP_FROM)}
        out["forced_ledger_5_8_greedy"] = _accuracy(model, tok, late, marker)[0]
        halves = [W.head(p, "ledger", len(p.ops) // 2) for p in late]
        acc, texts = _accuracy(model, tok, late, halves, **EVAL_DECODING)
        out["copy_after_ledger_half_eval"] = {"accuracy": acc, "slip_rate": W.slip_rate(texts, W.SLIP_FROM)}
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
        "plain_over_budget": b["plain_over_budget_7_8"], "ledger_fits": b["ledger_fits"],
        "senior_short": short_accuracy(s), "senior_ledger_rate": s["sampled"]["ledger_rate"],
        "senior_short_ledger": s["forced_ledger_2_4"],
        "senior_slip_rate": s["forced_ledger_5_8"]["slip_rate"],
        "senior_ledger_skill": s["forced_ledger_5_8"]["accuracy"],
        "copy_eval_slip": s["copy_after_ledger_half_eval"]["slip_rate"],
        "junior_short": short_accuracy(j), "junior_ledger_rate": j["sampled"]["ledger_rate"],
    }


def _checks(measured: dict, props: dict) -> list[tuple[str, bool, str]]:
    """``(model to retrain, holds, what it says)`` for every promised property."""
    v = property_values(measured)

    def floor(key: str, bound: str, what: str, who: str = "senior"):
        return who, v[key] >= props[bound], f"{what} {v[key]:.3f} < {props[bound]}"

    def window(key: str, what: str):
        lo, hi = props[key]
        return "senior", lo <= v[key] <= hi, f"senior {what} {v[key]:.3f} outside {[lo, hi]}"

    return [
        floor("plain_over_budget", "plain_over_budget", "share of 7-8 op plain solutions over the budget"),
        floor("ledger_fits", "ledger_fits", "share of ledger solutions within the budget"),
        floor("senior_short", "senior_short_min", "senior short-chain accuracy"),
        window("senior_ledger_rate", "ledger chain share"),
        floor("senior_short_ledger", "senior_short_ledger_min", "senior's forced ledger chains (2-4 ops) right"),
        window("senior_slip_rate", "forced ledger late-line slip rate"),
        floor("senior_ledger_skill", "senior_ledger_skill_min", "senior's forced ledger chains (5-8 ops) right"),
        floor("copy_eval_slip", "copy_eval_slip_min", "the copy's late-line slip rate under the evaluation's decoding"),
        floor("junior_short", "junior_short_min", "junior short-chain accuracy", "junior"),
        ("junior", v["junior_ledger_rate"] == 0.0, f"junior writes ledger chains ({v['junior_ledger_rate']:.3f})"),
    ]


def property_failures(measured: dict, props: dict = PROPERTIES) -> list[str]:
    """The promised properties that ``measured`` breaks, one readable line each (empty: all hold)."""
    return failed_checks(_checks(measured, props))


def models_to_retrain(measured: dict, props: dict = PROPERTIES) -> list[str]:
    """The models whose properties fail."""
    return models_failing(_checks(measured, props))
