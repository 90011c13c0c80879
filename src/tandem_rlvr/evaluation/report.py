"""Evaluation tables (Markdown) and plots (PNG) from ``eval.json``-shaped results.

Every function takes plain dicts, so other reports (the demo's) can reuse them. A *result* is
``{"per_benchmark": {name: metrics}, "macro": metrics}``; several seniors are ``{senior: result}``.
Plots are written atomically (temporary file in the same folder, fsync, rename), and so is ``eval.csv``
(:func:`write_eval_csv`: the whole ``eval.json`` as one flat table, a row per number).
"""

from __future__ import annotations

import csv
import math
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path

from tandem_rlvr.io import atomic_write

PCT_KEYS_PREFIX = ("solo_pass@", "handoff_pass@")

# (metric key, column header, formatter kind)
SUMMARY_COLUMNS: tuple[tuple[str, str, str], ...] = (
    ("n_problems", "problems", "int"),
    ("solo_pass@1", "solo p@1 (%)", "pct"),
    ("solo_pass@8", "solo p@8 (%)", "pct"),
    ("handoff_pass@1", "handoff p@1 (%)", "pct"),
    ("communication_tax", "tax (pts)", "pts"),
    ("junior_ce", "junior CE (nats)", "f3"),
    ("junior_top1", "junior top-1 (%)", "pct"),
    ("junior_bpb", "junior bits/byte", "f3"),
    ("kl_senior_junior", "KL MC", "f4"),
    ("kl_senior_junior_exact", "KL exact", "f4"),
)


def fmt(value, kind: str = "f3", se=None) -> str:
    """Format one cell: ``pct`` (×100, 1 decimal), ``pts`` (signed), ``int``, ``f3``/``f4``; '–' if missing.

    A string (e.g. ``"n/a (different tokenizers)"``) is shown as it is.
    """
    if isinstance(value, str):
        return value
    if value is None or (isinstance(value, float) and not math.isfinite(value)):
        return "–"
    if kind == "int":
        return str(int(value))
    if kind == "pct":
        s = f"{100.0 * value:.1f}"
        return s + (f" ± {100.0 * se:.1f}" if se is not None else "")
    if kind == "pts":
        s = f"{value:+.1f}"
        return s + (f" ± {se:.1f}" if se is not None else "")
    digits = int(kind[1:]) if kind.startswith("f") else 3
    return f"{value:.{digits}f}"


def _cell(metrics: Mapping, key: str, kind: str, with_se: bool) -> str:
    se = metrics.get(f"{key}_se") if with_se else None
    return fmt(metrics.get(key), kind, se)


def markdown_table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    """A GitHub-flavoured Markdown table."""
    lines = ["| " + " | ".join(header) + " |", "| " + " | ".join("---" for _ in header) + " |"]
    lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return "\n".join(lines)


def _present(columns, rows_metrics: Sequence[Mapping]):
    return [c for c in columns if any(c[0] in m for m in rows_metrics)]


def benchmark_table(result: Mapping, columns=SUMMARY_COLUMNS, with_se: bool = True) -> str:
    """One senior: a row per benchmark plus the macro average."""
    per = result.get("per_benchmark", {})
    rows_m = [*per.values(), result.get("macro", {})]
    cols = _present(columns, rows_m)
    rows = [[name, *(_cell(m, k, f, with_se) for k, _, f in cols)] for name, m in per.items()]
    if len(per) > 1 or not per:
        rows.append(["**macro**", *(_cell(result.get("macro", {}), k, f, with_se) for k, _, f in cols)])
    return markdown_table(["benchmark", *(h for _, h, _ in cols)], rows)


def seniors_table(results: Mapping[str, Mapping], columns=SUMMARY_COLUMNS, scope: str = "macro",
                  with_se: bool = True) -> str:
    """Several seniors side by side: a row per senior with its ``scope`` metrics (``macro`` or a benchmark)."""
    def pick(r):
        return r.get("macro", {}) if scope == "macro" else r.get("per_benchmark", {}).get(scope, {})

    cols = _present(columns, [pick(r) for r in results.values()])
    rows = [[name, *(_cell(pick(r), k, f, with_se) for k, _, f in cols)] for name, r in results.items()]
    return markdown_table(["senior", *(h for _, h, _ in cols)], rows)


