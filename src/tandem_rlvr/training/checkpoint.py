"""Checkpoints that survive a kill: written under a temporary name, then renamed into place.

A checkpoint ``checkpoints/step-N/`` holds the senior in Hugging Face format (safetensors), the
optimiser and scheduler states, every RNG state (python, numpy, torch) and ``trainer_state.json``
(step, data position, counters). Only directories whose name is ``step-N`` and which contain the
``COMPLETE`` marker are ever loaded; half-written ``.tmp-*`` directories are ignored and cleaned.
``checksums.json`` (see :mod:`tandem_rlvr.integrity`) lets a resume detect a damaged file; a checkpoint
without it is not loaded (``trust_unverified=True`` or ``python -m tandem_rlvr.integrity vouch DIR``
for one written elsewhere), and only the files it lists are read.
"""

from __future__ import annotations

import json
import logging
import random
import re
import shutil
from pathlib import Path

import numpy as np
import torch

from tandem_rlvr import integrity
from tandem_rlvr.errors import TandemError
from tandem_rlvr.io import atomic_write_json, publish_dir, replace_durably

log = logging.getLogger(__name__)

MARKER = "COMPLETE"
_STEP_RE = re.compile(r"^step-(\d+)$")


def rng_state() -> tuple[dict, dict]:
    """Every RNG state this process touches: (JSON-able python/numpy states, torch tensors: the CPU generator's
    and, with CUDA, its current device's; not every visible device's, which a host with fewer GPUs could not take)."""
    v, inner, gauss = random.getstate()
    name, keys, pos, has_gauss, cached = np.random.get_state()
    plain = {"python": [v, list(inner), gauss], "numpy": [name, keys.tolist(), pos, has_gauss, cached]}
    tensors = {"torch": torch.get_rng_state()}
    if torch.cuda.is_available():
        tensors["cuda_device"] = torch.cuda.get_rng_state()
    return plain, tensors


def set_rng_state(plain: dict, tensors: dict) -> None:
    """Restore what :func:`rng_state` captured (a checkpoint written before it kept every visible CUDA device's
    state as ``cuda``: this process's device's is taken from it where it exists)."""
    v, inner, gauss = plain["python"]
    random.setstate((v, tuple(inner), gauss))
    name, keys, pos, has_gauss, cached = plain["numpy"]
    np.random.set_state((name, np.array(keys, dtype=np.uint32), pos, has_gauss, cached))
    torch.set_rng_state(tensors["torch"])
    if not torch.cuda.is_available():
        return
    cuda, index = tensors.get("cuda_device"), torch.cuda.current_device()
    if cuda is None and index < len(tensors.get("cuda", ())):
        cuda = tensors["cuda"][index]
    if cuda is not None:
        torch.cuda.set_rng_state(cuda)


def _rng_of_process(state: dict, ts: dict, ckpt: Path, rank: int, num_processes: int) -> tuple[dict, dict]:
    """The RNG states process ``rank`` of ``num_processes`` resumes with: its own where the checkpoint was written
    by as many processes, else the main process's (logged: draws after the resume, dropout's, then differ from an
    uninterrupted run's)."""
    plain, tensors = state.pop("rng"), ts["rng"]
    ranks_plain, ranks_tensors = state.pop("rng_ranks", None), ts.get("rng_ranks")
    written = len(ranks_plain) if ranks_plain else 1
    if written == num_processes and ranks_plain:
        return ranks_plain[rank], ranks_tensors[rank]
    if written != num_processes and rank == 0:
        log.warning("checkpoint %s holds the random states of %d process(es), this run has %d: every process "
                    "resumes with the main process's", ckpt, written, num_processes)
    return plain, tensors


