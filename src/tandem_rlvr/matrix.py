"""The seniors × juniors matrix of ``tandem-rlvr eval``: tables and heat-maps of tax, bits per byte and drift.

A *cell* is one (senior, junior) pair's macro metrics. Values that do not exist for a pair (drift
between two vocabularies) are the string :data:`tandem_rlvr.crosstok.NA`, shown as such in the
tables and as a grey cell labelled "n/a" in the heat-maps — never as a number.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from pathlib import Path

from tandem_rlvr.crosstok import NA, finite_or_na
from tandem_rlvr.report import fmt, markdown_table, save_figure

# (cell key, title, formatter, colour map: low values good -> reversed map)
PANELS = (
    ("communication_tax", "communication tax (pts)", "pts", "RdYlGn_r"),
    ("junior_bpb", "junior bits per byte on the senior's chains", "f3", "viridis_r"),
    ("kl_senior_junior_exact", "KL(senior ‖ junior) per token (nats)", "f4", "magma_r"),
)
CELL_KEYS = ("communication_tax", "communication_tax_se", "junior_bpb", "kl_senior_junior_exact", "solo_pass@1",
             "handoff_pass@1", "vocabulary")

__all__ = ["PANELS", "matrix_markdown", "pair_matrix", "plot_matrix"]


def pair_matrix(results: Mapping[str, Mapping], pairs: Mapping[str, tuple[str, str]], templates=None) -> dict:
    """``{"seniors", "juniors", "cells": {senior: {junior: metrics}}, "templates"}`` from per-pair results.

    ``templates``: ``{"senior NAME" | "junior NAME": "chat" | "plain"}``.
    """
    seniors = list(dict.fromkeys(s for s, _ in pairs.values()))
    juniors = list(dict.fromkeys(j for _, j in pairs.values()))
    cells: dict = {s: {} for s in seniors}
    for label, (s, j) in pairs.items():
        macro = results[label].get("macro", {})
        cells[s][j] = {k: macro[k] for k in CELL_KEYS if k in macro}
    return {"seniors": seniors, "juniors": juniors, "cells": cells, "templates": dict(templates or {})}


def matrix_markdown(m: Mapping) -> str:
    """One table per panel (rows seniors, columns juniors), and which prompt template each model got."""
    parts = ["## Seniors × juniors (macro)", ""]
    for key, title, kind, _ in PANELS:
        rows = []
        for s in m["seniors"]:
            row = [s]
            for j in m["juniors"]:
                cell = m["cells"].get(s, {}).get(j, {})
                v = cell.get(key)
                se = cell.get(f"{key}_se")
                row.append(v if isinstance(v, str) else fmt(v, kind, se))
            rows.append(row)
        parts += [f"**{title}**", "", markdown_table(["senior \\ junior", *m["juniors"]], rows), ""]
    plain = [who for who, kind in m.get("templates", {}).items() if kind == "plain"]
    parts.append("Prompt templates: every model used its own chat template" if not plain else
                 "Prompt templates: the plain template (`Question: ...\\nAnswer:`, no chat template) for "
                 + ", ".join(plain) + "; every other model used its own chat template")
    return "\n".join(parts).rstrip() + ".\n"


def _panel(ax, m: Mapping, key: str, title: str, kind: str, cmap: str) -> None:
    import numpy as np

    S, J = m["seniors"], m["juniors"]
    vals = np.full((len(S), len(J)), np.nan)
    for a, s in enumerate(S):
        for b, j in enumerate(J):
            v = finite_or_na(m["cells"].get(s, {}).get(j, {}).get(key))
            vals[a, b] = np.nan if v is None else v
    masked = np.ma.masked_invalid(vals)
    import matplotlib

    cm = matplotlib.colormaps[cmap].with_extremes(bad="#d9d9d9")
    im = ax.imshow(masked, cmap=cm, aspect="auto")
    for a, s in enumerate(S):
        for b, j in enumerate(J):
            raw = m["cells"].get(s, {}).get(j, {}).get(key)
            text = "n/a\n(different\ntokenizers)" if raw == NA else ("–" if math.isnan(vals[a, b]) else fmt(vals[a, b], kind))
            ax.text(b, a, text, ha="center", va="center", fontsize=8,
                    bbox={"facecolor": "white", "alpha": 0.7, "linewidth": 0, "boxstyle": "round,pad=0.2"})
    ax.set_xticks(range(len(J)), J, rotation=30, ha="right")
    ax.set_yticks(range(len(S)), S)
    ax.set_xlabel("junior")
    ax.set_ylabel("senior")
    ax.set_title(title, fontsize=9)
    if masked.count():
        ax.figure.colorbar(im, ax=ax, fraction=0.046, pad=0.04)


def plot_matrix(m: Mapping, path: str | Path) -> Path:
    """Heat-maps of tax, bits per byte and exact KL (grey "n/a" where the pair shares no vocabulary)."""
    import matplotlib

    matplotlib.use("Agg", force=False)
    import matplotlib.pyplot as plt

    w = 1.2 + 1.3 * len(m["juniors"])
    fig, axes = plt.subplots(1, len(PANELS), figsize=(len(PANELS) * max(3.4, w), 0.9 + 0.8 * len(m["seniors"]) + 1.2))
    for ax, (key, title, kind, cmap) in zip(axes, PANELS):
        _panel(ax, m, key, title, kind, cmap)
    fig.tight_layout()
    return save_figure(fig, path)


def write_matrix_report(out_dir: str | Path, m: Mapping) -> list[Path]:
    """Append the matrix tables to ``eval.md`` and write ``matrix.png`` (the heat-maps)."""
    from tandem_rlvr.io import atomic_write_text

    out = Path(out_dir)
    png = plot_matrix(m, out / "matrix.png")
    md = out / "eval.md"
    head = md.read_text(encoding="utf-8") if md.is_file() else "# Tandem RLVR evaluation\n"
    atomic_write_text(md, head.rstrip() + "\n\n" + matrix_markdown(m) + f"\n![matrix]({png.name})\n")
    return [md, png]
