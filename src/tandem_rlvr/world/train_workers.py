"""Train several warm starts at once: one worker process per model, one CPU thread each.

Tiny models scale poorly across threads (and a shared, busy machine makes multi-threaded small
matmuls much slower), so each model trains single-threaded — which also makes it deterministic —
and the models run side by side. Workers are fresh interpreters (``python -m``, so the caller's
``__main__`` is never re-imported) that stream JSON progress lines to the parent, which draws one
tqdm bar with an ETA. ``TANDEM_RLVR_WORLD_WORKERS=0`` trains sequentially in-process instead.
"""

from __future__ import annotations

import json
import os
import queue
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from tandem_rlvr.world.registry import DEFAULT_WORLD
from tandem_rlvr.world.sft import ModelSpec

REPORT_EVERY = 10  # steps between progress messages


def train_one(spec: ModelSpec, tokenizer_dir: str | Path, out_dir: str | Path, report=None, world: str = DEFAULT_WORLD) -> dict:
    """Train ``spec`` (on ``world``'s styles) single-threaded, save model + tokenizer to ``out_dir``; return its stats."""
    import torch
    from transformers import AutoTokenizer

    from tandem_rlvr.world.sft import count_parameters, train_sft

    torch.set_num_threads(1)
    tokenizer = AutoTokenizer.from_pretrained(str(tokenizer_dir))
    start, losses = time.time(), []

    def on_step(step: int, loss: float) -> None:
        """Record the loss; report progress every REPORT_EVERY steps."""
        losses.append(loss)
        if report is not None and ((step + 1) % REPORT_EVERY == 0 or step + 1 == spec.steps):
            report(spec.name, step + 1)

    model = train_sft(spec, tokenizer, on_step, world=world)
    model.save_pretrained(str(out_dir), safe_serialization=True)
    tokenizer.save_pretrained(str(out_dir))
    tail = losses[-50:]
    return {
        "parameters": count_parameters(model),
        "train_seconds": round(time.time() - start, 2),
        "final_loss": round(sum(tail) / len(tail), 4),
        "spec": spec.to_dict(),
    }


def _worker_main(argv: list[str]) -> int:
    """``python -m tandem_rlvr.world.train_workers SPEC_JSON TOKENIZER_DIR OUT_DIR [WORLD]``: train one model.

    Progress goes to stdout as JSON lines ``{"step": n}``, the result as ``{"done": stats}``.
    """
    spec_dict = json.loads(argv[0])
    spec_dict["n_ops"] = tuple(spec_dict["n_ops"])
    spec = ModelSpec(**spec_dict)

    def report(_name: str, step: int) -> None:
        """Emit one JSON progress line for the parent."""
        print(json.dumps({"step": step}), flush=True)

    stats = train_one(spec, argv[1], argv[2], report=report, world=argv[3] if len(argv) > 3 else DEFAULT_WORLD)
    print(json.dumps({"done": stats}), flush=True)
    return 0


def _pump(name: str, proc: subprocess.Popen, messages: queue.Queue) -> None:
    """Forward a worker's JSON stdout lines to ``messages``; post ``(name, None)`` at EOF."""
    for line in proc.stdout:
        line = line.strip()
        if line.startswith("{"):
            try:
                messages.put((name, json.loads(line)))
            except ValueError:
                pass
    messages.put((name, None))


def _progress_bar(total: int, enabled: bool):
    """One tqdm bar (with ETA) over all models' SFT steps."""
    from tqdm.auto import tqdm

    return tqdm(total=total, desc="building world (SFT steps)", unit="step", disable=not enabled)


def _spawn(spec: ModelSpec, tokenizer_dir: Path, out_dir: Path, log, world: str = DEFAULT_WORLD) -> subprocess.Popen:
    """Start a fresh interpreter (not a fork: the caller's ``__main__`` is never re-imported)."""
    package_root = str(Path(__file__).resolve().parents[2])  # the folder holding tandem_rlvr/
    pythonpath = os.pathsep.join(p for p in (package_root, os.environ.get("PYTHONPATH", "")) if p)
    env = dict(os.environ, OMP_NUM_THREADS="1", MKL_NUM_THREADS="1", TOKENIZERS_PARALLELISM="false")
    env["PYTHONPATH"] = pythonpath
    cmd = [sys.executable, "-m", "tandem_rlvr.world.train_workers", json.dumps(spec.to_dict()), str(tokenizer_dir), str(out_dir), world]
    return subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=log, text=True, env=env)


def _train_parallel(specs: dict[str, ModelSpec], tokenizer_dir: Path, out_root: Path, bar, world: str = DEFAULT_WORLD) -> dict:
    """Run one worker process per spec; collect stats; raise with the worker's log if one fails."""
    messages: queue.Queue = queue.Queue()
    procs, logs, stats = {}, {}, {}
    done_steps = {name: 0 for name in specs}
    try:
        for name, spec in specs.items():
            logs[name] = tempfile.TemporaryFile(mode="w+")  # noqa: SIM115 - closed in finally
            procs[name] = _spawn(spec, tokenizer_dir, out_root / name, logs[name], world)
            threading.Thread(target=_pump, args=(name, procs[name], messages), daemon=True).start()
        finished = 0
        while finished < len(specs):
            name, msg = messages.get()
            if msg is None:
                finished += 1
                if procs[name].wait() != 0 or name not in stats:
                    logs[name].seek(0)
                    raise RuntimeError(f"world build: training {name} failed:\n{logs[name].read()[-4000:]}")
            elif "step" in msg:
                bar.update(msg["step"] - done_steps[name])
                done_steps[name] = msg["step"]
            elif "done" in msg:
                stats[name] = msg["done"]
    finally:
        for proc in procs.values():
            if proc.poll() is None:
                proc.kill()
            proc.wait()
        for log in logs.values():
            log.close()
    return stats


def train_models(specs: dict[str, ModelSpec], tokenizer_dir: Path, out_root: Path, progress: bool = True,
                 world: str = DEFAULT_WORLD) -> dict:
    """Train every spec (on ``world``'s styles) into ``out_root/<name>``; return ``{name: stats}`` (parameter
    counts, times)."""
    total = sum(s.steps for s in specs.values())
    with _progress_bar(total, progress) as bar:
        if os.environ.get("TANDEM_RLVR_WORLD_WORKERS", "") == "0" or len(specs) == 1:
            return _train_sequential(specs, tokenizer_dir, out_root, bar, world)
        return _train_parallel(specs, tokenizer_dir, out_root, bar, world)


def _train_sequential(specs: dict[str, ModelSpec], tokenizer_dir: Path, out_root: Path, bar, world: str = DEFAULT_WORLD) -> dict:
    """Train the specs one after another in this process (single-threaded, restoring the thread count)."""
    import torch

    threads, out = torch.get_num_threads(), {}
    try:
        for name, spec in specs.items():
            done = [0]

            def report(_name: str, step: int, done=done) -> None:
                """Advance the bar to ``step`` for this model."""
                bar.update(step - done[0])
                done[0] = step

            out[name] = train_one(spec, tokenizer_dir, out_root / name, report=report, world=world)
    finally:
        torch.set_num_threads(threads)
    return out


if __name__ == "__main__":
    raise SystemExit(_worker_main(sys.argv[1:]))
