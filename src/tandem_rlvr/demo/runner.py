"""``tandem-rlvr demo``: the paper's experiment in the built-in arithmetic world, on a CPU.

1. build (or load the cached) world: tokenizer, warm-started senior and weaker junior;
2. train the arms ``grpo``, ``trlvr`` and ``kl_reg`` from the same warm start, same steps, per seed;
3. evaluate the warm start and every trained senior with the full evaluation suite on the test split
   (solo pass@k, step handoff, communication tax, junior CE / top-1, KL drift, handoff-rate curve)
   plus the world's jargon rate;
4. write ``results.json``, ``report.md`` (mean ± 95% interval over seeds, one verdict per claim) and
   PNG plots (training curves; the four claims side by side).

The plans are :mod:`tandem_rlvr.demo.plan`, the jobs and their processes :mod:`tandem_rlvr.demo.jobs`,
the report :mod:`tandem_rlvr.demo.report`.
"""

from __future__ import annotations

import json
import logging
import time
from pathlib import Path

from tandem_rlvr.demo.jobs import JobContext, n_workers, run_parallel, run_sequential
from tandem_rlvr.demo.plan import DemoPlan, plans, run_names, train_config, with_changes
from tandem_rlvr.errors import TandemError
from tandem_rlvr.io import atomic_write_json
from tandem_rlvr.preflight import PROBE_FILE
from tandem_rlvr import runlock
from tandem_rlvr.world.registry import DEFAULT_WORLD, get_world

__all__ = ["run_demo"]

log = logging.getLogger(__name__)


def run_demo(out_dir: str | Path = "demo_out", *, quick: bool = False, seeds: int | None = None,
             force_world: bool = False, junior: str = "weak", plan: DemoPlan | None = None,
             restart: bool = False, workers: int | None = None, world: str = DEFAULT_WORLD,
             world_seed: int | None = None, budget: int | None = None, kl_betas=None) -> dict:
    """Run the whole demo; returns the results dict also written to ``out_dir/results.json``.

    The warm start's evaluation and each (arm, seed) run are independent jobs; ``workers`` (default:
    one per usable CPU, at most one per job) run them in parallel processes of one intra-op thread
    each, with the same numbers as one process (every job seeds itself). An interrupted demo resumes:
    evaluations already in ``out_dir/results.json`` (same plan, world build and junior) are kept, the rest
    is trained and evaluated (``restart``: all; another demo's results there are refused without it, and a folder
    of files the demo did not write always). ``world`` names the built-in world (a key of
    :data:`tandem_rlvr.world.registry.WORLDS`: ``arith``, the default, ``shorthand``, ``dialects`` or
    ``slips``); its plan (:func:`tandem_rlvr.demo.plan.plans`) is the default;
    ``world_seed`` builds it under another build seed, ``budget`` changes the plan's token budget and
    ``kl_betas`` its KL-Reg sweep (empty: ``grpo`` and ``trlvr`` only): the robustness checks of
    docs/demo.md (default: the shipped world and the plan's own values)."""
    from tandem_rlvr.logs import quiet_libraries
    from tandem_rlvr.preflight import check_demo

    check_demo(out_dir, junior=junior, seeds=seeds, workers=workers, budget=budget, kl_betas=kl_betas,
               world_seed=world_seed)  # before the world build and any training
    quiet_libraries()  # no transformers/datasets bars in the demo's own (the Hub's downloads on a terminal only)
    get_world(world, "demo world")  # an unknown world fails here, before the build
    plan = with_changes(plan or plans(world)[1 if quick else 0], seeds=seeds, budget=budget, kl_betas=kl_betas)
    out = Path(out_dir)
    _check_own(out)  # a folder of someone else's files: refused before anything is written into it
    out.mkdir(parents=True, exist_ok=True)
    with runlock.acquire(out, what="demo", option="--out"):  # a second demo into the same --out is refused
        return _run(out, plan, junior, world, world_seed, force_world, budget, restart, workers)


def default_out(*, quick: bool = False, seeds: int | None = None, junior: str = "weak", world: str = DEFAULT_WORLD,
                budget: int | None = None, world_seed: int | None = None, kl_betas=None) -> str:
    """The command's ``--out`` when none is given: ``demo_out`` for the default demo, and a folder of its own for
    another setting (``demo_out-quick``, ``demo_out-shorthand-self``, ``demo_out-slips-self-b64-kl-none``), so
    docs/demo.md's commands run one after another keep every demo (one --out holds one demo)."""
    betas = None if kl_betas is None else ("kl-" + "_".join(f"{float(b):g}" for b in kl_betas) if kl_betas else "kl-none")
    parts = [world if world != DEFAULT_WORLD else None, "self" if junior == "self" else None, "quick" if quick else None,
             f"seeds{seeds}" if seeds is not None else None, f"b{budget}" if budget is not None else None,
             f"ws{world_seed}" if world_seed is not None else None, betas]
    return "-".join(["demo_out", *(p for p in parts if p)])


