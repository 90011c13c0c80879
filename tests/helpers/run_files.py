"""The files of a ``tandem-rlvr train`` run: its data and config in, its metrics rows out."""

from __future__ import annotations

import json
from pathlib import Path

import yaml

VOLATILE = ("time/",)  # wall-clock timings; every other key of a metrics row must match between equal runs


def write_jsonl(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return path


def write_data(path, n=12):
    with open(path, "w") as f:
        for i in range(n):
            f.write(json.dumps({"problem": f"What is {i} plus 1?", "answer": str(i + 1)}) + "\n")
    return path


def write_config(tmp_path, model_dirs, arm="trlvr", data=None, **train):
    senior, junior = model_dirs
    cfg = {
        "model": {"senior": str(senior), "junior": str(junior)},
        "algo": {"arm": arm, "group_size": 4, "mini_batch_prompts": 2, "lr": 1e-3,
                 **({"kl_beta": 0.05} if arm == "kl_reg" else {})},
        "handoff": {"schedule": "word", "p": 0.5},
        "rollout": {"max_new_tokens": 12, "temperature": 1.0},
        "train": {"steps": 3, "prompts_per_step": 4, "save_every": 2, "out_dir": str(tmp_path / "run"),
                  "progress": False, **train},
        "data": {"train": str(write_data(tmp_path / "train.jsonl")), "reward": "math", "reward_workers": 1,
                 **(data or {})},
    }
    p = tmp_path / "cfg.yaml"
    p.write_text(yaml.safe_dump(cfg))
    return p


def metrics_rows(run):
    """The run's metrics.jsonl rows without their VOLATILE keys."""
    rows = [json.loads(x) for x in (Path(run) / "metrics.jsonl").read_text().splitlines()]
    return [{k: v for k, v in r.items() if not k.startswith(VOLATILE)} for r in rows]


def count_metrics_rows(run):
    """How many rows the run's metrics.jsonl holds (0 before it exists)."""
    f = Path(run) / "metrics.jsonl"
    return len(f.read_text().splitlines()) if f.exists() else 0