def pass_at_k_table(results: Mapping[str, Mapping], scope: str = "macro") -> str:
    """Solo and handoff pass@k (%) for every k present, a row per senior."""
    def pick(r):
        return r.get("macro", {}) if scope == "macro" else r.get("per_benchmark", {}).get(scope, {})

    keys = sorted({k for r in results.values() for k in pick(r) if k.startswith(PCT_KEYS_PREFIX) and not k.endswith("_se")},
                  key=lambda k: (not k.startswith("solo"), int(k.split("@")[1])))
    rows = [[name, *(fmt(pick(r).get(k), "pct") for k in keys)] for name, r in results.items()]
    return markdown_table(["senior", *(k.replace("_pass@", " p@") for k in keys)], rows)


def curve_table(results: Mapping[str, Mapping], scope: str = "macro") -> str:
    """Handoff-rate curve: pass@1 (%) of word-level tandem at each P(senior), a row per senior."""
    def curve(r):
        m = r.get("macro", {}) if scope == "macro" else r.get("per_benchmark", {}).get(scope, {})
        c = m.get("curve", {})
        return c if isinstance(c, Mapping) else {}

    ps = sorted({p for r in results.values() for p in curve(r)}, key=float, reverse=True)
    rows = [[name, *(fmt(curve(r).get(p), "pct") for p in ps)] if not _marker(r, "curve", scope) else
            [name, _marker(r, "curve", scope), *[""] * (len(ps) - 1)] for name, r in results.items()]
    return markdown_table(["senior", *(f"p={p}" for p in ps)], rows)


def _marker(result: Mapping, key: str, scope: str) -> str | None:
    """The string a result holds for ``key`` instead of a value (e.g. "n/a (different tokenizers)")."""
    m = result.get("macro", {}) if scope == "macro" else result.get("per_benchmark", {}).get(scope, {})
    return m.get(key) if isinstance(m.get(key), str) else None


def decile_table(results: Mapping[str, Mapping], scope: str = "macro") -> str:
    """Junior CE (nats) by relative token position decile of the senior's solo chains."""
    def dec(r):
        m = r.get("macro", {}) if scope == "macro" else r.get("per_benchmark", {}).get(scope, {})
        d = m.get("junior_ce_by_decile")
        return d if isinstance(d, list) else []

    n = max((len(dec(r)) for r in results.values()), default=0)
    rows = [[name, *(fmt(v, "f3") for v in dec(r))] if not _marker(r, "junior_ce_by_decile", scope) else
            [name, _marker(r, "junior_ce_by_decile", scope), *[""] * (n - 1)] for name, r in results.items()]
    return markdown_table(["senior", *(f"{10 * i}–{10 * (i + 1)}%" for i in range(n))], rows)


def eval_markdown(results: Mapping[str, Mapping], settings: Mapping | None = None, plots: Sequence[str] = ()) -> str:
    """The full ``eval.md``: headline comparison, per-benchmark tables, pass@k, curve, deciles, settings."""
    parts = ["# Tandem RLVR evaluation", ""]
    if settings:
        parts += [_settings_line(settings), ""]
    parts += ["## Summary (macro average over benchmarks)", "", seniors_table(results), "",
              "pass@k and accuracies in %, ± one standard error over problems; tax = solo − handoff pass@1 "
              "in points; junior CE/top-1 on the senior's solo chains (lower CE = more legible); KL = mean "
              "per-token KL(senior ‖ junior) on the solo chains (nats).", ""]
    skips = load_skips_line(results)
    parts += [skips, ""] if skips else []
    for name, r in results.items():
        parts += [f"## {name}: per benchmark", "", benchmark_table(r), ""]
    parts += ["## pass@k (macro)", "", pass_at_k_table(results), ""]
    if any(r.get("macro", {}).get("curve") for r in results.values()):
        parts += ["## Handoff-rate curve (macro pass@1 of word-level tandem, P(senior) = p)", "", curve_table(results), ""]
    if any(r.get("macro", {}).get("junior_ce_by_decile") for r in results.values()):
        parts += ["## Junior CE by position in the senior's chain (macro)", "", decile_table(results), ""]
    parts += [f"![{Path(p).stem}]({Path(p).name})" for p in plots]
    return "\n".join(parts).rstrip() + "\n"


def load_skips_line(results: Mapping[str, Mapping]) -> str:
    """The rows each benchmark lost while loading (``n_skipped_at_load``: no answer, an empty problem, ...), by
    reason, in one line; '' when none lost any."""
    lost: dict = {}
    for r in results.values():
        for bench, m in r.get("per_benchmark", {}).items():
            counts = m.get("n_skipped_at_load")
            if isinstance(counts, Mapping) and sum(counts.values()):
                lost.setdefault(bench, counts)
    if not lost:
        return ""
    return ("Rows skipped while loading the benchmarks (not evaluated; all of each source's rows, before --limit): "
            + "; ".join(f"{b}: {sum(c.values())} ({', '.join(f'{k}: {v}' for k, v in c.items())})"
                        for b, c in lost.items()) + ".")


