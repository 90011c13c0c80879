"""The demo's report: a table of every metric (mean ± 95% interval over seeds), one verdict per
paper claim, and PNG plots. Pure functions of the ``results.json`` dict.

How claims are decided (over seeds; every difference is paired by seed):

- claim 1 (TRLVR's solo accuracy ≈ GRPO's) is an equivalence claim: two one-sided tests with a
  stated margin (``EQUIV_MARGIN_PTS``); reproduced only if the whole 95% t-interval of the paired
  difference lies inside ± the margin, "not reproduced" if it lies wholly outside, else inconclusive;
- claims 2–4 (TRLVR smaller than GRPO): reproduced if the 95% interval of the difference excludes 0;
- claim 5 (KL-Reg does not get TRLVR's combination, at any β of the sweep): reproduced if for every
  β KL-Reg is worse than TRLVR on solo accuracy or on the tax, each of the 2K one-sided comparisons
  judged by a (1 − 0.05/2K) two-sided interval (Bonferroni), so the chance that any "worse" in the
  verdict is a false positive is at most 5%;
- with one seed there is no interval: every claim says "direction only (one seed)".
"""

from __future__ import annotations

import math
import statistics
from pathlib import Path

from tandem_rlvr.io import atomic_write_text
from tandem_rlvr.demo.results import metric_of, arm_values, kl_runs, label, runs
from tandem_rlvr.demo.stats import equivalence, mean_ci
from tandem_rlvr.world.registry import DEFAULT_WORLD, WORLDS

EQUIV_MARGIN_PTS = 5.0  # claim 1: solo pass@1 differences within ±5 points count as "the same"
ALPHA = 0.05
METRICS = [
    ("solo_pass@1", "solo pass@1", 100, "{:.1f}"),
    ("solo_pass@4", "solo pass@4", 100, "{:.1f}"),
    ("handoff_pass@1", "step-handoff pass@1", 100, "{:.1f}"),
    ("communication_tax", "communication tax (points)", 1, "{:.1f}"),
    ("junior_ce", "junior CE (nats/token)", 1, "{:.3f}"),
    ("junior_top1", "junior top-1", 100, "{:.1f}"),
    ("kl_senior_junior", "KL(senior‖junior) MC", 1, "{:.3f}"),
    ("kl_senior_junior_exact", "KL(senior‖junior) exact", 1, "{:.3f}"),
    ("jargon_rate", "jargon rate", 100, "{:.1f}"),
    ("checkpoint_step", "evaluated checkpoint (step)", 1, "{:.1f}"),
]
ONE_SEED = "direction only (one seed)"

__all__ = ["EQUIV_MARGIN_PTS", "METRICS", "claims", "mean_ci", "metrics_table", "runs", "write_report"]


def _cell(values: list[float], scale: float, fmt: str) -> str:
    m, h = mean_ci(values)
    if math.isnan(m):
        return "n/a"
    s = fmt.format(m * scale)
    return s if math.isnan(h) else f"{s} ± {fmt.format(h * scale)}"


def curve_ps(results: dict) -> list[str]:
    """Every evaluated word-handoff probability (as stored), highest first."""
    ps = {p for m in [results["warm_start"], *(m for r in results["arms"].values() for m in r.values())]
          for p in m.get("curve", {})}
    return sorted(ps, key=float, reverse=True)


def metrics_table(results: dict) -> str:
    """Markdown table: one row per metric (every evaluated curve point included), columns warm start
    and each run."""
    names = runs(results)
    curve_keys = [(f"curve:{p}", f"word tandem pass@1, p={p}", 100, "{:.1f}") for p in curve_ps(results)]
    lines = ["| metric | warm start | " + " | ".join(label(n) for n in names) + " |", "|---" * (2 + len(names)) + "|"]
    for key, name, scale, fmt in METRICS + curve_keys:
        row = [name, _cell([metric_of(results["warm_start"], key)], scale, fmt)]
        row += [_cell(arm_values(results, n, key), scale, fmt) for n in names]
        lines.append("| " + " | ".join(row) + " |")
    return "\n".join(lines)


def paired_diffs(results: dict, key: str, a: str, b: str) -> list[float]:
    """Per-seed differences ``a - b`` over the seeds both runs have."""
    da, db = results["arms"][a], results["arms"][b]
    return [metric_of(da[s], key) - metric_of(db[s], key) for s in da if s in db]


