"""The built-in world's promised properties: what the demo's effect rests on, checked by every build.

The junior reads plain steps but not jargon; the senior writes both styles and beats the junior on
long chains. :func:`property_failures` takes what :func:`tandem_rlvr.world.probe.measure_models`
measured and lists the properties it breaks. Torch-free.
"""

from __future__ import annotations

from tandem_rlvr.world.rules import failed_checks, models_failing

PROPERTIES = {
    "junior_short_min": 0.60,  # the junior alone (greedy) on 2-3 op problems, and continuing a plain first step
    "plain_jargon_gap": 0.40,  # the junior continuing a plain first step minus continuing a jargon one
    "senior_long_margin": 0.10,  # senior minus junior (greedy) on 7-8 op problems
    "senior_jargon_rate": [0.15, 0.65],  # the senior samples (t = 0.7) both styles...
    "style_accuracy_min": 0.20,  # ...and solves problems in each
}
PROPERTY_COUNT = 32  # probe problems per length (and per handoff length) when a build checks them


def _mean(acc: dict, lengths) -> float:
    return sum(acc[n] if n in acc else acc[str(n)] for n in lengths) / len(lengths)


def property_values(measured: dict) -> dict:
    """The numbers the properties are about, from :func:`measure_models` (or a world report)."""
    j, s = measured["junior"], measured["senior"]
    sampled = s["sampled_t0.7"]
    return {
        "junior_short": _mean(j["greedy_accuracy_by_length"], (2, 3)),
        "junior_continue_plain": j["continue_after_plain_step"],
        "junior_plain_jargon_gap": j["continue_after_plain_step"] - j["continue_after_jargon_step"],
        "junior_jargon_rate": j["sampled_t0.7"]["jargon_rate"],
        "senior_long_margin": _mean(s["greedy_accuracy_by_length"], (7, 8)) - _mean(j["greedy_accuracy_by_length"], (7, 8)),
        "senior_jargon_rate": sampled["jargon_rate"],
        "senior_accuracy_jargon": sampled["accuracy_jargon"],
        "senior_accuracy_plain": sampled["accuracy_plain"],
    }


def _checks(measured: dict, props: dict) -> list[tuple[str, bool, str]]:
    """``(model to retrain, holds, what it says)`` for every promised property."""
    v, lo_hi = property_values(measured), props["senior_jargon_rate"]
    return [
        ("junior", v["junior_short"] >= props["junior_short_min"],
         f"junior short-chain accuracy {v['junior_short']:.3f} < {props['junior_short_min']}"),
        ("junior", v["junior_continue_plain"] >= props["junior_short_min"],
         f"junior continuing a plain step {v['junior_continue_plain']:.3f} < {props['junior_short_min']}"),
        ("junior", v["junior_plain_jargon_gap"] >= props["plain_jargon_gap"],
         f"junior plain-minus-jargon continuation {v['junior_plain_jargon_gap']:.3f} < {props['plain_jargon_gap']}"),
        ("junior", v["junior_jargon_rate"] == 0.0, f"junior writes jargon ({v['junior_jargon_rate']:.3f} of samples)"),
        ("senior", v["senior_long_margin"] >= props["senior_long_margin"],
         f"senior's margin over the junior on 7-8 op chains {v['senior_long_margin']:.3f} < {props['senior_long_margin']}"),
        ("senior", lo_hi[0] <= v["senior_jargon_rate"] <= lo_hi[1],
         f"senior jargon rate {v['senior_jargon_rate']:.3f} outside {lo_hi}"),
        ("senior", v["senior_accuracy_jargon"] > props["style_accuracy_min"] and v["senior_accuracy_plain"] > props["style_accuracy_min"],
         f"senior accuracy per style (jargon {v['senior_accuracy_jargon']:.3f}, plain {v['senior_accuracy_plain']:.3f}) "
         f"not above {props['style_accuracy_min']}"),
    ]


def property_failures(measured: dict, props: dict = PROPERTIES) -> list[str]:
    """The promised properties that ``measured`` breaks, one readable line each (empty: all hold)."""
    return failed_checks(_checks(measured, props))


def models_to_retrain(measured: dict, props: dict = PROPERTIES) -> list[str]:
    """The models whose properties fail (the junior's own; the senior's own and its margin over the junior)."""
    return models_failing(_checks(measured, props))
