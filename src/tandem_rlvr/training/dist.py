"""Small multi-process helpers over an ``accelerate.Accelerator`` (one process: all no-ops)."""

from __future__ import annotations

import contextlib

import torch

from tandem_rlvr.training.core import merged_mean

# reward-scorer statistics that are counts (summed over processes); other metrics are averaged
COUNT_SUFFIXES = ("/n", "/timeouts", "/no_box", "/errors", "/too_long", "/truncated", "/worker_restarts",
                  "/correct", "/gold_text", "/bad_gold")


UNSUPPORTED = ("FSDP", "DEEPSPEED", "MEGATRON_LM", "XLA")  # every DDP-style type (NO, MULTI_*) is supported


def check_supported(distributed_type) -> None:
    """Refuse launchers the trainer does not support yet (instead of hanging or training wrongly).

    The trainer shards the senior itself (``train.fsdp``, FSDP2's ``fully_shard``; see
    :mod:`tandem_rlvr.training.fsdp`) under a plain multi-process launch. accelerate's own FSDP wrapping would
    shard every forward of the rollout loop, and DeepSpeed steps its optimizer inside ``backward``.
    """
    name = str(getattr(distributed_type, "value", distributed_type)).upper()
    if name in UNSUPPORTED:
        from tandem_rlvr.errors import TandemError

        raise TandemError(f"accelerate distributed type {name} is not supported: the trainer shards the senior "
                          "itself. Launch with the shipped accelerate/ddp config (tandem-rlvr config-show --path "
                          "accelerate/ddp) and set train.fsdp=full (parameters, "
                          "gradients and optimizer states sharded, like ZeRO-3) or train.fsdp=zero2 (gradients and "
                          "optimizer states sharded, like ZeRO-2); see docs/scale-out.md")


def reduce_scalar(acc, value: float, op: str) -> float:
    """``sum`` / ``max`` / ``mean`` of a Python scalar over processes."""
    if op not in ("sum", "max", "mean"):
        raise ValueError(f"reduce_scalar: op must be sum, max or mean, got {op!r}")
    if acc.num_processes == 1:
        return float(value)
    t = torch.tensor([float(value)], device=acc.device)
    red = acc.reduce(t, reduction="sum" if op == "mean" else op)
    return float(red) / (acc.num_processes if op == "mean" else 1)


def no_sync_unless_last(acc, model, is_last: bool):
    """Skip DDP's gradient all-reduce on all but the last micro-batch; enter it around the forward and the
    backward (DDP decides in the forward). A sharded senior (FSDP2) reduce-scatters every micro-batch: skipped,
    each rank would hold the whole unsharded float32 gradient until the last one (16 GB for a 4B senior),
    where sharding is what FSDP is for."""
    from tandem_rlvr.training import fsdp

    if not is_last and acc.num_processes > 1 and not fsdp.is_sharded(model):
        return acc.no_sync(model)
    return contextlib.nullcontext()


def gather_objects(acc, obj) -> list:
    """Every process's ``obj``, in process order, on every process (``[obj]`` in one process). Collective."""
    if acc.num_processes == 1:
        return [obj]
    from accelerate.utils import gather_object

    return gather_object([obj])


def reduce_row(acc, row: dict) -> dict:
    """Merge every process's metrics row on all processes: counts summed, token means
    (:data:`~tandem_rlvr.training.core.TOKEN_MEAN_METRICS`) weighted by each process's ``train/num_tokens``, the
    rest averaged.

    Each process owns the same number of whole prompt groups, so the mean of per-process means is
    the global mean for per-rollout and per-group metrics.
    """
    if acc.num_processes == 1:
        return row
    from accelerate.utils import gather_object

    rows = gather_object([row])
    out: dict = {}
    for key in dict.fromkeys(k for r in rows for k in r):  # a count one process alone saw (reward/bad_gold) too
        vals = [r[key] for r in rows if key in r and isinstance(r[key], (int, float))]
        if key == "step" or not vals:
            out[key] = rows[0][key]
        elif (key.startswith("reward/") and key.endswith(COUNT_SUFFIXES)) or key == "train/num_tokens":
            out[key] = float(sum(vals))
        elif key.startswith("time/"):
            out[key] = float(max(vals))
        else:  # the mean over processes (token means weighted by their tokens: core.merged_mean)
            out[key] = merged_mean([r for r in rows if isinstance(r.get(key), (int, float))], key)
    return out


def close_process_group() -> None:
    """Destroy the default process group, if any, before the interpreter exits: a gloo group left to
    Python's finalization can abort the process ("terminate called without an active exception", rc -6)
    after a run that finished. Called at the end of ``tandem-rlvr train`` on every exit path, after the
    rollout engine is closed (vLLM's engine shutdown uses the group): :class:`~tandem_rlvr.training.watchdog.RunEnd`."""
    import torch.distributed as tdist

    if tdist.is_available() and tdist.is_initialized():
        tdist.destroy_process_group()


def chunk_note(batch_size: int, group_size: int, mini_batch_prompts: int, num_processes: int) -> str | None:
    """Why this run's rollouts would differ from the same config's on fewer processes, or None where they are the
    same. A chunk's seed and padding follow its global position (``Trainer.rollout``) only where each process's
    share of a mini-batch holds whole chunks; else the same distribution, other random streams."""
    if num_processes == 1:
        return None
    share = mini_batch_prompts // num_processes
    if batch_size == 0:
        why = "rollout.batch_size=0 makes each process's prompts of a step one chunk"
    elif share % max(1, batch_size // group_size):
        why = (f"rollout.batch_size={batch_size} ({batch_size // group_size} prompts a chunk) does not divide a "
               f"process's share of a mini-batch ({share} prompts at {num_processes} processes)")
    else:
        return None
    return (f"{why}, so the rollouts' random streams depend on the number of processes (the same distribution); "
            f"for a run equal to itself on any number of processes set rollout.batch_size to a multiple of "
            f"algo.group_size={group_size} that divides {share * group_size}")