def _diff(results: dict, key: str, a: str, b: str, level: float = 0.95) -> tuple[float, float]:
    """Mean and half-width of the ``level`` interval of the per-seed difference ``a - b``."""
    return mean_ci(paired_diffs(results, key, a, b), level)


def _sign_verdict(m: float, h: float, better_if_negative: bool) -> str:
    good = m < 0 if better_if_negative else m > 0
    if math.isnan(m):
        return "not measured"
    if math.isnan(h):
        return f"{ONE_SEED}: " + ("same direction as the paper" if good else "opposite direction to the paper")
    if good and abs(m) > h:
        return "reproduced (95% interval excludes 0)"
    if good:
        return "inconclusive: same direction as the paper, but the 95% interval includes 0"
    return "not reproduced" + (" (significantly opposite)" if abs(m) > h else "")


def _interval(m: float, h: float, scale: float, digits: int) -> str:
    if math.isnan(h):
        return f"{m * scale:+.{digits}f} (no interval)"
    return f"{m * scale:+.{digits}f} [{(m - h) * scale:+.{digits}f}, {(m + h) * scale:+.{digits}f}]"


def claim1(results: dict) -> str:
    m, h = _diff(results, "solo_pass@1", "trlvr", "grpo")
    v = equivalence([d * 100 for d in paired_diffs(results, "solo_pass@1", "trlvr", "grpo")], EQUIV_MARGIN_PTS)
    verdict = {"equivalent": "reproduced (the whole 95% interval lies inside the margin)",
               "not equivalent": "not reproduced (the whole 95% interval lies outside the margin)",
               "inconclusive": "inconclusive (the 95% interval is not inside the margin)",
               "one seed": f"{ONE_SEED}: {'within' if abs(m * 100) < EQUIV_MARGIN_PTS else 'outside'} the margin",
               "not measured": "not measured"}[v]
    return (f"1. Solo accuracy of TRLVR ≈ GRPO (equivalence margin ± {EQUIV_MARGIN_PTS:g} points, two one-sided "
            f"tests): difference {_interval(m, h, 100, 1)} points; {verdict}.")


def claim5(results: dict) -> list[str]:
    """Claim 5 over the β sweep, Bonferroni over the 2K one-sided comparisons."""
    betas = kl_runs(results)
    if not betas or not results["arms"].get("trlvr"):
        return ["5. KL-Reg does not get TRLVR's combination: not measured."]
    k = 2 * len(betas)
    level = 1 - ALPHA / k
    lines, worse_all, one_seed = [], True, False
    for n in betas:
        ms, hs = _diff(results, "solo_pass@1", n, "trlvr", level)
        mt, ht = _diff(results, "communication_tax", n, "trlvr", level)
        one_seed |= math.isnan(hs) or math.isnan(ht)
        if math.isnan(hs) or math.isnan(ht):
            worse = [w for w, ok in (("solo accuracy", ms < 0), ("tax", mt > 0)) if ok]
            tag = "worse on " + " and ".join(worse) + " (point estimate)" if worse else "not worse (point estimate)"
        else:
            worse = [w for w, ok in (("solo accuracy", ms + hs < 0), ("tax", mt - ht > 0)) if ok]
            tag = "worse on " + " and ".join(worse) if worse else "not shown worse on either"
        worse_all &= bool(worse)
        lines.append(f"   - β = {n.split('@')[1]}: solo pass@1 {_interval(ms, hs, 100, 1)} points, "
                     f"tax {_interval(mt, ht, 1, 1)} points vs TRLVR; {tag}.")
    if one_seed:
        verdict = f"{ONE_SEED}: " + ("every β is worse in point estimate" if worse_all else "some β is not worse")
    else:
        verdict = ("reproduced: at every β, KL-Reg is worse than TRLVR on solo accuracy or on the tax" if worse_all
                   else "not reproduced: at some β, KL-Reg is not shown worse than TRLVR on either")
    head = (f"5. KL-Reg does not get TRLVR's combination at any strength (β sweep {', '.join(n.split('@')[1] for n in betas)}; "
            f"{100 * level:.2f}% intervals, Bonferroni over the {k} one-sided comparisons): {verdict}.")
    return [head, *lines]