def save_model(model, tokenizer, out_dir: str | Path, state_dict: dict | None = None,
               extra_json: dict[str, dict] | None = None) -> Path:
    """Save ``model`` (merged if it is a peft model) and ``tokenizer`` atomically as safetensors;
    ``state_dict``: the weights to write instead of the model's own (a sharded model's full state);
    ``extra_json``: ``{file name: object}`` written inside before the directory is published (``best.json``).
    Like a checkpoint, the directory gets ``checksums.json`` (:mod:`tandem_rlvr.integrity`) before its marker."""
    out_dir = Path(out_dir)
    tmp = out_dir.with_name(f".tmp-{out_dir.name}")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    _save_weights(model, tmp, state_dict)
    tokenizer.save_pretrained(str(tmp))
    for name, obj in (extra_json or {}).items():
        atomic_write_json(tmp / name, obj)
    integrity.write_checksums(tmp)  # `tandem-rlvr push` refuses a final/ or best/ whose files do not verify
    (tmp / MARKER).write_text("ok\n")
    publish_dir(tmp, out_dir)
    return out_dir


def _save_weights(model, path: Path, state_dict: dict | None = None) -> None:
    from transformers.utils import logging as hf_logging

    was_on = hf_logging.is_progress_bar_enabled()  # a job that turned them off keeps them off
    hf_logging.disable_progress_bar()
    try:
        _save_weights_inner(model, path, state_dict)
    finally:
        if was_on:
            hf_logging.enable_progress_bar()


def _save_weights_inner(model, path: Path, state_dict: dict | None) -> None:
    if state_dict is not None:
        model.save_pretrained(str(path), safe_serialization=True, state_dict=state_dict)
    elif hasattr(model, "peft_config"):
        model.save_pretrained(str(path / "adapter"), safe_serialization=True)
        _cpu_copy(model).merge_and_unload().save_pretrained(str(path), safe_serialization=True)
    else:
        model.save_pretrained(str(path), safe_serialization=True)


def _cpu_copy(model):
    """A deep copy of ``model`` on the CPU: each parameter and buffer copied there one at a time, so a model on a GPU
    is never copied whole on its device (a LoRA senior is merged on this copy; the model itself is not touched,
    its frozen base stays the junior bit for bit). Tied weights stay tied (one copy per tensor object)."""
    import copy

    memo = {}
    for t in [*model.parameters(), *model.buffers()]:
        if id(t) not in memo:
            c = t.detach().to("cpu", copy=True)
            memo[id(t)] = torch.nn.Parameter(c, requires_grad=t.requires_grad) if isinstance(t, torch.nn.Parameter) else c
    return copy.deepcopy(model, memo)


def save_checkpoint(run_dir: str | Path, step: int, *, model, tokenizer, optimizer, scheduler,
                    trainer_state: dict, keep_last: int = 3, model_state: dict | None = None,
                    optim_state: dict | None = None, rng_states: list[tuple[dict, dict]] | None = None) -> Path:
    """Write ``checkpoints/step-{step}`` atomically (with checksums) and prune all but the newest ``keep_last``.

    ``model_state`` / ``optim_state``: full states to write instead of the model's and optimizer's
    own (those of a sharded senior, gathered by :mod:`tandem_rlvr.training.fsdp`). ``rng_states``: every
    process's :func:`rng_state`, in process order (None: this process's alone). A full disk raises
    :class:`~tandem_rlvr.errors.DiskFull` after removing the half-written directory."""
    ckpt_root = Path(run_dir) / "checkpoints"
    ckpt_root.mkdir(parents=True, exist_ok=True)
    final = ckpt_root / f"step-{step}"
    tmp = ckpt_root / f".tmp-step-{step}"
    shutil.rmtree(tmp, ignore_errors=True)
    try:
        tmp.mkdir()
        _save_weights(model, tmp, model_state)
        if hasattr(model, "peft_config"):
            torch.save({k: v for k, v in model.state_dict().items() if "lora_" in k}, tmp / "lora_state.pt")
        tokenizer.save_pretrained(str(tmp))
        plain, tensors = zip(*(rng_states or [rng_state()]))  # per process; the main one's also as "rng"
        many = len(plain) > 1
        optim = optim_state if optim_state is not None else optimizer.state_dict()
        scaler = getattr(optimizer, "scaler", None)  # fp16's loss scaler (accelerate's AcceleratedOptimizer)
        torch.save({"optimizer": optim, "scheduler": scheduler.state_dict(), "rng": tensors[0],
                    **({"rng_ranks": list(tensors)} if many else {}),
                    **({"scaler": scaler.state_dict()} if scaler is not None else {})}, tmp / "train_state.pt")
        atomic_write_json(tmp / "trainer_state.json", {"step": step, **trainer_state, "rng": plain[0],
                                                       **({"rng_ranks": list(plain)} if many else {})})
        integrity.write_checksums(tmp)
        (tmp / MARKER).write_text("ok\n")
    except Exception as e:
        written = integrity.dir_bytes(tmp)
        shutil.rmtree(tmp, ignore_errors=True)
        if not integrity.is_disk_full(e, ckpt_root):
            raise
        prev = latest_checkpoint(run_dir)
        needed = integrity.dir_bytes(prev) if prev else _tensor_bytes(model_state or model.state_dict(),
                                                                       optim_state or optimizer.state_dict())
        needed = max(needed, written)
        kept = f"the previous checkpoint {prev} is intact" if prev else "no earlier checkpoint exists"
        raise integrity.disk_full(e, tmp, needed, f"checkpoint step-{step}", kept + ", nothing half-written was left") from e
    publish_dir(tmp, final)
    prune(ckpt_root, keep_last)
    return final


