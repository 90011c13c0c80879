"""P7: the CPU RL step of the default demo's plan, old loop ÷ new loop, per phase (issue 37).

Both sides run here, in one process, on the built-in arithmetic world's models (the shipped prebuilt
senior and weak junior: tiny Qwen3s, 3 layers, 96 wide), with the default demo's training config
(``demo.plan.train_config``: 8 prompts × 8 rollouts, 112 new tokens, word handoff p = 0.5, T = 0.6,
two PPO mini-batches; validation off), one intra-op thread (as each demo job runs). Each side starts
from a fresh copy of the warm start and runs the same steps; the sides alternate repeat by repeat.

- **old**: the ``engines.fastpath`` switches in ``FLAGS`` off: every forward is
  transformers' ``Qwen3ForCausalLM`` (the engine's buffer KV cache and GQA-in-SDPA), as on main;
- **new**: both on: the rollout decodes with :mod:`tandem_rlvr.engines.lean_qwen3` (prompts read once
  per distinct prompt, finished rows dropped), the no-grad teacher-forced scoring reads each distinct
  prompt once (still transformers' model) and so does the update's forward (``SHARED_PROMPTS_UPDATE``:
  each mini-batch's prompts once under autograd, their backward once after the chunks), and the PPO
  ratio's old log-probs are the ones the rollout recorded (``algo.old_logps=auto``; the old loop:
  ``recompute``, one teacher-forced pass of the senior per step); teacher-forced forwards stop at their
  rows' longest response (``TRIM``) and the update runs in length-sorted chunks of 8 (the demo's
  ``algo.micro_batch``; the old loop: one chunk of 32) over the rows whose advantage is not 0
  (``SKIP_ZERO_ADVANTAGE``; the old loop: every row); tokens are drawn by inverse CDF
  (``engines.types.draw``; the old loop: ``torch.multinomial``).

Phases, in CPU seconds of this process (wall time on a shared machine also counts other jobs' turns):
``rollout`` (``Trainer.rollout``), ``reward`` (``Trainer.rewards``; the answers are checked in the
verifier's own process, so this is near zero and not recorded), ``scoring`` (the no-grad
``sequence_logps`` calls: the old log-probs, and the junior's for ``kl_reg``), ``update`` (the rest of
``Trainer.update``: forward, backward, optimiser) and ``total`` (``Trainer.train_step``). Arms:
``trlvr`` (tandem rollouts, both models on every token), ``grpo`` (solo senior rollouts) and ``kl_reg@0.1``
(solo rollouts, junior scored teacher-forced, a KL term: every row in the update). The demo trains one
``trlvr``, one ``grpo`` and three ``kl_reg`` runs per seed: the demo-weighted total printed (from the sides'
medians) and recorded (per repeat, from its two sides' weighted sums) is ``trlvr + grpo + 3 × kl_reg``
(``trlvr + 4 × kl_reg`` when ``--arms`` leaves ``grpo`` out). Each repeat also prints both sides' reward mean,
loss and mean response length per step: not equal, since the two samplers draw the same distribution from
different random streams, so the sides' tokens part from the first step on (each side repeats its own
numbers from repeat to repeat).
"""

from __future__ import annotations

import argparse
import copy
import statistics
import tempfile
import time
from pathlib import Path

import common as C
import torch

FLAGS = ("LEAN", "PAIR", "SHARED_PROMPTS", "SHARED_PROMPTS_UPDATE", "TRIM", "SKIP_ZERO_ADVANTAGE")  # engines.fastpath switches: all off = the old loop, all on = the new one


def _multinomial(probs_BV, gen):
    """The old loop's sampler (before engines.types.draw)."""
    return torch.multinomial(probs_BV, 1, generator=gen).squeeze(-1)
PHASES = ("rollout", "reward", "scoring", "update", "total")