def _settings_line(s: Mapping) -> str:
    keys = ("junior", "n", "temperature", "top_p", "top_k", "max_new_tokens", "max_rounds", "seed", "reward")
    return "Settings: " + ", ".join(f"{k} = {s[k]}" for k in keys if k in s) + "."


# ---------------------------------------------------------------------------------------------------
# Plots
# ---------------------------------------------------------------------------------------------------


def save_figure(fig, path: str | Path, dpi: int = 120) -> Path:
    """Save a matplotlib figure atomically as PNG and close it."""
    import matplotlib.pyplot as plt

    try:
        return atomic_write(path, lambda f: fig.savefig(f, format="png", dpi=dpi, bbox_inches="tight"), binary=True)
    finally:
        plt.close(fig)


def _figure():
    import matplotlib

    matplotlib.use("Agg", force=False)
    import matplotlib.pyplot as plt

    return plt.subplots(figsize=(5.5, 3.8))


def _na_note(ax, names: Sequence[str]) -> None:
    if names:
        ax.text(0.01, 0.01, "n/a (different tokenizers): " + ", ".join(names), transform=ax.transAxes, fontsize=7,
                color="gray", va="bottom")


def _finish(fig, ax, path, na: Sequence[str], xlabel: str, ylabel: str, title: str, *, legend: bool) -> Path:
    """Label, grid and (with ``legend``) legend of a one-axes figure, then save it to ``path``."""
    _na_note(ax, na)
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    ax.grid(alpha=0.3)
    if legend:
        ax.legend()
    return save_figure(fig, path)


def plot_handoff_curve(curves: Mapping[str, Mapping], path: str | Path, title: str = "Handoff-rate curve",
                       solo: Mapping[str, float] | None = None, na: Sequence[str] = ()) -> Path:
    """pass@1 (%) against P(senior) of word-level tandem, a line per senior (``{senior: {p: acc}}``)."""
    fig, ax = _figure()
    for name, curve in curves.items():
        ps = sorted(curve, key=float)
        ax.plot([float(p) for p in ps], [100.0 * curve[p] for p in ps], marker="o", label=name)
    for name, acc in (solo or {}).items():
        ax.axhline(100.0 * acc, linestyle=":", linewidth=1, color="gray")
    return _finish(fig, ax, path, na, "P(senior) per word handoff", "pass@1 (%)", title, legend=bool(curves))


def plot_ce_deciles(deciles: Mapping[str, Sequence[float]], path: str | Path,
                    title: str = "Junior CE by position in the senior's chain", na: Sequence[str] = ()) -> Path:
    """Junior CE (nats) per relative position decile, a line per senior."""
    fig, ax = _figure()
    for name, vals in deciles.items():
        xs = [10 * i + 5 for i in range(len(vals))]
        ax.plot(xs, [v if v is not None else float("nan") for v in vals], marker="o", label=name)
    return _finish(fig, ax, path, na, "position in chain (% of its length, decile centre)", "junior CE (nats / token)",
                   title, legend=bool(deciles))


def write_eval_report(out_dir: str | Path, results: Mapping[str, Mapping], settings: Mapping | None = None) -> list[Path]:
    """Write ``eval.md``, ``handoff_curve.png`` and ``junior_ce_deciles.png`` (when there is data)."""
    from tandem_rlvr.io import atomic_write_text

    out = Path(out_dir)
    plots: list[Path] = []
    curves = {n: c for n, r in results.items() if isinstance(c := r.get("macro", {}).get("curve"), Mapping) and c}
    na = [n for n, r in results.items() if isinstance(r.get("macro", {}).get("curve"), str)]
    if curves:
        plots.append(plot_handoff_curve(curves, out / "handoff_curve.png", na=na))
    dec = {n: d for n, r in results.items() if isinstance(d := r.get("macro", {}).get("junior_ce_by_decile"), list) and d}
    na = [n for n, r in results.items() if isinstance(r.get("macro", {}).get("junior_ce_by_decile"), str)]
    if dec:
        plots.append(plot_ce_deciles(dec, out / "junior_ce_deciles.png", na=na))
    md = out / "eval.md"
    atomic_write_text(md, eval_markdown(results, settings, [str(p) for p in plots]))
    return [md, *plots]


# ---------------------------------------------------------------------------------------------------
# The flat table (eval.csv)
# ---------------------------------------------------------------------------------------------------