def _run(out: Path, plan: DemoPlan, junior: str, world: str, world_seed, force_world: bool, budget, restart: bool,
         workers) -> dict:
    from tandem_rlvr.demo.report import write_report
    from tandem_rlvr.world.build import build_id, build_world, is_shipped

    _check_own(out)  # again, under the lock
    prior = None if restart else _demo_results(out / "results.json")  # read once: the rebuild check and the resume
    if prior is not None and force_world:  # checked before the rebuild changes the world this demo was made on
        raise TandemError(f"{out} holds a demo: --rebuild-world would replace the world it was made on (and every "
                          "later demo's); pass --restart too, or choose another --out")
    atomic_write_json(out / MARKER, {"written_by": "tandem-rlvr demo"})
    t0 = time.perf_counter()
    paths = build_world(force=force_world, world=world, **({} if world_seed is None else {"seed": world_seed}))
    jdir = str(paths.junior_dir) if junior == "weak" else None
    if budget is not None:
        _check_budget(plan, world, str(paths.senior_dir), jdir, out)
    results = {"plan": {k: list(v) if isinstance(v, tuple) else v for k, v in plan.__dict__.items()}, "junior": junior,
               "world": {"name": world, **({} if world_seed is None else {"seed": world_seed}),
                         "senior": str(paths.senior_dir), "junior": str(paths.junior_dir),
                         "build": build_id(paths.root), "shipped": is_shipped(paths.root, world),
                         "build_s": time.perf_counter() - t0},
               "warm_start": {}, "arms": {r: {} for r in run_names(plan)}, "curves": {r: {} for r in run_names(plan)},
               "senior_alone_step0": {}}
    results = _previous(out, results, restart, prior)
    _write_problems(out, plan, world)
    todo = _pending(results, plan)
    n = n_workers(workers, len(todo))
    results["workers"] = n
    ctx = JobContext(str(paths.senior_dir), jdir, plan, str(out.resolve()), world)
    check_restartable(out, todo)  # every run folder before any is cleared: a refusal deletes nothing
    runner = run_parallel if n > 1 else run_sequential
    for job, (curve, metrics) in runner(ctx, todo, n):
        _store(results, job, curve, metrics)
        atomic_write_json(out / "results.json", results)
    if "total_s" not in results:  # a finished demo that was only re-reported keeps its own time
        results["total_s"] = time.perf_counter() - t0
    atomic_write_json(out / "results.json", results)
    write_report(results, out)
    log.info("demo finished in %.0f s; report: %s", results["total_s"], out / "report.md")
    return results


def _check_budget(plan: DemoPlan, world: str, senior_dir: str, junior_dir: str | None, out: Path) -> None:
    """``--budget`` against the world's models, before any job: the training preflight's context check of the
    first run's config (its message, in the demo's words)."""
    from tandem_rlvr.models import load_tokenizer
    from tandem_rlvr.preflight import check_train_context

    cfg = train_config(run_names(plan)[0], 0, out / "runs" / "budget-check", plan, senior_dir, junior_dir,
                       progress=False, world=world)
    tok = load_tokenizer(senior_dir)
    try:
        check_train_context(cfg, tok, None if junior_dir is None else load_tokenizer(junior_dir))
    except (TandemError, ValueError) as e:
        raise TandemError(f"demo --budget {plan.max_new_tokens} does not fit the {world} world's models: "
                          f"{str(e).replace('rollout.max_new_tokens', '--budget')}") from None


def _write_problems(out: Path, plan: DemoPlan, world: str = DEFAULT_WORLD) -> None:
    """The evaluated test problems ``{id: text}`` for the HTML report's chain browser."""
    from tandem_rlvr.data import load_examples

    (out / "chains").mkdir(parents=True, exist_ok=True)
    problems = {str(e.id): e.problem for e in load_examples(f"{get_world(world).source}/test")[: plan.eval_problems]}
    atomic_write_json(out / "chains" / "problems.json", problems)


