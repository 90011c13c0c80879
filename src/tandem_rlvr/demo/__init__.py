"""``tandem-rlvr demo``: the paper's experiment in the built-in arithmetic world, on a CPU.

1. build (or load the cached) world: tokenizer, warm-started senior and weaker junior;
2. train the arms ``grpo``, ``trlvr`` and ``kl_reg`` from the same warm start, same steps, per seed;
3. evaluate the warm start and every trained senior with the full evaluation suite on the test split
   (solo pass@k, step handoff, communication tax, junior CE / top-1, KL drift, handoff-rate curve)
   plus the world's jargon rate;
4. write ``results.json``, ``report.md`` (mean ± 95% interval over seeds, one verdict per claim) and
   PNG plots (training curves; the four claims side by side).
"""

from __future__ import annotations

import copy
import logging
import os
import time
from dataclasses import dataclass, field
from pathlib import Path


import torch

from tandem_rlvr.config import load_config
from tandem_rlvr.errors import TandemError
from tandem_rlvr.io import atomic_write_json

log = logging.getLogger(__name__)
ARMS = ("grpo", "trlvr", "kl_reg")


@dataclass(frozen=True)
class DemoPlan:
    """Sizes of one demo run (``quick`` or ``full``)."""

    seeds: int = 5
    steps: int = 20
    prompts_per_step: int = 8
    group_size: int = 8
    max_new_tokens: int = 112  # the longest plain solution of the test split (6 operations) is ~105 tokens
    eval_problems: int = 48
    eval_n: int = 4
    curve_ps: tuple = (1.0, 0.75, 0.5, 0.25)
    lr: float = 1e-4
    kl_betas: tuple = (0.01, 0.1, 1.0)  # the kl_reg ablation's sweep, from too weak to too strong
    val_every: int = 5  # senior-alone validation every this many steps (0: off)
    val_problems: int = 16
    val_n: int = 2
    overrides: dict = field(default_factory=dict)


FULL = DemoPlan()
QUICK = DemoPlan(seeds=1, steps=6, prompts_per_step=8, group_size=4, eval_problems=16, eval_n=2,
                 curve_ps=(1.0, 0.5), val_every=3, val_problems=8)
# The shorthand world (``--world shorthand``, meant for ``--junior self``): the same arms and sizes, its own
# token budget (``world.shorthand.BUDGET``: every shorthand solution fits it, no 7-8 op plain one does) and
# learning rate (at 1e-4, 20 steps left the senior within 0.002 nats/token of its warm start; at 1e-3 GRPO
# collapsed: README, "The shorthand world").
SHORTHAND_FULL = DemoPlan(max_new_tokens=80, lr=3e-4)
SHORTHAND_QUICK = DemoPlan(**{**QUICK.__dict__, "max_new_tokens": 80, "lr": 3e-4})
PLANS = {"arith": (FULL, QUICK), "shorthand": (SHORTHAND_FULL, SHORTHAND_QUICK)}  # (full, --quick) per world
SOURCES = {"arith": "world", "shorthand": "shorthand"}  # each world's data source: load_examples("<source>/<split>")


def style_rate(world: str):
    """The world's compressed-style detector over texts (the report's "jargon rate" row): the arithmetic
    world's jargon, the shorthand world's shorthand."""
    if world == "shorthand":
        from tandem_rlvr.world.shorthand import shorthand_rate

        return shorthand_rate
    from tandem_rlvr.world.problems import jargon_rate

    return jargon_rate


def run_names(plan: DemoPlan) -> list[str]:
    """The trained runs of one seed: ``grpo``, ``trlvr`` and ``kl_reg@β`` for every β of the sweep."""
    return ["grpo", "trlvr", *(f"kl_reg@{float(b):g}" for b in plan.kl_betas)]


def split_run(name: str) -> tuple[str, float]:
    """``(arm, kl_beta)`` of a run name from :func:`run_names`."""
    arm, _, beta = name.partition("@")
    return arm, float(beta) if beta else 0.0


