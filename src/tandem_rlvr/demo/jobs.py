"""The demo's jobs and how they run.

A job is ``(run, seed)`` (a run of :func:`tandem_rlvr.demo.plan.run_names`); ``(None, 0)`` is the warm
start's evaluation. One job trains its run (unless the warm start) and evaluates the senior with the
full evaluation suite on the test split, writing its chains for the HTML report. Jobs run one after the
other in this process (:func:`run_sequential`) or in spawned processes of one intra-op thread each
(:func:`run_parallel`, one progress bar over the whole demo); every job seeds itself, so the numbers are
the same. Each process loads the world's models and splits once and keeps them for its next jobs.
"""

from __future__ import annotations

import contextlib

import copy
import json
import logging
import os
import time
from dataclasses import dataclass
from pathlib import Path

import torch

from tandem_rlvr.demo.plan import DemoPlan, style_rate, train_config
from tandem_rlvr.errors import TandemError
from tandem_rlvr.io import atomic_write_text, read_jsonl
from tandem_rlvr.world.registry import DEFAULT_WORLD, get_world

__all__ = ["JobContext", "n_workers", "run_parallel", "run_sequential"]

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class JobContext:
    """What every job of one demo shares: the world's model folders, the plan, the output folder."""

    senior_dir: str
    junior_dir: str | None  # None: self-paired (a frozen copy of the warm start)
    plan: DemoPlan
    out: str
    world: str = DEFAULT_WORLD


def n_workers(workers: int | None, n_jobs: int) -> int:
    """The number of job processes: ``workers`` (default: one per usable CPU), at most one per job."""
    if workers is not None and workers < 1:
        raise TandemError(f"demo workers must be >= 1, got {workers}")
    if workers is None:
        workers = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    return max(1, min(workers, n_jobs))


_WORLD: dict = {}  # this process's loaded world, keyed by the context it was loaded for


def _world(ctx: JobContext) -> dict:
    """The world's tokenizer, models and splits for ``ctx``, loaded once per process."""
    if _WORLD.get("ctx") != ctx:
        from tandem_rlvr.data import load_examples
        from tandem_rlvr.models import freeze, load_causal_lm, load_tokenizer

        warm, src = load_causal_lm(ctx.senior_dir), get_world(ctx.world).source
        _WORLD.clear()
        _WORLD.update(ctx=ctx, tok=load_tokenizer(ctx.senior_dir), warm=warm,
                      junior=freeze(load_causal_lm(ctx.junior_dir) if ctx.junior_dir else copy.deepcopy(warm)),
                      train=load_examples(f"{src}/train"),
                      test=load_examples(f"{src}/test")[: ctx.plan.eval_problems],
                      val=load_examples(f"{src}/val")[: ctx.plan.val_problems])
    return _WORLD


def _run_job(ctx: JobContext, job: tuple, progress: bool) -> tuple[list | None, dict]:
    """Train (unless the warm start) and evaluate one job; returns ``(curve rows, eval metrics)`` (with the
    job's wall and CPU seconds, ``time/job_s`` and ``time/job_cpu_s``)."""
    # The world's models are tiny: one intra-op thread is faster than several and immune to a busy machine.
    torch.set_num_threads(int(os.environ.get("TANDEM_RLVR_THREADS", "1")))
    t0, c0 = time.perf_counter(), time.process_time()
    curve, metrics = _train_and_evaluate(ctx, job, progress)
    metrics["time/job_s"], metrics["time/job_cpu_s"] = time.perf_counter() - t0, time.process_time() - c0
    return curve, metrics