def claims(results: dict) -> list[str]:
    """One verdict per paper claim (claim 5 with one line per β)."""
    out = [claim1(results)]
    for i, (key, name, scale, unit, digits) in enumerate([
        ("communication_tax", "communication tax", 1, "points", 1),
        ("kl_senior_junior_exact", "drift KL(senior‖junior)", 1, "nats/token", 3),
        ("junior_ce", "junior cross-entropy on the senior's chains (legibility)", 1, "nats/token", 3),
    ], start=2):
        m, h = _diff(results, key, "trlvr", "grpo")
        out.append(f"{i}. TRLVR has a smaller {name} than GRPO: difference {_interval(m, h, scale, digits)} {unit}; "
                   f"{_sign_verdict(m, h, better_if_negative=True)}.")
    return out + claim5(results)


def n_seeds(results: dict) -> int:
    return min((len(v) for v in results["arms"].values()), default=0)


def _timing(results: dict) -> str:
    total = results.get("total_s")
    cpu = sum(m.get("time/job_cpu_s", 0.0) for r in results["arms"].values() for m in r.values())
    cpu += results["warm_start"].get("time/job_cpu_s", 0.0)
    head = "Total time: unfinished" if total is None or math.isnan(total) else f"Total time {total:.0f} s"
    return f"{head} (world build {results['world']['build_s']:.0f} s; the jobs' CPU time {cpu:.0f} s)."


def _build_seed(results: dict) -> str:
    """Nothing for the shipped world; for another build, ``; world build seed N (not the shipped build)``
    (``--world-seed``) or, for one rebuilt in the cache under the shipped seed (``--rebuild-world``, another CPU's
    rounding), ``; world rebuilt in the cache (not the shipped build)``."""
    world = results.get("world", {})
    seed, shipped = world.get("seed"), world.get("shipped")
    if shipped or (shipped is None and seed is None):  # results of an older version say nothing of it
        return ""
    return f"; world build seed {seed} (not the shipped build)" if seed is not None else \
        "; world rebuilt in the cache (not the shipped build)"


def _title(results: dict) -> str:
    """The report's title, naming the world (``results["world"]["name"]``, the default world when absent) in its
    record's words (:attr:`tandem_rlvr.world.registry.World.title`; a world no longer built in by its name)."""
    world = results.get("world", {}).get("name", DEFAULT_WORLD)
    return f"# Tandem RLVR demo ({WORLDS[world].title if world in WORLDS else world + ' world'})"


def write_report(results: dict, out_dir: str | Path) -> Path:
    """Write ``report.md``, the plots and ``report.html``; returns the report path."""
    from tandem_rlvr.demo.plots import write_plots

    out = Path(out_dir)
    plots = write_plots(results, out)
    plan = results["plan"]
    seeds = n_seeds(results)
    text = [
        _title(results), "",
        f"Seeds: {seeds}{'' if seeds >= plan['seeds'] else ' of the ' + str(plan['seeds']) + ' planned (an unfinished run)'}; "
        f"{plan['steps']} training steps of {plan['prompts_per_step']} prompts x "
        f"{plan['group_size']} rollouts; kl_reg β sweep {plan.get('kl_betas')}; evaluation on {plan['eval_problems']} "
        f"test problems x {plan['eval_n']} samples; token budget {plan['max_new_tokens']}; junior: {results.get('junior')}"
        f"{_build_seed(results)}. {_timing(results)}", "",
        *([f"**Direction only**: one seed gives no interval, so no claim below can be reproduced or refuted by this run; "
           f"run the full demo (several seeds) for verdicts.", ""] if seeds < 2 else []),
        "Cells: mean ± half-width of the 95% Student-t interval over seeds (no interval with one seed). "
        "Percentages for accuracies and rates.", "",
        metrics_table(results), "",
        "Evaluation metrics are measured on the test split with the junior of the run; the training curves on "
        "each arm's own rollouts (co-written with the junior for trlvr, so its jargon rate and KL there are "
        "those of team chains); the senior-alone curves on the senior's own chains on a small validation split.",
        _checkpoint_line(plan), *_selection_note(results), "",
        "## Claims", "",
        f"Differences are paired by seed, shown as mean [95% interval]; claim 1's equivalence margin is "
        f"± {EQUIV_MARGIN_PTS:g} points.", "", *claims(results), "", "## Plots", "",
        *[f"![{p.stem}]({p.name})" for p in plots], "",
    ]
    path = out / "report.md"
    atomic_write_text(path, "\n".join(text))
    demo_html(results, out, path)
    return path