def train_config(run: str, seed: int, out_dir: Path, plan: DemoPlan, senior_dir: str, junior_dir: str | None,
                 progress: bool = True, world: str = "arith"):
    """The demo's training config for one run (:func:`run_names`) and seed (the same for every run but
    ``algo.arm`` and ``algo.kl_beta``)."""
    arm, beta = split_run(run)
    base = {
        "model": {"senior": senior_dir, **({"junior": junior_dir} if junior_dir else {"self_paired": True})},
        "algo": {"arm": arm, "group_size": plan.group_size, "loss_type": "grpo", "lr": plan.lr,
                 "mini_batch_prompts": plan.prompts_per_step // 2, "kl_beta": beta},
        "handoff": {"schedule": "word", "p": 0.5, "max_gap": 32},
        "rollout": {"max_new_tokens": plan.max_new_tokens, "temperature": 0.6, "max_prompt_tokens": 256},
        "train": {"steps": plan.steps, "prompts_per_step": plan.prompts_per_step, "save_every": 0,
                  "seed": seed, "out_dir": str(out_dir), "progress": progress},
        "data": {"train": f"{SOURCES[world]}/train", "reward": "math", "reward_workers": 1},
        "val": {"data": f"{SOURCES[world]}/val", "every": plan.val_every, "n": plan.val_n, "limit": plan.val_problems},
    }
    for dotted, value in plan.overrides.items():
        node = base
        *parents, leaf = dotted.split(".")
        for p in parents:
            node = node.setdefault(p, {})
        node[leaf] = value
    return load_config(base=base)


def _jargon_metrics(texts: list[str], world: str = "arith") -> dict:
    return {"rollout/jargon_rate": style_rate(world)(texts)}


def _evaluate(senior, junior, tok, examples, plan: DemoPlan, scorer, seed: int, label: str, chains_path: Path,
              progress: bool = True, world: str = "arith") -> dict:
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
    from tandem_rlvr.io import atomic_write_text
    from tandem_rlvr.rewards import extract_boxed

    import json

    keep = ("problem_id", "sample", "mode", "reward", "gold", "finished", "turns")
    lines = []
    for c in chains:
        rec = {k: c[k] for k in keep if k in c}
        rec["turns"] = [[t["owner"], t["text"]] for t in c.get("turns", [])]
        rec["answer"] = extract_boxed(c.get("text", ""))
        lines.append(json.dumps(rec, ensure_ascii=False))
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_text(path, "\n".join(lines) + "\n")


def _write_problems(out: Path, plan: DemoPlan, world: str = "arith") -> None:
    """The evaluated test problems ``{id: text}`` for the HTML report's chain browser."""
    from tandem_rlvr.data import load_examples

    (out / "chains").mkdir(parents=True, exist_ok=True)
    problems = {str(e.id): e.problem for e in load_examples(f"{SOURCES[world]}/test")[: plan.eval_problems]}
    atomic_write_json(out / "chains" / "problems.json", problems)


def _previous(out: Path, results: dict, restart: bool) -> dict:
    """Results of an earlier run of the same plan, world and junior in ``out`` (so a killed demo resumes
    after its last finished evaluation); ``results`` (empty) when there is none or ``restart``."""
    import json

    path = out / "results.json"
    if restart or not path.is_file():
        return results
    try:
        old = json.loads(path.read_text(encoding="utf-8"))
    except ValueError:
        log.warning("ignoring unreadable %s (starting over)", path)
        return results
    same = (all(old.get(k) == results[k] for k in ("plan", "junior"))
            and all(old.get("world", {}).get(k, "arith" if k == "name" else None) == results["world"][k] for k in ("senior", "name")))
    if not same:
        log.info("%s holds another plan, world or junior: starting over", path)
        return results
    log.info("resuming the demo in %s: its finished evaluations are kept (--restart recomputes them)", out)
    keep = ("warm_start", "arms", "curves", "senior_alone_step0", "total_s")
    return {**results, **{k: old[k] for k in keep if k in old}, "resumed": True}


def run_demo(out_dir: str | Path = "demo_out", *, quick: bool = False, seeds: int | None = None,
             force_world: bool = False, junior: str = "weak", plan: DemoPlan | None = None,
             restart: bool = False, workers: int | None = None, world: str = "arith",
             world_seed: int | None = None) -> dict:
    """Run the whole demo; returns the results dict also written to ``out_dir/results.json``.

    The warm start's evaluation and each (arm, seed) run are independent jobs; ``workers`` (default:
    one per usable CPU, at most one per job) run them in parallel processes of one intra-op thread
    each, with the same numbers as one process (every job seeds itself). An interrupted demo resumes:
    evaluations already in ``out_dir/results.json`` (same plan, world and junior) are kept, the rest
    is trained and evaluated (``restart``: all). ``world`` names the built-in world (``arith``, the default,
    or ``shorthand``, see :mod:`tandem_rlvr.world.shorthand`); its plan (:data:`PLANS`) is the default;
    ``world_seed`` builds it under another build seed (a robustness check; default: the shipped one)."""
    from tandem_rlvr.demo.report import write_report
    from tandem_rlvr.preflight import check_demo
    from tandem_rlvr.world.build import build_world

    check_demo(out_dir, junior=junior, seeds=seeds, workers=workers)  # before the world build and any training
    if world not in PLANS:
        raise TandemError(f"demo world must be one of {', '.join(PLANS)}, got {world!r}")

    plan = plan or PLANS[world][1 if quick else 0]
    if seeds is not None:
        plan = DemoPlan(**{**plan.__dict__, "seeds": seeds})
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    paths = build_world(force=force_world, world=world, **({} if world_seed is None else {"seed": world_seed}))
    jdir = str(paths.junior_dir) if junior == "weak" else None
    results = {"plan": {k: list(v) if isinstance(v, tuple) else v for k, v in plan.__dict__.items()}, "junior": junior,
               "world": {"name": world, **({} if world_seed is None else {"seed": world_seed}), "senior": str(paths.senior_dir), "junior": str(paths.junior_dir),
                         "build_s": time.perf_counter() - t0},
               "warm_start": {}, "arms": {r: {} for r in run_names(plan)}, "curves": {r: {} for r in run_names(plan)},
               "senior_alone_step0": {}}
    results = _previous(out, results, restart)
    _write_problems(out, plan, world)
    todo = _pending(results, plan)
    n = _n_workers(workers, len(todo))
    results["workers"] = n
    ctx = _Context(str(paths.senior_dir), jdir, plan, str(out.resolve()), world)
    runner = _run_parallel if n > 1 else _run_sequential
    for job, (curve, metrics) in runner(ctx, todo, n):
        _store(results, job, curve, metrics)
        atomic_write_json(out / "results.json", results)
    if "total_s" not in results:  # a finished demo that was only re-reported keeps its own time
        results["total_s"] = time.perf_counter() - t0
    atomic_write_json(out / "results.json", results)
    write_report(results, out)
    log.info("demo finished in %.0f s; report: %s", results["total_s"], out / "report.md")
    return results


# -- jobs -------------------------------------------------------------------------------------------
# A job is ``(arm, seed)``; ``(None, 0)`` is the warm start's evaluation.

@dataclass(frozen=True)
class _Context:
    senior_dir: str
    junior_dir: str | None  # None: self-paired (a frozen copy of the warm start)
    plan: DemoPlan
    out: str
    world: str = "arith"


def _pending(results: dict, plan: DemoPlan) -> list[tuple[str | None, int]]:
    todo = [] if results["warm_start"] else [(None, 0)]
    for seed in range(plan.seeds):
        for run in run_names(plan):
            if not (str(seed) in results["arms"][run] and str(seed) in results["curves"][run]):
                todo.append((run, seed))
    return todo


def _n_workers(workers: int | None, n_jobs: int) -> int:
    if workers is not None and workers < 1:
        raise TandemError(f"demo workers must be >= 1, got {workers}")
    if workers is None:
        workers = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    return max(1, min(workers, n_jobs))


def _store(results: dict, job: tuple, curve: list | None, metrics: dict) -> None:
    arm, seed = job
    if arm is None:
        results["senior_alone_step0"] = metrics.pop("senior_alone", {})
        results["warm_start"] = metrics
        return
    for key, value in (("curves", curve), ("arms", metrics)):
        results[key][arm][str(seed)] = value
        results[key][arm] = dict(sorted(results[key][arm].items(), key=lambda kv: int(kv[0])))


_WORLD: dict = {}  # this process's loaded world, keyed by the context it was loaded for


def _world(ctx: _Context) -> dict:
    if _WORLD.get("ctx") != ctx:
        from tandem_rlvr.data import load_examples
        from tandem_rlvr.models import freeze, load_causal_lm, load_tokenizer

        warm, src = load_causal_lm(ctx.senior_dir), SOURCES[ctx.world]
        _WORLD.clear()
        _WORLD.update(ctx=ctx, tok=load_tokenizer(ctx.senior_dir), warm=warm,
                      junior=freeze(load_causal_lm(ctx.junior_dir) if ctx.junior_dir else copy.deepcopy(warm)),
                      train=load_examples(f"{src}/train"),
                      test=load_examples(f"{src}/test")[: ctx.plan.eval_problems],
                      val=load_examples(f"{src}/val")[: ctx.plan.val_problems])
    return _WORLD


def _run_job(ctx: _Context, job: tuple, progress: bool) -> tuple[list | None, dict]:
    """Train (unless the warm start) and evaluate one job; returns ``(curve rows, eval metrics)`` (with the
    job's wall and CPU seconds, ``time/job_s`` and ``time/job_cpu_s``)."""
    # The world's models are tiny: one intra-op thread is faster than several and immune to a busy machine.
    torch.set_num_threads(int(os.environ.get("TANDEM_RLVR_THREADS", "1")))
    t0, c0 = time.perf_counter(), time.process_time()
    curve, metrics = _train_and_evaluate(ctx, job, progress)
    metrics["time/job_s"], metrics["time/job_cpu_s"] = time.perf_counter() - t0, time.process_time() - c0
    return curve, metrics


def _train_and_evaluate(ctx: _Context, job: tuple, progress: bool) -> tuple[list | None, dict]:
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
            if plan.val_every:
                metrics["senior_alone"] = senior_alone(w["warm"], w["junior"], w["tok"], w["val"], scorer,
                                                       n=plan.val_n, max_new_tokens=plan.max_new_tokens, style_rate=rate)
            return None, metrics
        run_dir = Path(ctx.out) / "runs" / f"{run}-seed{seed}"
        cfg = train_config(run, seed, run_dir, plan, ctx.senior_dir, ctx.junior_dir, progress=progress, world=ctx.world)
        parts = build_run(cfg, pair=Pair(copy.deepcopy(w["warm"]), w["junior"], w["tok"]), examples=w["train"],
                          restart=True, text_metrics=partial(_jargon_metrics, world=ctx.world))
        tr = DemoTrainer(cfg, parts, val_examples=w["val"], scorer=scorer, val_n=plan.val_n, style_rate=rate)
        tr.train()
        senior = tr.acc.unwrap_model(tr.senior).eval()
        metrics = _evaluate(senior, w["junior"], w["tok"], w["test"], plan, scorer, 1000 + seed,
                            f"{run}-seed{seed}", chains / f"{run}-seed{seed}.jsonl", progress, ctx.world)
        return _curve_rows(run_dir), metrics


def _run_sequential(ctx: _Context, todo: list, n: int):
    for job in todo:
        yield job, _run_job(ctx, job, progress=True)


def _worker_job(ctx: _Context, job: tuple) -> tuple[list | None, dict]:
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    return _run_job(ctx, job, progress=False)


def _run_parallel(ctx: _Context, todo: list, n: int):
    """Run the jobs in ``n`` spawned processes; one progress bar (with ETA) over the whole demo, in
    training steps, counted from the runs' ``metrics.jsonl``; an evaluation counts as ``_eval_units``."""
    import multiprocessing as mp
    import shutil
    from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait

    from tqdm.auto import tqdm

    plan, out = ctx.plan, Path(ctx.out)
    for arm, seed in todo:  # a killed run's leftovers would count as progress before its job restarts it
        if arm is not None:
            shutil.rmtree(out / "runs" / f"{arm}-seed{seed}", ignore_errors=True)
    unit = _eval_units(plan)

    def cost(job) -> int:  # training steps, plus the evaluation
        return unit + (plan.steps if job[0] else 0)

    total = sum(cost(job) for job in todo)
    bar = tqdm(total=total, desc=f"demo ({len(todo)} jobs, {n} processes)", unit="step", dynamic_ncols=True)
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
    from tandem_rlvr.io import read_jsonl

    keep = ("step", "reward/mean", "rollout/senior_token_frac", "kl/senior_junior", "rollout/jargon_rate",
            "train/loss", "time/step_s", "senior/solo_pass@1", "senior/jargon_rate", "senior/kl_exact",
            "senior/junior_ce")
    return [{k: r[k] for k in keep if k in r} for r in read_jsonl(run_dir / "metrics.jsonl")]