def _train_and_evaluate(ctx: JobContext, job: tuple, progress: bool) -> tuple[list | None, dict]:
    from functools import partial

    from tandem_rlvr.demo.val import DemoTrainer, senior_alone
    from tandem_rlvr.training.build import build_run
    from tandem_rlvr.models import Pair
    from tandem_rlvr.rewards import RewardScorer

    w, plan, (run, seed), rate = _world(ctx), ctx.plan, job, style_rate(ctx.world)
    chains = Path(ctx.out) / "chains"
    with RewardScorer("math", time_limit=2.0, num_workers=1) as scorer:
        if run is None:
            metrics = _evaluate(w["warm"], w["junior"], w["tok"], w["test"], plan, scorer, 0, "warm_start",
                                chains / "warm_start.jsonl", progress, ctx.world)
            metrics["checkpoint_step"] = 0
            if plan.val_every:
                metrics["senior_alone"] = senior_alone(w["warm"], w["junior"], w["tok"], w["val"], scorer,
                                                       n=plan.val_n, max_new_tokens=plan.max_new_tokens, style_rate=rate)
            return None, metrics
        run_dir = Path(ctx.out) / "runs" / f"{run}-seed{seed}"
        cfg = train_config(run, seed, run_dir, plan, ctx.senior_dir, ctx.junior_dir, progress=progress, world=ctx.world)
        parts = build_run(cfg, pair=Pair(copy.deepcopy(w["warm"]), w["junior"], w["tok"]), examples=w["train"],
                          restart=True, text_metrics=partial(_jargon_metrics, world=ctx.world))
        tr = DemoTrainer(cfg, parts, val_examples=w["val"], scorer=scorer, val_n=plan.val_n, style_rate=rate,
                         select=plan.select if plan.val_every else None)
        tr.train()
        senior = tr.load_best().eval()  # the paper's protocol: the best validation checkpoint (else the final step)
        metrics = _evaluate(senior, w["junior"], w["tok"], w["test"], plan, scorer, 1000 + seed,
                            f"{run}-seed{seed}", chains / f"{run}-seed{seed}.jsonl", progress, ctx.world)
        metrics["checkpoint_step"] = tr.best_val["step"] if tr.best_val else tr.step
        return _curve_rows(run_dir), metrics


def run_sequential(ctx: JobContext, todo: list, n: int):
    from tandem_rlvr.logs import quiet_libraries

    quiet_libraries()  # no transformers bars between the jobs' own
    for job in todo:
        yield job, _run_job(ctx, job, progress=True)


def _worker_job(ctx: JobContext, job: tuple) -> tuple[list | None, dict]:
    """One job in a spawned process: warnings only, and no library's progress bar (they would print into the
    demo's own bar, drawn by the parent on the same stderr)."""
    from tandem_rlvr.logs import quiet_libraries, setup_logging

    setup_logging(ours=logging.WARNING)
    quiet_libraries(downloads=False)
    return _run_job(ctx, job, progress=False)


