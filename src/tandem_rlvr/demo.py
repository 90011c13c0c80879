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
from tandem_rlvr.io import atomic_write_json

log = logging.getLogger(__name__)
ARMS = ("grpo", "trlvr", "kl_reg")


@dataclass(frozen=True)
class DemoPlan:
    """Sizes of one demo run (``quick`` or ``full``)."""

    seeds: int = 3
    steps: int = 20
    prompts_per_step: int = 8
    group_size: int = 8
    max_new_tokens: int = 112  # the longest plain solution of the test split (6 operations) is ~105 tokens
    eval_problems: int = 48
    eval_n: int = 4
    curve_ps: tuple = (1.0, 0.5, 0.25)
    lr: float = 1e-4
    overrides: dict = field(default_factory=dict)


FULL = DemoPlan()
QUICK = DemoPlan(seeds=1, steps=6, prompts_per_step=8, group_size=4, eval_problems=16, eval_n=2, curve_ps=(1.0, 0.5))


def train_config(arm: str, seed: int, out_dir: Path, plan: DemoPlan, senior_dir: str, junior_dir: str | None):
    """The demo's training config for one arm and seed (the same for every arm but ``algo.arm``)."""
    base = {
        "model": {"senior": senior_dir, **({"junior": junior_dir} if junior_dir else {"self_paired": True})},
        "algo": {"arm": arm, "group_size": plan.group_size, "loss_type": "grpo", "lr": plan.lr,
                 "mini_batch_prompts": plan.prompts_per_step // 2, "kl_beta": 0.1 if arm == "kl_reg" else 0.0},
        "handoff": {"schedule": "word", "p": 0.5, "max_gap": 32},
        "rollout": {"max_new_tokens": plan.max_new_tokens, "temperature": 0.6, "max_prompt_tokens": 256},
        "train": {"steps": plan.steps, "prompts_per_step": plan.prompts_per_step, "save_every": 0,
                  "seed": seed, "out_dir": str(out_dir), "progress": True},
        "data": {"train": "world/train", "reward": "math", "reward_workers": 1},
    }
    for dotted, value in plan.overrides.items():
        node = base
        *parents, leaf = dotted.split(".")
        for p in parents:
            node = node.setdefault(p, {})
        node[leaf] = value
    return load_config(base=base)


def _jargon_metrics(texts: list[str]) -> dict:
    from tandem_rlvr.world.problems import jargon_rate

    return {"rollout/jargon_rate": jargon_rate(texts)}


def _evaluate(senior, junior, tok, examples, plan: DemoPlan, scorer, seed: int, label: str) -> dict:
    from tandem_rlvr.evaluate import eval_sampling, evaluate_pair
    from tandem_rlvr.world.problems import jargon_rate

    metrics, chains = evaluate_pair(
        senior, junior, tok, examples, n=plan.eval_n, sampling=eval_sampling(plan.max_new_tokens), seed=seed,
        scorer=scorer, curve_ps=plan.curve_ps, batch_size=64, labels={"senior": label}, progress=True,
    )
    solo_texts = [c["text"] for c in chains if c.get("mode") == "solo"]
    metrics["jargon_rate"] = jargon_rate(solo_texts)
    return metrics


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
    same = all(old.get(k) == results[k] for k in ("plan", "junior")) and old.get("world", {}).get("senior") == results["world"]["senior"]
    if not same:
        log.info("%s holds another plan, world or junior: starting over", path)
        return results
    log.info("resuming the demo in %s: its finished evaluations are kept (--restart recomputes them)", out)
    keep = ("warm_start", "arms", "curves", "total_s")
    return {**results, **{k: old[k] for k in keep if k in old}, "resumed": True}


def run_demo(out_dir: str | Path = "demo_out", *, quick: bool = False, seeds: int | None = None,
             force_world: bool = False, junior: str = "weak", plan: DemoPlan | None = None,
             restart: bool = False) -> dict:
    """Run the whole demo; returns the results dict also written to ``out_dir/results.json``.

    An interrupted demo resumes: evaluations already in ``out_dir/results.json`` (same plan, world
    and junior, run not finished) are kept, the rest is trained and evaluated (``restart``: all)."""
    from tandem_rlvr.data import load_examples
    from tandem_rlvr.demo_report import write_report
    from tandem_rlvr.models import Pair, freeze, load_causal_lm, load_tokenizer
    from tandem_rlvr.rewards import RewardScorer
    from tandem_rlvr.trainer import Trainer
    from tandem_rlvr.world.build import build_world

    # The world's models are tiny: one intra-op thread is faster than several and immune to a busy machine.
    torch.set_num_threads(int(os.environ.get("TANDEM_RLVR_THREADS", "1")))
    plan = plan or (QUICK if quick else FULL)
    if seeds is not None:
        plan = DemoPlan(**{**plan.__dict__, "seeds": seeds})
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    paths = build_world(force=force_world)
    t_world = time.perf_counter() - t0
    tok = load_tokenizer(str(paths.senior_dir))
    warm = load_causal_lm(str(paths.senior_dir))
    jdir = str(paths.junior_dir) if junior == "weak" else None
    jmodel = freeze(load_causal_lm(jdir) if jdir else copy.deepcopy(warm))
    train_ex = load_examples("world/train")
    test_ex = load_examples("world/test")[: plan.eval_problems]
    results = {"plan": {**plan.__dict__, "curve_ps": list(plan.curve_ps)}, "junior": junior,
               "world": {"senior": str(paths.senior_dir), "junior": str(paths.junior_dir), "build_s": t_world},
               "warm_start": {}, "arms": {a: {} for a in ARMS}, "curves": {a: {} for a in ARMS}}
    results = _previous(out, results, restart)
    with RewardScorer("math", time_limit=2.0, num_workers=1) as scorer:
        if not results["warm_start"]:
            results["warm_start"] = _evaluate(warm, jmodel, tok, test_ex, plan, scorer, 0, "warm_start")
            atomic_write_json(out / "results.json", results)
        for seed in range(plan.seeds):
            for arm in ARMS:
                if str(seed) in results["arms"][arm] and str(seed) in results["curves"][arm]:
                    continue
                run_dir = out / "runs" / f"{arm}-seed{seed}"
                cfg = train_config(arm, seed, run_dir, plan, str(paths.senior_dir), jdir)
                pair = Pair(copy.deepcopy(warm), jmodel, tok)
                tr = Trainer(cfg, pair=pair, examples=train_ex, restart=True, text_metrics=_jargon_metrics)
                tr.train()
                results["curves"][arm][str(seed)] = _curve_rows(run_dir)
                senior = tr.acc.unwrap_model(tr.senior).eval()
                results["arms"][arm][str(seed)] = _evaluate(senior, jmodel, tok, test_ex, plan, scorer, 1000 + seed,
                                                            f"{arm}-seed{seed}")
                atomic_write_json(out / "results.json", results)
    if "total_s" not in results:  # a finished demo that was only re-reported keeps its own time
        results["total_s"] = time.perf_counter() - t0
    atomic_write_json(out / "results.json", results)
    write_report(results, out)
    log.info("demo finished in %.0f s; report: %s", results["total_s"], out / "report.md")
    return results


def _curve_rows(run_dir: Path) -> list[dict]:
    from tandem_rlvr.io import read_jsonl

    keep = ("step", "reward/mean", "rollout/senior_token_frac", "kl/senior_junior", "rollout/jargon_rate",
            "train/loss", "time/step_s")
    return [{k: r[k] for k in keep if k in r} for r in read_jsonl(run_dir / "metrics.jsonl")]
