"""The demo's report: a table of every metric (mean ± 95% interval over seeds), one verdict per
paper claim, and PNG plots. Pure functions of the ``results.json`` dict."""

from __future__ import annotations

import math
from pathlib import Path

from tandem_rlvr.io import atomic_write_text

# two-sided 95% Student-t quantiles by degrees of freedom (1..10); larger df use 1.96
T95 = {1: 12.706, 2: 4.303, 3: 3.182, 4: 2.776, 5: 2.571, 6: 2.447, 7: 2.365, 8: 2.306, 9: 2.262, 10: 2.228}
ARMS = ("grpo", "trlvr", "kl_reg")
METRICS = [
    ("solo_pass@1", "solo pass@1", 100, "{:.1f}"),
    ("solo_pass@4", "solo pass@4", 100, "{:.1f}"),
    ("handoff_pass@1", "step-handoff pass@1", 100, "{:.1f}"),
    ("communication_tax", "communication tax (points)", 1, "{:.1f}"),
    ("junior_ce", "junior CE (nats/token)", 1, "{:.3f}"),
    ("junior_top1", "junior top-1", 100, "{:.1f}"),
    ("kl_senior_junior", "KL(senior||junior) MC", 1, "{:.3f}"),
    ("kl_senior_junior_exact", "KL(senior||junior) exact", 1, "{:.3f}"),
    ("jargon_rate", "jargon rate", 100, "{:.1f}"),
]


def mean_ci(values: list[float]) -> tuple[float, float]:
    """Mean and half-width of the 95% t-interval (nan half-width for one value)."""
    vals = [v for v in values if v is not None and not math.isnan(v)]
    if not vals:
        return float("nan"), float("nan")
    m = sum(vals) / len(vals)
    if len(vals) < 2:
        return m, float("nan")
    sd = math.sqrt(sum((v - m) ** 2 for v in vals) / (len(vals) - 1))
    return m, T95.get(len(vals) - 1, 1.96) * sd / math.sqrt(len(vals))


def _values(results: dict, arm: str, key: str) -> list[float]:
    return [_get(m, key) for m in results["arms"][arm].values()]


def _get(metrics: dict, key: str) -> float:
    if key.startswith("curve:"):
        return float(metrics.get("curve", {}).get(key[6:], float("nan")))
    v = metrics.get(key, float("nan"))
    return float(v) if v is not None else float("nan")


def _cell(values: list[float], scale: float, fmt: str) -> str:
    m, h = mean_ci(values)
    if math.isnan(m):
        return "n/a"
    s = fmt.format(m * scale)
    return s if math.isnan(h) else f"{s} ± {fmt.format(h * scale)}"


def metrics_table(results: dict) -> str:
    """Markdown table: one row per metric, columns warm start and each arm."""
    curve_keys = [(f"curve:{p}", f"word tandem pass@1, p={p}", 100, "{:.1f}")
                  for p in results["warm_start"].get("curve", {})]
    lines = ["| metric | warm start | " + " | ".join(ARMS) + " |", "|---" * (2 + len(ARMS)) + "|"]
    for key, label, scale, fmt in METRICS + curve_keys:
        row = [label, _cell([_get(results["warm_start"], key)], scale, fmt)]
        row += [_cell(_values(results, a, key), scale, fmt) for a in ARMS]
        lines.append("| " + " | ".join(row) + " |")
    return "\n".join(lines)


def _diff(results: dict, key: str, a: str, b: str) -> tuple[float, float]:
    """Mean and 95% half-width of the per-seed difference ``a - b``."""
    da, db = results["arms"][a], results["arms"][b]
    return mean_ci([_get(da[s], key) - _get(db[s], key) for s in da if s in db])


def _verdict(m: float, h: float, better_if_negative: bool) -> str:
    good = m < 0 if better_if_negative else m > 0
    if math.isnan(m):
        return "not measured"
    if math.isnan(h):
        return "same direction as the paper (one seed: no interval)" if good else "opposite direction to the paper (one seed)"
    if good and abs(m) > h:
        return "reproduced (95% interval excludes 0)"
    if good:
        return "same direction as the paper, but the 95% interval includes 0"
    return "not reproduced" + (" (significantly opposite)" if abs(m) > h else "")