CSV_COLUMNS = ("senior", "junior", "benchmark", "mode", "metric", "value", "se", "lo", "hi")
MACRO = "macro"  # the benchmark column of the macro-average rows
Z95 = 1.959963984540054  # the normal quantile of a two-sided 95% interval


def eval_pairs(obj: Mapping) -> list[tuple[str, str, Mapping]]:
    """``(senior, junior, result)`` of every pair in an ``eval.json`` object: one senior (``senior``), several
    (``seniors``) or a seniors x juniors run (``pairs``)."""
    settings = obj.get("settings", {})
    juniors = settings.get("juniors") or {}
    default_junior = next(iter(juniors), None) or Path(str(settings.get("junior", "")).rstrip("/")).name
    if "pairs" in obj:
        return [(str(r.get("senior", label)), str(r.get("junior", default_junior)), r) for label, r in obj["pairs"].items()]
    if "seniors" in obj:
        return [(str(name), str(r.get("junior", default_junior)), r) for name, r in obj["seniors"].items()]
    if "senior" in obj:
        return [(str(obj["senior"]), str(obj.get("junior", default_junior)), obj)]
    raise ValueError("not an eval.json object: it has none of 'senior', 'seniors' or 'pairs'")


def _mode_and_name(key: str) -> tuple[str, str]:
    """The chains a metric was computed on, and its name without that mode's prefix."""
    if key.startswith(("solo_", "handoff_")):
        mode, _, name = key.partition("_")
        return mode, name
    if key == "communication_tax":
        return "solo-handoff", key
    if key.startswith(("junior_", "kl_")):  # read off the senior's solo chains
        return "solo", key
    return "all", key


def _number(v) -> float | None:
    """A finite number, or None for anything else (a marker string, None, NaN)."""
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
        return None
    return v


def metric_rows(metrics: Mapping) -> Iterator[tuple[str, str, float, float | None]]:
    """``(mode, metric, value, se)`` for every number of one benchmark's (or the macro) metrics: the curve as
    ``curve-pP`` / ``pass@1``, a list element-wise (``junior_ce_by_decile.1`` = the first tenth of the chain),
    a mapping key-wise (``handoff_stops.eos``); ``*_se`` keys are the ``se`` of their metric, not rows of their
    own; strings (``"n/a (different tokenizers)"``, the vocabulary) are left out."""
    for key, v in metrics.items():
        if key.endswith("_se") and key[:-3] in metrics:
            continue
        mode, name = _mode_and_name(key)
        if key == "curve" and isinstance(v, Mapping):
            items = [(f"curve-p{p}", "pass@1", x, None) for p, x in v.items()]
        elif isinstance(v, (list, tuple)):
            items = [(mode, f"{name}.{i}", x, None) for i, x in enumerate(v, start=1)]
        elif isinstance(v, Mapping):
            items = [(mode, f"{name}.{k}", x, None) for k, x in v.items()]
        else:
            items = [(mode, name, v, _number(metrics.get(f"{key}_se")))]
        yield from ((m, n, x, se) for m, n, x, se in items if _number(x) is not None)


def _interval(metric: str, value: float, se: float | None) -> tuple[float | None, float | None]:
    """value -+ 1.96 se (a normal 95% interval over problems); pass@k, a fraction, is clipped to [0, 1]."""
    if se is None:
        return None, None
    lo, hi = value - Z95 * se, value + Z95 * se
    if metric.startswith("pass@"):
        lo, hi = max(0.0, lo), min(1.0, hi)
    return lo, hi


def csv_rows(obj: Mapping) -> list[list]:
    """The rows of ``eval.csv`` (:data:`CSV_COLUMNS`) for an ``eval.json`` object: every pair, every benchmark
    and the macro average (benchmark ``macro``), every number; an empty cell where there is no value."""
    rows = []
    for senior, junior, result in eval_pairs(obj):
        scopes = [*result.get("per_benchmark", {}).items(), (MACRO, result.get("macro", {}))]
        for bench, metrics in scopes:
            for mode, metric, value, se in metric_rows(metrics):
                lo, hi = _interval(metric, value, se)
                rows.append([senior, junior, bench, mode, metric, value, *("" if x is None else x for x in (se, lo, hi))])
    return rows


def write_eval_csv(path: str | Path, obj: Mapping) -> Path:
    """Write ``eval.csv`` (:func:`csv_rows` under a header of :data:`CSV_COLUMNS`) atomically."""
    def write(f) -> None:
        w = csv.writer(f, lineterminator="\n")
        w.writerow(CSV_COLUMNS)
        w.writerows(csv_rows(obj))

    return atomic_write(path, write)
