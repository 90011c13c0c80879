"""The demo's PNG plots: training curves, the senior-alone curves, the claims side by side, and the
trade-off (solo pass@1 against communication tax, one point per run, 95% intervals both ways)."""

from __future__ import annotations

import math
from pathlib import Path

from tandem_rlvr.demo.results import metric_of, arm_values, label, runs
from tandem_rlvr.demo.stats import mean_ci

TRAIN_KEYS = [("reward/mean", "reward"), ("rollout/senior_token_frac", "senior token share"),
              ("kl/senior_junior", "KL to junior (train rollouts)"), ("rollout/jargon_rate", "jargon rate (rollouts)")]
SENIOR_KEYS = [("senior/solo_pass@1", "solo pass@1 (senior alone)"), ("senior/jargon_rate", "jargon rate (senior alone)"),
               ("senior/kl_exact", "KL(senior||junior), own chains"), ("senior/junior_ce", "junior CE on senior's chains")]
CLAIM_KEYS = [("solo_pass@1", "solo pass@1", 100), ("communication_tax", "communication tax (pts)", 1),
              ("kl_senior_junior_exact", "KL(senior||junior)", 1), ("junior_ce", "junior CE (nats)", 1)]


def _plt():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def colors(results: dict) -> dict:
    """A colour per run: grpo red, trlvr blue, kl_reg β from light to dark green."""
    names = runs(results)
    kl = [n for n in names if n.startswith("kl_reg")]
    greens = ["#a1d99b", "#41ab5d", "#006d2c", "#00441b", "#74c476"]
    out = {"grpo": "#d62728", "trlvr": "#1f77b4"}
    out.update({n: greens[i % len(greens)] for i, n in enumerate(kl)})
    return out


def _mean_curve(rows_by_seed: list[list[dict]], key: str) -> tuple[list, list]:
    by_step: dict = {}
    for rows in rows_by_seed:
        for r in rows:
            if key in r and r[key] is not None:
                by_step.setdefault(r["step"], []).append(float(r[key]))
    steps = sorted(by_step)
    return steps, [sum(by_step[s]) / len(by_step[s]) for s in steps]


def _curves(results: dict, out: Path, keys, name: str, step0: dict | None = None) -> Path | None:
    plt, col = _plt(), colors(results)
    if not any(k in r for c in results["curves"].values() for rows in c.values() for r in rows for k, _ in keys):
        return None
    fig, axes = plt.subplots(1, len(keys), figsize=(4 * len(keys), 3.2))
    for ax, (key, title) in zip(axes, keys):
        for n in runs(results):
            steps, mean = _mean_curve(list(results["curves"].get(n, {}).values()), key)
            if step0 and key in step0 and steps:
                steps, mean = [0, *steps], [step0[key], *mean]
            if steps:
                ax.plot(steps, mean, label=label(n), color=col.get(n), marker="o" if step0 else None, markersize=3)
        ax.set_title(title, fontsize=10)
        ax.set_xlabel("step")
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize=8)
    fig.tight_layout()
    return _save(fig, out / name)


def claims_plot(results: dict, out: Path) -> Path:
    plt, col = _plt(), colors(results)
    names = runs(results)
    fig, axes = plt.subplots(1, len(CLAIM_KEYS), figsize=(4.5 * len(CLAIM_KEYS), 3.4))
    for ax, (key, title, scale) in zip(axes, CLAIM_KEYS):
        stats = [mean_ci([metric_of(results["warm_start"], key)])] + [mean_ci(arm_values(results, n, key)) for n in names]
        ax.bar(range(len(stats)), [m * scale for m, _ in stats],
               yerr=[0 if math.isnan(h) else h * scale for _, h in stats], capsize=4,
               color=["gray"] + [col[n] for n in names])
        ax.set_xticks(range(len(stats)), ["warm"] + [label(n).replace("kl_reg ", "kl ") for n in names],
                      rotation=30, fontsize=8)
        ax.set_title(title, fontsize=10)
    fig.tight_layout()
    return _save(fig, out / "claims.png")


def tradeoff_plot(results: dict, out: Path) -> Path:
    """Solo pass@1 (x) against communication tax (y): one point per run (mean over seeds, 95% t-interval
    error bars in both directions), the warm start marked."""
    plt, col = _plt(), colors(results)
    fig, ax = plt.subplots(figsize=(6.4, 4.6))
    w = results["warm_start"]
    if w:
        ax.scatter([100 * metric_of(w, "solo_pass@1")], [metric_of(w, "communication_tax")], marker="*", s=220,
                   color="black", zorder=3, label="warm start")
    for n in runs(results):
        (mx, hx), (my, hy) = (mean_ci(arm_values(results, n, "solo_pass@1")),
                              mean_ci(arm_values(results, n, "communication_tax")))
        if math.isnan(mx) or math.isnan(my):
            continue
        ax.errorbar([100 * mx], [my], xerr=None if math.isnan(hx) else [100 * hx],
                    yerr=None if math.isnan(hy) else [hy], fmt="o", capsize=4, color=col[n], label=label(n), ms=7)
    ax.axhline(0, color="gray", lw=0.8, ls=":")
    ax.set_xlabel("solo pass@1 (%; higher is better)")
    ax.set_ylabel("communication tax (points; lower is better)")
    ax.set_title("Trade-off: accuracy alone vs. cost of handing off\n(mean over seeds, 95% t-intervals)", fontsize=10)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8, loc="best")
    fig.tight_layout()
    return _save(fig, out / "tradeoff.png")


def write_plots(results: dict, out: Path) -> list[Path]:
    """Every plot of the demo report (``tradeoff.png`` first); returns the written paths."""
    paths = [tradeoff_plot(results, out), claims_plot(results, out),
             _curves(results, out, SENIOR_KEYS, "senior_alone_curves.png", results.get("senior_alone_step0") or {}),
             _curves(results, out, TRAIN_KEYS, "training_curves.png")]
    return [p for p in paths if p is not None]


def _save(fig, path: Path) -> Path:
    from tandem_rlvr.evaluation.report import save_figure

    return save_figure(fig, path, dpi=110)