def run_parallel(ctx: JobContext, todo: list, n: int):
    """Run the jobs in ``n`` spawned processes; one progress bar (with ETA) over the whole demo, in
    training steps, counted from the runs' ``metrics.jsonl``; an evaluation counts as ``_eval_units``. Where
    stderr is no terminal, a line every 5% instead of the bar (:func:`tandem_rlvr.logs.progress`)."""
    import multiprocessing as mp
    from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait

    from tandem_rlvr.logs import progress
    from tandem_rlvr import runlock
    from tandem_rlvr.training.rundir import clear_run

    plan, out = ctx.plan, Path(ctx.out)
    for arm, seed in todo:  # a killed run's leftovers would count as progress before its job restarts it
        if arm is not None:  # only a run's own files (else refused, naming one), and not while a live process trains it
            run_dir = out / "runs" / f"{arm}-seed{seed}"
            ran = (run_dir / runlock.LOCK_NAME).exists()  # no lock file: no process ever ran it, none runs it now
            with runlock.acquire(run_dir) if ran else contextlib.nullcontext():
                clear_run(run_dir)
    unit = _eval_units(plan)

    def cost(job) -> int:  # training steps, plus the evaluation
        return unit + (plan.steps if job[0] else 0)

    total = sum(cost(job) for job in todo)
    bar = progress(total, f"demo ({len(todo)} jobs, {n} processes)", unit="step", every=max(1, total // 20))
    log.info("running %d demo jobs in %d processes", len(todo), n)
    with ProcessPoolExecutor(max_workers=n, mp_context=mp.get_context("spawn")) as pool:
        running = {pool.submit(_worker_job, ctx, job): job for job in todo}
        finished = 0
        try:
            while running:
                done, _ = wait(running, timeout=2.0, return_when=FIRST_COMPLETED)
                for fut in done:
                    job = running.pop(fut)
                    result = fut.result()
                    finished += cost(job)
                    yield job, result
                steps = sum(_steps_logged(out, job) for job in running.values())
                bar.update(max(0, min(total, finished + steps) - bar.n))
        except BaseException:
            pool.shutdown(wait=False, cancel_futures=True)
            raise
        finally:
            bar.close()


def _eval_units(plan: DemoPlan) -> int:
    """An evaluation's cost in training steps, for the ETA only: one chain per mode (solo, step handoff,
    each word-handoff point but p = 1) per evaluated sample, against one chain per training sample."""
    modes = 2 + sum(1 for p in plan.curve_ps if float(p) != 1.0)
    return max(1, round(modes * plan.eval_problems * plan.eval_n / (plan.prompts_per_step * plan.group_size)))


def _steps_logged(out: Path, job: tuple) -> int:
    arm, seed = job
    path = out / "runs" / f"{arm}-seed{seed}" / "metrics.jsonl"
    if arm is None or not path.is_file():
        return 0
    with path.open("rb") as f:
        return sum(1 for _ in f)


def _curve_rows(run_dir: Path) -> list[dict]:
    keep = ("step", "reward/mean", "rollout/senior_token_frac", "kl/senior_junior", "rollout/jargon_rate",
            "train/loss", "time/step_s", "senior/solo_pass@1", "senior/solo_pass@2", "senior/solo_pass@4",
            "senior/jargon_rate", "senior/kl_exact", "senior/junior_ce")
    return [{k: r[k] for k in keep if k in r} for r in read_jsonl(run_dir / "metrics.jsonl")]


def _jargon_metrics(texts: list[str], world: str = DEFAULT_WORLD) -> dict:
    return {"rollout/jargon_rate": style_rate(world)(texts)}


def _evaluate(senior, junior, tok, examples, plan: DemoPlan, scorer, seed: int, label: str, chains_path: Path,
              progress: bool = True, world: str = DEFAULT_WORLD) -> dict:
    from tandem_rlvr.evaluation.evaluate import eval_sampling, evaluate_pair

    metrics, chains = evaluate_pair(
        senior, junior, tok, examples, n=plan.eval_n, sampling=eval_sampling(plan.max_new_tokens), seed=seed,
        scorer=scorer, curve_ps=plan.curve_ps, batch_size=64, labels={"senior": label}, progress=progress,
    )
    solo_texts = [c["text"] for c in chains if c.get("mode") == "solo"]
    metrics["jargon_rate"] = style_rate(world)(solo_texts)
    _save_chains(chains_path, chains)
    return metrics


def _save_chains(path: Path, chains: list[dict]) -> None:
    """Every evaluated chain of one job, compact, for the HTML report's chain browser."""
    from tandem_rlvr.rewards import extract_boxed

    keep = ("problem_id", "sample", "mode", "reward", "gold", "finished", "turns")
    lines = []
    for c in chains:
        rec = {k: c[k] for k in keep if k in c}
        rec["turns"] = [[t["owner"], t["text"]] for t in c.get("turns", [])]
        rec["answer"] = extract_boxed(c.get("text", ""))
        lines.append(json.dumps(rec, ensure_ascii=False))
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_text(path, "\n".join(lines) + "\n")

