"""The report files of ``tandem-rlvr eval`` under ``--out``, from the results of its pairs: ``eval.json``,
``eval.csv``, ``eval.md`` with its plots and the seniors x juniors matrix, and ``eval.html`` (written by the
command, :func:`tandem_rlvr.evaluation.eval_cli.run_eval`, while it holds ``--out``'s lock:
:mod:`tandem_rlvr.evaluation.outdir`)."""

from __future__ import annotations

from dataclasses import asdict
from pathlib import Path

from tandem_rlvr.evaluation.options import EvalOptions


def write_outputs(opts: EvalOptions, out: Path, benches: dict, results: dict, pairs: dict, elapsed: float) -> dict:
    """Write the report of ``results`` (``{label: result}``, ``pairs``: ``{label: (senior, junior)}``) under
    ``out``; returns the ``eval.json`` object."""
    from tandem_rlvr.evaluation.matrix import write_matrix_report
    from tandem_rlvr.evaluation.report import write_eval_csv, write_eval_report
    from tandem_rlvr.io import atomic_write_json

    settings = _settings(opts, benches) | {"elapsed_s": elapsed}
    matrix = _matrix(results, pairs)
    if len(opts.juniors) > 1:
        obj = {"pairs": {k: {"senior": s, **results[k]} for k, (s, _) in pairs.items()}, "matrix": matrix,
               "settings": settings}
    elif len(results) == 1:
        (name, res), = results.items()
        obj = {"senior": name, **res, "matrix": matrix, "settings": settings}
    else:
        obj = {"seniors": results, "matrix": matrix, "settings": settings}
    atomic_write_json(out / "eval.json", obj)
    write_eval_csv(out / "eval.csv", obj)
    write_eval_report(out, results, settings)
    write_matrix_report(out, matrix)
    _write_eval_html(out, benches, list(results))
    return obj


def _settings(opts: EvalOptions, benches: dict) -> dict:
    import torch
    import transformers

    s = asdict(opts)
    s["curve_ps"] = opts.curve_ps if opts.curve else []  # the values the curve ran at ([]: none)
    s["benchmarks"] = {k: v[0] for k, v in benches.items()}
    s["ks"] = [k for k in (1, 2, 4, 8) if k <= opts.n]
    s["curve_p1_is_solo"] = 1.0 in opts.curve_ps
    s["versions"] = {"torch": torch.__version__, "transformers": transformers.__version__}
    return s


def _write_eval_html(out: Path, benches: dict, labels: list[str]) -> None:
    """``eval.html`` beside ``eval.md``: the tables, plots and a browser over this run's chains (its pairs'
    ``labels`` on its benchmarks; other chains under ``--out``, from earlier runs, are not this report's)."""
    from tandem_rlvr.evaluation.outdir import slug
    from tandem_rlvr.evaluation.html import eval_html

    chains = [Path("chains") / slug(label) / f"{slug(b)}.jsonl" for label in labels for b in benches]
    eval_html(out, {b: {str(e.id): e.problem for e in ex} for b, (_, ex) in benches.items()}, chains=chains)


def _matrix(results: dict, pairs: dict) -> dict:
    from tandem_rlvr.evaluation.matrix import pair_matrix

    templates = {}
    for label, (s, j) in pairs.items():
        templates[f"senior {s}"] = results[label]["templates"]["senior"]
        templates[f"junior {j}"] = results[label]["templates"]["junior"]
    return pair_matrix(results, pairs, templates)