def _world():
    from tandem_rlvr.data import load_examples
    from tandem_rlvr.models import freeze, load_causal_lm, load_tokenizer
    from tandem_rlvr.world.build import build_world

    paths = build_world(progress=False)
    warm = load_causal_lm(str(paths.senior_dir))
    junior = freeze(load_causal_lm(str(paths.junior_dir)))
    return paths, warm, junior, load_tokenizer(str(paths.senior_dir)), load_examples("arith/train")


def _trainer(world, arm: str, plan, out: Path):
    from tandem_rlvr.demo.plan import train_config
    from tandem_rlvr.models import Pair
    from tandem_rlvr.training.build import build_run
    from tandem_rlvr.training.trainer import Trainer

    paths, warm, junior, tok, train = world
    cfg = train_config(arm, 0, out, plan, str(paths.senior_dir), str(paths.junior_dir), progress=False)
    parts = build_run(cfg, pair=Pair(copy.deepcopy(warm), junior, tok), examples=train, restart=True)
    return Trainer(cfg, parts)


def _side(world, arm: str, plan, steps: int, lean: bool) -> tuple[dict, list]:
    """CPU seconds per phase summed over ``steps`` steps, and each step's (reward mean, loss, mean length).

    CPU time of this single-threaded process, not wall time: on a machine shared with other jobs the
    wall clock also counts the time the scheduler gave to them. The phases are timed by wrapping the
    trainer's own methods: ``rollout``, ``rewards``, ``update`` (its no-grad ``sequence_logps`` calls
    are the scoring, the rest the update) and ``train_step`` (the total).
    """
    from tandem_rlvr.engines import fastpath
    from tandem_rlvr.training import trainer as trainer_mod

    out = {p: 0.0 for p in PHASES}

    def timed(fn, phase):
        def call(*args, **kw):
            if phase == "scoring" and torch.is_grad_enabled():
                return fn(*args, **kw)  # the update's own forward: counted in the update
            c0 = time.process_time()
            try:
                return fn(*args, **kw)
            finally:
                out[phase] += time.process_time() - c0
        return call

    prev = {f: getattr(fastpath, f) for f in FLAGS}
    for f in FLAGS:
        setattr(fastpath, f, lean)
    from tandem_rlvr.engines import types as types_mod

    prev_logps, prev_draw = trainer_mod.sequence_logps, types_mod.draw
    if not lean:
        types_mod.draw = _multinomial
    trainer_mod.sequence_logps = timed(prev_logps, "scoring")
    try:
        with tempfile.TemporaryDirectory() as d:
            tr = _trainer(world, arm, plan, Path(d) / "run")
            tr.cfg.algo.old_logps = "auto" if lean else "recompute"
            if not lean:  # the old demo config: one update chunk per mini-batch
                tr.cfg.algo.micro_batch = 0
            for name, phase in (("rollout", "rollout"), ("rewards", "reward"), ("update", "update"),
                                ("train_step", "total")):
                setattr(tr, name, timed(getattr(tr, name), phase))
            with tr._scorer() as scorer:
                tr.scorer = scorer
                scorer.score(["\\boxed{1}"], ["1"])  # start the verifier worker outside the timed steps
                seen = []
                for step in range(steps):
                    row = tr.train_step(step)
                    seen.append((round(row["reward/mean"], 4), round(row["train/loss"], 5),
                                 row["rollout/response_len"]))
                tr.scorer = None
    finally:
        for f, v in prev.items():
            setattr(fastpath, f, v)
        trainer_mod.sequence_logps, types_mod.draw = prev_logps, prev_draw
    out["update"] -= out["scoring"]
    return out, seen


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="one step per side, 2 repeats, trlvr and kl_reg")
    ap.add_argument("--steps", type=int, default=2, help="RL steps per side and repeat")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--arms", default="trlvr,grpo,kl_reg@0.1")
    ap.add_argument("--no-write", action="store_true", help="print only; do not append to RESULTS.md")
    a = ap.parse_args()
    if a.quick or C.quick():
        a.steps, a.repeats = 1, 2
    from dataclasses import replace

    from tandem_rlvr.demo.plan import FULL

    plan = replace(FULL, val_every=0)  # the default demo's sizes; no validation inside the timed steps
    world = _world()
    ratios: dict = {}
    times: dict = {}
    for arm in a.arms.split(","):
        for r in range(a.repeats):
            sides = {}
            for lean in ((False, True) if r % 2 == 0 else (True, False)):
                sides[lean] = _side(world, arm, plan, a.steps, lean)
            (old, old_seen), (new, new_seen) = sides[False], sides[True]
            for p in PHASES:
                times.setdefault((arm, p), []).append((old[p], new[p]))
                if old[p] > 0:
                    ratios.setdefault((arm, p), []).append(new[p] / old[p])
            print(f"{arm} repeat {r}: " + ", ".join(f"{p} {old[p]:.2f}s -> {new[p]:.2f}s" for p in PHASES)
                  + f"; old (reward, loss, len) {old_seen} new {new_seen}", flush=True)
    lines = []
    for arm in a.arms.split(","):
        for p in PHASES:
            rs, ts = ratios.get((arm, p), []), times[(arm, p)]
            med = statistics.median(rs) if rs else float("nan")
            o = statistics.median(t[0] for t in ts) / a.steps
            n = statistics.median(t[1] for t in ts) / a.steps
            lines.append((arm, p, med, min(rs or [0]), max(rs or [0]), o, n))
            print(f"P7 {arm:7s} {p:8s} new/old {med:.3f} [{min(rs or [0]):.3f}-{max(rs or [0]):.3f}]  "
                  f"old {o:.2f}s/step  new {n:.2f}s/step")
    arms = a.arms.split(",")
    if "trlvr" in arms and "kl_reg@0.1" in arms:  # the demo's five runs per seed: trlvr, grpo, kl_reg at three β
        weights = {"trlvr": 1, "grpo": 1, "kl_reg@0.1": 3} if "grpo" in arms else {"trlvr": 1, "kl_reg@0.1": 4}
        tot = {side: sum(statistics.median(t[side] for t in times[(arm, "total")]) * w for arm, w in weights.items())
               / a.steps for side in (0, 1)}
        what = " + ".join(f"{w} x {arm}" if w > 1 else arm for arm, w in weights.items())
        print(f"P7 demo-weighted total ({what}) new/old {tot[1] / tot[0]:.3f}: "
              f"old {tot[0]:.1f}s new {tot[1]:.1f}s per step of all five runs")
        # per repeat: the weighted sums of that repeat's two sides (the spread the row shows)
        weighted = [sum(times[(arm, "total")][r][1] * w for arm, w in weights.items())
                    / sum(times[(arm, "total")][r][0] * w for arm, w in weights.items()) for r in range(a.repeats)]
        if not a.no_write:
            C.record("P7 demo-weighted total", f"CPU RL step of the default demo, new ÷ old loop ({what})", weighted,
                     "<= 0.333", f"{a.steps} step(s) × {a.repeats} repeats per side; per repeat, the weighted sum of "
                     f"the arms' total CPU s of each side; CPU s per step of all five runs old→new (medians) "
                     f"{tot[0]:.2f}→{tot[1]:.2f}")
    if not a.no_write:
        details = (f"default demo plan (8×8 rollouts, 112 new tokens, word p=0.5, T=0.6), prebuilt world "
                   f"(Qwen3 h96×L3, senior 320 / junior 256 MLP), {a.steps} step(s) × {a.repeats} repeats per side; "
                   + "CPU s/step old→new: "
                   + "; ".join(f"{arm} {p} {o:.2f}→{n:.2f}" for arm, p, _m, _lo, _hi, o, n in lines if p != "reward"))
        for arm, p, *_ in lines:
            if p == "reward":  # the answers are checked in the verifier's own process: not this process's CPU time
                continue
            C.record(f"P7 {arm} {p}", f"CPU RL step, new ÷ old loop ({arm}, {p})", ratios.get((arm, p)),
                     "<= 0.333" if p == "total" else None, details)


if __name__ == "__main__":
    t0 = time.perf_counter()
    main()
    print(f"({time.perf_counter() - t0:.0f} s)")