def _tensor_bytes(*states) -> int:
    """Bytes of the tensors in nested state dicts (what a first checkpoint will need, roughly)."""
    total, todo = 0, list(states)
    while todo:
        x = todo.pop()
        if torch.is_tensor(x):
            total += x.numel() * x.element_size()
        elif isinstance(x, dict):
            todo.extend(x.values())
        elif isinstance(x, (list, tuple)):
            todo.extend(x)
    return total


def prune(ckpt_root: Path, keep_last: int) -> None:
    """Delete all but the newest ``keep_last`` complete checkpoints. Each is first renamed to ``.trash-*``
    (atomic), so a kill in the middle of deleting leaves a ``.trash-*`` folder, never a half-deleted
    ``step-N`` that no longer counts as complete and would be kept for ever; ``.tmp-*`` and ``.trash-*``
    leftovers of killed runs go too."""
    for d in complete_checkpoints(ckpt_root.parent)[:-keep_last]:
        trash = ckpt_root / f".trash-{d.name}"
        shutil.rmtree(trash, ignore_errors=True)
        replace_durably(d, trash)
    for d in [*ckpt_root.glob(".tmp-*"), *ckpt_root.glob(".trash-*")]:
        shutil.rmtree(d, ignore_errors=True)


def complete_checkpoints(run_dir: str | Path) -> list[Path]:
    """Complete checkpoints of a run, oldest first."""
    root = Path(run_dir) / "checkpoints"
    if not root.is_dir():
        return []
    found = []
    for d in root.iterdir():
        m = _STEP_RE.match(d.name)
        if m and (d / MARKER).exists() and (d / "trainer_state.json").exists():
            found.append((int(m.group(1)), d))
    return [d for _, d in sorted(found)]


def latest_checkpoint(run_dir: str | Path) -> Path | None:
    """The newest complete checkpoint, or None."""
    found = complete_checkpoints(run_dir)
    return found[-1] if found else None