def claims(results: dict) -> list[str]:
    """One sentence per paper claim saying whether this run reproduces it."""
    out = []
    m, h = _diff(results, "solo_pass@1", "trlvr", "grpo")
    close = abs(m) * 100 <= 5 or (not math.isnan(h) and abs(m) <= h)
    out.append(f"1. Solo accuracy of TRLVR ≈ GRPO: difference {m * 100:+.1f} points (± {h * 100:.1f}); "
               + ("reproduced (within 5 points or within the interval)." if close else "not reproduced."))
    for i, (key, name, scale, unit) in enumerate([
        ("communication_tax", "communication tax", 1, "points"),
        ("kl_senior_junior_exact", "drift KL(senior‖junior)", 1, "nats/token"),
        ("junior_ce", "junior cross-entropy on the senior's chains (legibility)", 1, "nats/token"),
    ], start=2):
        m, h = _diff(results, key, "trlvr", "grpo")
        out.append(f"{i}. TRLVR has a smaller {name} than GRPO: difference {m * scale:+.3f} {unit} "
                   f"(± {h * scale:.3f}); {_verdict(m, h, better_if_negative=True)}.")
    ms, hs = _diff(results, "solo_pass@1", "kl_reg", "trlvr")
    mt, ht = _diff(results, "communication_tax", "kl_reg", "trlvr")
    worse_solo = ms < 0 and (math.isnan(hs) or -ms > hs)
    worse_tax = mt > 0 and (math.isnan(ht) or mt > ht)
    verdict = ("reproduced: KL-Reg is worse on " + " and ".join(
        n for n, w in (("solo accuracy", worse_solo), ("communication tax", worse_tax)) if w)
        if worse_solo or worse_tax else "not reproduced: neither difference is outside its 95% interval")
    out.append(f"5. KL-Reg does not get TRLVR's combination: vs TRLVR its solo pass@1 is {ms * 100:+.1f} points "
               f"(± {hs * 100:.1f}) and its tax {mt:+.1f} points (± {ht:.1f}); {verdict}.")
    return out


def write_report(results: dict, out_dir: str | Path) -> Path:
    """Write ``report.md`` and the plots; returns the report path."""
    out = Path(out_dir)
    plots = write_plots(results, out)
    plan = results["plan"]
    text = [
        "# Tandem RLVR demo (built-in arithmetic world)", "",
        f"Seeds: {plan['seeds']}; {plan['steps']} training steps of {plan['prompts_per_step']} prompts x "
        f"{plan['group_size']} rollouts; evaluation on {plan['eval_problems']} test problems x {plan['eval_n']} samples; "
        f"junior: {results.get('junior')}. Total time {results.get('total_s', float('nan')):.0f} s "
        f"(world build {results['world']['build_s']:.0f} s).", "",
        "Cells: mean ± half-width of the 95% t-interval over seeds (no interval with one seed). "
        "Percentages for accuracies and rates.", "",
        metrics_table(results), "",
        "Evaluation metrics are measured on the test split with the junior of the run; the training curves on "
        "each arm's own rollouts (co-written with the junior for trlvr, so its jargon rate and KL there are "
        "those of team chains).", "", "## Claims", "", *claims(results), "", "## Plots", "",
        *[f"![{p.stem}]({p.name})" for p in plots], "",
    ]
    path = out / "report.md"
    atomic_write_text(path, "\n".join(text))
    return path


def write_plots(results: dict, out: Path) -> list[Path]:
    """Training curves and the claims side by side, as PNG files."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    paths = []
    keys = [("reward/mean", "reward"), ("rollout/senior_token_frac", "senior token share"),
            ("kl/senior_junior", "KL to junior (train)"), ("rollout/jargon_rate", "jargon rate (rollouts)")]
    fig, axes = plt.subplots(1, len(keys), figsize=(4 * len(keys), 3.2))
    for ax, (key, label) in zip(axes, keys):
        for arm in ARMS:
            runs = list(results["curves"].get(arm, {}).values())
            if not runs:
                continue
            steps = [r["step"] for r in runs[0]]
            mean = [sum(run[i].get(key, float("nan")) for run in runs) / len(runs) for i in range(len(steps))]
            ax.plot(steps, mean, label=arm)
        ax.set_title(label)
        ax.set_xlabel("step")
    axes[0].legend()
    fig.tight_layout()
    paths.append(_save(fig, out / "training_curves.png"))
    claims_keys = [("solo_pass@1", "solo pass@1", 100), ("communication_tax", "communication tax (pts)", 1),
                   ("kl_senior_junior_exact", "KL(senior||junior)", 1), ("junior_ce", "junior CE (nats)", 1)]
    fig, axes = plt.subplots(1, len(claims_keys), figsize=(4 * len(claims_keys), 3.2))
    names = ["warm"] + list(ARMS)
    for ax, (key, label, scale) in zip(axes, claims_keys):
        stats = [mean_ci([_get(results["warm_start"], key)])] + [mean_ci(_values(results, a, key)) for a in ARMS]
        ax.bar(names, [m * scale for m, _ in stats],
               yerr=[0 if math.isnan(h) else h * scale for _, h in stats], capsize=4, color=["gray", "C0", "C1", "C2"])
        ax.set_title(label)
    fig.tight_layout()
    paths.append(_save(fig, out / "claims.png"))
    return paths


def _save(fig, path: Path) -> Path:
    from tandem_rlvr.evaluation.report import save_figure

    return save_figure(fig, path, dpi=110)