def _checkpoint_line(plan: dict) -> str:
    """How the evaluated checkpoint of each run was chosen (plans written before the protocol have no ``select``)."""
    loss = plan.get("loss_type", "grpo")
    if plan.get("select") and plan.get("val_every"):
        return (f"Checkpoint (the paper's protocol): every run is evaluated at the validation step with the best "
                f"senior-alone {plan['select']} on {plan['val_problems']} validation problems x {plan['val_n']} samples "
                f"(every {plan['val_every']} steps; ties keep the earlier step; row \"evaluated checkpoint (step)\"); "
                f"loss `{loss}`.")
    return f"Checkpoint: every run is evaluated at its last step (no validation selects one); loss `{loss}`."


def choice_margins(results: dict) -> tuple[list[float], float]:
    """``(margins, se)``: per run with at least 2 validations of the selection metric (``senior/solo_<select>``),
    how far its chosen step's value lies above its last validation's (0 when it chose the last), and the largest
    standard error of one validation over the chosen values, sqrt(v (1 - v) / problems) (per-problem values lie
    in [0, 1], so their variance is at most v (1 - v)). Descriptive: whether a margin is noise also depends on how
    many validations the maximum was taken over, and the validations share their problems and seed."""
    plan = results["plan"]
    # val_problems is the most a validation reads: a shorter split would have a larger error than this bound
    key, problems = f"senior/solo_{plan.get('select')}", max(1, int(plan.get("val_problems") or 1))
    margins, se = [], 0.0
    for per_seed in results.get("curves", {}).values():
        for rows in per_seed.values():
            vals = [(r["step"], float(r[key])) for r in rows or [] if key in r]
            if len(vals) < 2:
                continue
            best = max(vals, key=lambda sv: (sv[1], -sv[0]))  # ties keep the earlier step, as the trainer does
            margins.append(best[1] - vals[-1][1])
            se = max(se, math.sqrt(best[1] * (1.0 - best[1]) / problems))
    return margins, se


def _selection_note(results: dict) -> list[str]:
    """How far the chosen checkpoints lie above the last validations, beside one validation's standard error."""
    plan = results["plan"]
    if not (plan.get("select") and plan.get("val_every")):
        return []
    margins, se = choice_margins(results)
    if not margins:
        return []
    pts = [100.0 * m for m in margins]
    return [f"How well the validation resolves that choice: the chosen step's {plan['select']} lies a median "
            f"{statistics.median(pts):.1f} points (at most {max(pts):.1f}) above the last validation's, over "
            f"{len(pts)} runs; one validation on {plan.get('val_problems')} problems has a standard error of up to "
            f"{100 * se:.1f} points. A margin within about two of those, the best of several validations, is not "
            f"shown to be a better checkpoint (a rough yardstick: validations share their problems and sampling "
            f"seed, so a difference between two of them can be less noisy than one)."]


def demo_html(results: dict, out: Path, md_path: Path) -> Path:
    """``report.html`` beside the demo's ``report.md``: its tables and plots, and every saved chain
    (``out/chains/<run>-seed<k>.jsonl``, ``warm_start.jsonl``) in the browser."""
    from tandem_rlvr.evaluation.html import read_chains, read_problems, chain_run, markdown_to_html, page

    problems = read_problems(out / "chains" / "problems.json")
    chains = []
    jobs = [("warm_start", "warm start")] + [(f"{n}-seed{s}", f"{label(n)} · seed {s}")
                                             for n in runs(results) for s in results["arms"][n]]
    for run_id, name in jobs:
        path = out / "chains" / f"{run_id}.jsonl"
        if path.is_file():
            chains.append(chain_run(run_id, name, read_chains(path), problems))
    body = markdown_to_html(md_path.read_text(encoding="utf-8"), out)
    target = out / "report.html"
    atomic_write_text(target, page("Tandem RLVR demo", body, chains))
    return target