def load_checkpoint(ckpt: Path, *, model, optimizer, scheduler, sharded_main: bool | None = None,
                    trust_unverified: bool = False, rank: int = 0, num_processes: int = 1) -> dict:
    """Restore weights, optimiser, scheduler and RNG states in place; returns the trainer state. Process
    ``rank`` of ``num_processes`` takes its own RNG states where the checkpoint holds as many (:func:`_rng_of_process`).

    Only the files ``checksums.json`` lists are read (:func:`weight_files`); a checkpoint without it is
    refused unless ``trust_unverified``. ``sharded_main`` (a senior sharded by :mod:`tandem_rlvr.training.fsdp`):
    whether this is the main process, which reads the full states and broadcasts them into every process's shards."""
    from safetensors.torch import load_file

    from tandem_rlvr.training import fsdp

    sharded = sharded_main is not None
    weights = weight_files(ckpt, trust_unverified)
    # to the CPU first: a GPU run's file names cuda:0 (rank 0 wrote it), where every process would otherwise
    # build the whole optimizer state before load_state_dict moves it to its own device; memory-mapped, so a process
    # that does not use the optimizer state (FSDP's other ranks) never reads it
    ts = torch.load(ckpt / "train_state.pt", weights_only=True, map_location="cpu", mmap=True)
    if hasattr(model, "peft_config"):
        lora = torch.load(ckpt / "lora_state.pt", weights_only=True, map_location="cpu", mmap=True)
        missing = model.load_state_dict(lora, strict=False)
        del missing
    else:
        state = {}
        if not sharded or sharded_main:  # sharded: only the main process reads, then broadcasts
            for f in weights:
                state.update(load_file(str(f)))
        if sharded:
            result = fsdp.load_model_state(model, state, main=sharded_main)
        else:
            result = model.load_state_dict(state, strict=False)
        bad = [k for k in result.missing_keys if not _is_tied(model, k)]
        if bad or result.unexpected_keys:
            raise RuntimeError(f"checkpoint {ckpt} does not match the model: missing {bad[:5]}, unexpected {result.unexpected_keys[:5]}")
    if sharded:
        fsdp.load_optim_state(model, optimizer, ts["optimizer"], main=sharded_main)
    else:
        optimizer.load_state_dict(ts["optimizer"])
    scheduler.load_state_dict(ts["scheduler"])
    if "scaler" in ts and getattr(optimizer, "scaler", None) is not None:  # fp16: the scale it had backed off to
        optimizer.scaler.load_state_dict(ts["scaler"])
    state = json.loads((ckpt / "trainer_state.json").read_text())
    set_rng_state(*_rng_of_process(state, ts, ckpt, rank, num_processes))
    return state


_READ = ("train_state.pt", "trainer_state.json", "lora_state.pt")  # what load_checkpoint reads besides weights


def weight_files(ckpt: Path, trust_unverified: bool = False) -> list[Path]:
    """The ``*.safetensors`` files of ``ckpt`` that ``checksums.json`` lists; a weight file (or a state
    file :func:`load_checkpoint` reads) present but not listed raises :class:`TandemError` naming it, a
    checkpoint without checksums :class:`~tandem_rlvr.integrity.Unverified` (``trust_unverified``: every one)."""
    present = sorted(ckpt.glob("*.safetensors"))
    try:
        listed = integrity.listed_files(ckpt)
    except integrity.Unverified:
        if not trust_unverified:
            raise
        log.warning("checkpoint %s has no %s: loading it unverified (trust_unverified)", ckpt, integrity.SUMS)
        return present
    for f in [*present, *(ckpt / n for n in _READ)]:
        if f.exists() and f.name not in listed:
            raise TandemError(f"checkpoint {ckpt}: {f.name} is not listed in {integrity.SUMS} (not written with "
                              "this checkpoint); not loaded. Remove the file or the checkpoint")
    return present


def _is_tied(model, key: str) -> bool:
    return bool(getattr(model.config, "tie_word_embeddings", False)) and key.endswith("lm_head.weight")


def recover_publish(final_dir: Path) -> None:
    """Finish a :func:`~tandem_rlvr.io.publish_dir` of ``final_dir`` (a checkpoint ``step-N``, ``best`` or
    ``final``) that a kill cut between its two renames: the old copy moved aside to ``.NAME.old``, the new one
    still at ``.tmp-NAME``. The new copy goes into place when it is complete (its ``COMPLETE`` marker; the old
    one is then deleted, as publish_dir would have), else the old one goes back."""
    old, tmp = final_dir.with_name(f".{final_dir.name}.old"), final_dir.with_name(f".tmp-{final_dir.name}")
    if final_dir.exists() or not old.is_dir():
        return
    chosen = tmp if (tmp / MARKER).exists() else old
    replace_durably(chosen, final_dir)
    if chosen is tmp:  # what publish_dir would have deleted next
        shutil.rmtree(old, ignore_errors=True)
    log.warning("%s: a kill had cut its replacement short; restored the %s copy", final_dir,
                "new" if chosen is tmp else "previous")


