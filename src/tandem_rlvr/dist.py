"""Small multi-process helpers over an ``accelerate.Accelerator`` (one process: all no-ops)."""

from __future__ import annotations

import contextlib

import torch

# reward-scorer statistics that are counts (summed over processes); other metrics are averaged
COUNT_SUFFIXES = ("/n", "/timeouts", "/no_box", "/errors", "/too_long", "/truncated", "/worker_restarts",
                  "/correct", "/seconds")


UNSUPPORTED = ("FSDP", "DEEPSPEED", "MEGATRON_LM", "XLA")  # every DDP-style type (NO, MULTI_*) is supported


def check_supported(distributed_type) -> None:
    """Refuse launchers the trainer does not support yet (instead of hanging or training wrongly).

    FSDP gathers sharded weights inside every forward, so all processes must run the same number of
    forwards, which the rollout engine (it stops when *its* rows are done) does not guarantee; DeepSpeed
    steps its optimizer inside ``backward`` and clips by its own setting. See docs/scale_out.md.
    """
    name = str(getattr(distributed_type, "value", distributed_type)).upper()
    if name in UNSUPPORTED:
        from tandem_rlvr.errors import TandemError

        raise TandemError(f"accelerate distributed type {name} is not supported by the trainer yet (FSDP and "
                          "DeepSpeed need rollouts with the same number of forwards on every process; see "
                          "docs/scale_out.md): launch with configs/accelerate/ddp.yaml, with LoRA (model.lora_r) "
                          "if the model does not fit")


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
