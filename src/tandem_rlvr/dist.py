"""Small multi-process helpers over an ``accelerate.Accelerator`` (one process: all no-ops)."""

from __future__ import annotations

import contextlib

import torch

# reward-scorer statistics that are counts (summed over processes); other metrics are averaged
COUNT_SUFFIXES = ("/n", "/timeouts", "/no_box", "/errors", "/too_long", "/truncated", "/worker_restarts",
                  "/correct", "/seconds")


def reduce_scalar(acc, value: float, op: str) -> float:
    """``sum`` / ``max`` / ``mean`` of a Python scalar over processes."""
    if acc.num_processes == 1:
        return float(value)
    t = torch.tensor([float(value)], device=acc.device)
    red = acc.reduce(t, reduction="sum" if op == "mean" else op)
    return float(red) / (acc.num_processes if op == "mean" else 1)


def no_sync_unless_last(acc, model, is_last: bool):
    """Skip DDP's gradient all-reduce on all but the last micro-batch of an accumulation."""
    if not is_last and acc.num_processes > 1:
        return acc.no_sync(model)
    return contextlib.nullcontext()


def reduce_row(acc, row: dict) -> dict:
    """Merge every process's metrics row on all processes: counts summed, the rest averaged.

    Each process owns the same number of whole prompt groups, so the mean of per-process means is
    the global mean for per-rollout and per-group metrics (token-weighted ones are approximate).
    """
    if acc.num_processes == 1:
        return row
    from accelerate.utils import gather_object

    rows = gather_object([row])
    out: dict = {}
    for key in rows[0]:
        vals = [r[key] for r in rows if key in r and isinstance(r[key], (int, float))]
        if key == "step" or not vals:
            out[key] = rows[0][key]
        elif (key.startswith("reward/") and key.endswith(COUNT_SUFFIXES)) or key == "train/num_tokens":
            out[key] = float(sum(vals))
        elif key.startswith("time/"):
            out[key] = float(max(vals))
        else:
            out[key] = float(sum(vals) / len(vals))
    return out
