"""The run directory: start fresh, resume the same run, or refuse to mix two runs."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import yaml

from tandem_rlvr import integrity
from tandem_rlvr.config import Config, save_config
from tandem_rlvr.errors import TandemError
from tandem_rlvr.io import atomic_write_text, read_jsonl

# keys a resumed run may change (how long, how often to save or log); any other change is refused
RESUMABLE_CHANGES = {"train.steps", "train.progress", "train.save_every", "train.keep_last", "train.trackers",
                     "train.max_nonfinite", "val.every", "data.reward_workers", "train.preempt_exit_code",
                     "train.watchdog_s", "train.collective_timeout_s"}


def config_changes(old: dict, new: dict, prefix: str = "") -> list[str]:
    """Dotted keys whose values differ, except those a resumed run may change."""
    out = []
    for k in sorted(set(old) | set(new)):
        key = f"{prefix}{k}"
        a, b = old.get(k), new.get(k)
        if isinstance(a, dict) and isinstance(b, dict):
            out += config_changes(a, b, key + ".")
        elif a != b and key not in RESUMABLE_CHANGES:
            out.append(f"{key}: {a!r} -> {b!r}")
    return out


def prepare(run_dir: Path, cfg: Config, restart: bool) -> Path | None:
    """Make ``run_dir`` ready; return the checkpoint to resume from (None = fresh start).

    ``restart`` deletes the directory first. A directory with progress (a checkpoint or metrics)
    is resumed only if its ``config.yaml`` matches ``cfg`` up to :data:`RESUMABLE_CHANGES`.
    """
    if restart and run_dir.exists():
        shutil.rmtree(run_dir)
    resume_from = integrity.newest_intact_checkpoint(run_dir)  # a damaged newest one is moved aside
    has_progress = resume_from is not None or bool(read_jsonl(run_dir / "metrics.jsonl"))
    if has_progress:
        old_cfg = run_dir / "config.yaml"
        if not old_cfg.exists():
            raise TandemError(f"run directory {str(run_dir)!r} holds a run without config.yaml; "
                              "pass --restart to start over or choose another train.out_dir")
        changed = config_changes(yaml.safe_load(old_cfg.read_text()) or {}, cfg.to_dict())
        if changed:
            raise TandemError(
                f"run directory {str(run_dir)!r} holds a run with a different config ({'; '.join(changed[:5])}); "
                "pass --restart to start over or choose another train.out_dir"
            )
    run_dir.mkdir(parents=True, exist_ok=True)
    save_config(cfg, run_dir / "config.yaml")
    return resume_from


def truncate_metrics(run_dir: Path, step: int) -> None:
    """Keep the metrics rows up to ``step`` (those of a resumed checkpoint), atomically."""
    path = run_dir / "metrics.jsonl"
    rows = [r for r in read_jsonl(path) if r.get("step", 0) <= step]
    atomic_write_text(path, "".join(json.dumps(r) + "\n" for r in rows))