def recover_publishes(run_dir: str | Path) -> None:
    """:func:`recover_publish` for each checkpoint, ``best`` and ``final`` of a run (main process, before a resume)."""
    run_dir = Path(run_dir)
    root = run_dir / "checkpoints"
    olds = list(root.glob(".step-*.old")) if root.is_dir() else []
    for old in olds:
        recover_publish(root / old.name[1:-len(".old")])
    for name in ("best", "final"):
        recover_publish(run_dir / name)


def cut_best_back(run_dir: str | Path, step: int, best: dict | None = None) -> dict | None:
    """``best/`` as an uninterrupted run has it at ``step`` (the step a run resumes from, 0 for a fresh start), as
    :func:`~tandem_rlvr.training.rundir.truncate_metrics` cuts the metrics back: one whose ``best.json`` names a
    later step (a killed attempt validated and published it after its last checkpoint) is removed
    (:func:`_remove_best_past`). ``best``: the checkpoint's record of the best so far (``val``, ``step``,
    ``metric``). Returns the ``best.json`` to write again with the weights of ``step`` where that record is of
    ``step`` itself and ``best/`` is gone; else None."""
    run_dir, best = Path(run_dir), best or {}
    removed = _remove_best_past(run_dir, step)
    again = best.get("step") == step and not (run_dir / "best").is_dir()
    if removed is not None:
        if again:
            then = f"step {step} is the best so far: its weights are best/ again"
        elif best.get("step") is None:
            then = "best/ is written again when the run validates"
        else:  # the best/ of that step was replaced by the removed one: no copy of it is left
            then = f"best/ is written again when a validation beats the best so far (step {best['step']}, no copy left)"
        log.warning("removed best/ of step %s, past the step %d the run resumes from (an attempt killed after its "
                    "last checkpoint wrote it); %s", removed.get("step"), step, then)
    return {"metric": best.get("metric"), "value": best.get("val"), "step": step} if again else None


def _remove_best_past(run_dir: Path, step: int) -> dict | None:
    """Remove ``best/`` when its ``best.json`` names a step past ``step``; returns that ``best.json``. It is renamed
    to ``.trash-best`` before it is deleted, so a kill in the middle never leaves a half-deleted ``best/`` (nor a
    ``.best.old`` that :func:`recover_publish` would put back); a leftover ``.trash-best`` goes too."""
    best, trash = run_dir / "best", run_dir / ".trash-best"
    shutil.rmtree(trash, ignore_errors=True)
    try:
        record = json.loads((best / "best.json").read_text(encoding="utf-8"))
        past = isinstance(record, dict) and isinstance(record.get("step"), int) and record["step"] > step
    except (OSError, ValueError):  # no best/ (or not one a run wrote whole): nothing of a later step to remove
        return None
    if not past:
        return None
    replace_durably(best, trash)
    shutil.rmtree(trash, ignore_errors=True)
    return record


def newest_intact_checkpoint(run_dir: str | Path, trust_unverified: bool = False) -> Path | None:
    """The newest complete checkpoint whose files verify; damaged newer ones are moved aside (logged). One
    without ``checksums.json`` raises :class:`~tandem_rlvr.integrity.Unverified` (``trust_unverified``: taken
    as it is)."""
    for ckpt in reversed(complete_checkpoints(run_dir)):
        if trust_unverified and not (ckpt / integrity.SUMS).exists():
            return ckpt
        why = integrity.damage(ckpt)
        if why is None:
            return ckpt
        aside = integrity.move_aside(ckpt)
        log.error("checkpoint %s is damaged: %s; moved it to %s and trying the previous complete checkpoint",
                  ckpt.name, why, aside)
    return None