MARKER = ".tandem-rlvr-demo"  # in --out: the demo wrote this folder (its own files may be replaced on --restart)
_OWN = (MARKER, runlock.LOCK_NAME)


def _check_own(out: Path) -> None:
    """Refuse an ``--out`` that holds files and is not a demo's (no :data:`MARKER`, no demo ``results.json``): the
    demo writes its report, results and runs only into a new or empty folder, or one of its own."""
    if not out.is_dir() or (out / MARKER).is_file() or _demo_results(out / "results.json") is not None:
        return
    foreign = sorted(e.name for e in out.iterdir() if e.name not in _OWN and not PROBE_FILE.match(e.name))
    if foreign:
        raise TandemError(f"demo --out {str(out)!r} holds files the demo did not write ({', '.join(foreign[:3])}"
                          f"{', ...' if len(foreign) > 3 else ''}): choose a new or empty folder, or a demo's own")


def check_restartable(out: Path, todo: list) -> None:
    """Refuse, before any run is cleared, when a pending job's run folder holds a file no run writes. Each job
    restarts its run folder (a killed attempt's leftovers would count as progress); checked one job at a time,
    the earlier jobs' runs were deleted before a later folder's refusal, while the message said nothing was."""
    from tandem_rlvr.training.rundir import check_restart

    for arm, seed in todo:
        if arm is None:
            continue
        run_dir = out / "runs" / f"{arm}-seed{seed}"
        try:
            check_restart(run_dir)
        except TandemError as e:
            raise TandemError(f"demo: run folder {str(run_dir)!r} cannot be restarted, so no run was cleared: {e}") from None


def _demo_results(path: Path) -> dict | None:
    """A demo's ``results.json`` (a mapping with its plan), else None (absent, unreadable or something else)."""
    try:
        old = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    ok = isinstance(old, dict) and isinstance(old.get("plan"), dict) and isinstance(old.get("world", {}), dict)
    return old if ok else None


def _previous(out: Path, results: dict, restart: bool, old: dict | None) -> dict:
    """Results of an earlier run of the same plan, world build and junior in ``out`` (so a killed demo resumes
    after its last finished evaluation); ``results`` (empty) when there is none or ``restart``. Another demo's
    results are refused without ``restart`` (one line naming what differs): never replaced by surprise. ``old``:
    :func:`_demo_results` of ``out/results.json``."""
    path = out / "results.json"
    if restart or not path.exists():
        return results
    if old is None:
        raise TandemError(f"{path} is not a demo's results (unreadable, or no plan in it): move it away, or pass "
                          "--restart to replace it")
    was = {"name": DEFAULT_WORLD, **old.get("world", {})}
    differ = [k for k in ("plan", "junior") if old.get(k) != results[k]]
    differ += [f"world {k}" for k in ("name", "senior", "build") if was.get(k) != results["world"][k]
               and (k != "build" or "build" in was)]  # results of an older version name no build
    if "build" not in was and not differ:
        log.warning("%s was written by an older version, which recorded no world build: resuming on the world in "
                    "the cache as it is now", path)
    if differ:
        raise TandemError(f"{out} holds a demo of another {', '.join(differ)}: pass --restart to replace it (its "
                          "results, report and runs), or choose another --out")
    log.info("resuming the demo in %s: its finished evaluations are kept (--restart recomputes them)", out)
    keep = ("warm_start", "arms", "curves", "senior_alone_step0", "total_s")
    return {**results, **{k: old[k] for k in keep if k in old}, "resumed": True}


def _pending(results: dict, plan: DemoPlan) -> list[tuple[str | None, int]]:
    """The jobs whose results are not in ``results`` yet: the warm start's evaluation, then (run, seed)."""
    todo = [] if results["warm_start"] else [(None, 0)]
    for seed in range(plan.seeds):
        for run in run_names(plan):
            if not (str(seed) in results["arms"][run] and str(seed) in results["curves"][run]):
                todo.append((run, seed))
    return todo


def _store(results: dict, job: tuple, curve: list | None, metrics: dict) -> None:
    """Put one finished job's curve and metrics into ``results`` (seeds in order)."""
    arm, seed = job
    if arm is None:
        results["senior_alone_step0"] = metrics.pop("senior_alone", {})
        results["warm_start"] = metrics
        return
    for key, value in (("curves", curve), ("arms", metrics)):
        results[key][arm][str(seed)] = value
        results[key][arm] = dict(sorted(results[key][arm].items(), key=lambda kv: int(kv[0])))
