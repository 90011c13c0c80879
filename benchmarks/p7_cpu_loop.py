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

``--floor`` then puts the step against its arithmetic: each side's FLOPs per phase (``torch.utils.flop_counter``:
matrix products and attention, the CPU flash attention counted by this script's formulas; element-wise work
not counted), the floor those FLOPs set at this thread's best float32 matrix-product rate over the loop's
shapes, and the CPU seconds the new loop spends inside its matrix-product and attention kernels (torch
profiler), each against the new step's median time and the goal (the old step's ÷ 3).
"""

from __future__ import annotations

import argparse
import contextlib
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


@contextlib.contextmanager
def _loop(lean: bool):
    """One side's loop: the ``engines.fastpath`` switches in ``FLAGS`` all on (new) or all off (old, with the old
    sampler); restored on the way out."""
    from tandem_rlvr.engines import fastpath
    from tandem_rlvr.engines import types as types_mod

    prev, prev_draw = {f: getattr(fastpath, f) for f in FLAGS}, types_mod.draw
    for f in FLAGS:
        setattr(fastpath, f, lean)
    if not lean:
        types_mod.draw = _multinomial
    try:
        yield
    finally:
        for f, v in prev.items():
            setattr(fastpath, f, v)
        types_mod.draw = prev_draw


def _run(world, arm: str, plan, steps: int, lean: bool, wrap) -> list:
    """``steps`` RL steps of one side, the trainer's ``rollout``, ``rewards``, ``update`` and ``train_step`` and
    its no-grad ``sequence_logps`` calls (the scoring) wrapped by ``wrap(fn, phase)``; returns each step's
    (reward mean, loss, mean response length)."""
    from tandem_rlvr.training import trainer as trainer_mod

    prev_logps = trainer_mod.sequence_logps
    scoring = wrap(prev_logps, "scoring")

    def logps(*args, **kw):  # the update's own forward (under autograd) is counted in the update
        return (prev_logps if torch.is_grad_enabled() else scoring)(*args, **kw)
    trainer_mod.sequence_logps = logps
    try:
        with _loop(lean), tempfile.TemporaryDirectory() as d:
            tr = _trainer(world, arm, plan, Path(d) / "run")
            tr.cfg.algo.old_logps = "auto" if lean else "recompute"
            if not lean:  # the old demo config: one update chunk per mini-batch
                tr.cfg.algo.micro_batch = 0
            for name, phase in (("rollout", "rollout"), ("rewards", "reward"), ("update", "update"),
                                ("train_step", "total")):
                setattr(tr, name, wrap(getattr(tr, name), phase))
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
        trainer_mod.sequence_logps = prev_logps
    return seen


def _side(world, arm: str, plan, steps: int, lean: bool) -> tuple[dict, list]:
    """CPU seconds per phase summed over ``steps`` steps, and each step's (reward mean, loss, mean length).

    CPU time of this single-threaded process, not wall time: on a machine shared with other jobs the
    wall clock also counts the time the scheduler gave to them. The update's time is ``update`` less the
    scoring inside it.
    """
    out = {p: 0.0 for p in PHASES}

    def timed(fn, phase):
        def call(*args, **kw):
            c0 = time.process_time()
            try:
                return fn(*args, **kw)
            finally:
                out[phase] += time.process_time() - c0
        return call

    seen = _run(world, arm, plan, steps, lean, timed)
    out["update"] -= out["scoring"]
    return out, seen


MATMUL_SHAPES = ((64, 96, 192), (64, 96, 640), (64, 320, 96), (64, 96, 495),  # (rows, in, out): a decode step
                 (4096, 96, 192), (4096, 96, 640), (4096, 320, 96), (4096, 96, 495))  # a teacher-forced forward
KERNELS = ("aten::mm", "aten::bmm", "aten::addmm", "aten::baddbmm", "aten::_scaled_dot_product_flash_attention_for_cpu")


def _count_cpu_attention() -> None:
    """Let ``FlopCounterMode`` count PyTorch's CPU flash attention, forward and backward, as it counts the CUDA
    kernels (torch 2.13 counts no CPU attention): the score and value products, ``2 · 2·B·H·Lq·Lk·D``."""
    from torch.utils import flop_counter as fc

    fwd, bwd = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu, \
        torch.ops.aten._scaled_dot_product_flash_attention_for_cpu_backward
    if fwd in fc.flop_registry:
        return
    fc.register_flop_formula(fwd)(lambda q, k, v, *a, out_shape=None, **kw: fc.sdpa_flop_count(q, k, v))
    fc.register_flop_formula(bwd)(lambda g, q, k, v, *a, out_shape=None, **kw: fc.sdpa_backward_flop_count(g, q, k, v))


def _flops(world, arm: str, plan, steps: int, lean: bool) -> dict:
    """Floating-point operations per phase over ``steps`` steps of one side: matrix products and attention, as
    ``torch.utils.flop_counter`` counts them (element-wise work is not counted). The update's count is the
    ``update`` call's less the scoring inside it."""
    from torch.utils.flop_counter import FlopCounterMode

    _count_cpu_attention()
    out = {p: 0 for p in PHASES}

    def counted(fn, phase):
        def call(*args, **kw):
            with FlopCounterMode(display=False) as fc:  # nested counters: the outer one counts the inner's ops too
                result = fn(*args, **kw)
            out[phase] += fc.get_total_flops()
            return result
        return call

    _run(world, arm, plan, steps, lean, counted)
    out["update"] -= out["scoring"]
    return out


def _kernel_seconds(world, arm: str, plan, steps: int) -> float:
    """CPU seconds that ``steps`` steps of the new loop spend inside the ``KERNELS`` (matrix products and
    attention; torch.profiler's self time of those ops)."""
    from torch.profiler import ProfilerActivity, profile

    seconds = [0.0]

    def profiled(fn, phase):
        if phase != "total":
            return fn

        def call(*args, **kw):
            with profile(activities=[ProfilerActivity.CPU]) as prof:
                result = fn(*args, **kw)
            seconds[0] += sum(e.self_cpu_time_total for e in prof.key_averages() if e.key.startswith(KERNELS)) / 1e6
            return result
        return call

    _run(world, arm, plan, steps, True, profiled)
    return seconds[0]


def _matmul_rate(reps: float = 2e8) -> float:
    """This thread's best float32 GFLOP/s over ``MATMUL_SHAPES`` (the loop's matrix products), each shape timed
    over ~``reps`` operations after a warm-up."""
    best = 0.0
    for m, k, n in MATMUL_SHAPES:
        a, b = torch.randn(m, k), torch.randn(k, n)
        calls = max(3, int(reps // (2 * m * k * n)))
        for _ in range(3):
            a @ b
        c0 = time.process_time()
        for _ in range(calls):
            a @ b
        best = max(best, 2 * m * k * n * calls / max(time.process_time() - c0, 1e-9) / 1e9)
    return best


def _floor(world, arms: list[str], plan, steps: int, times: dict, write: bool) -> None:
    """Each arm's arithmetic floor (its counted FLOPs at this thread's best matrix-product rate) and the new
    loop's seconds in the matrix-product and attention kernels, against its measured step and the goal (1/3
    of the old step)."""
    rate = _matmul_rate()
    print(f"P7 floor: best float32 matrix-product rate over the loop's shapes {rate:.0f} GFLOP/s (one thread)")
    for arm in arms:
        old = statistics.median(t[0] for t in times[(arm, "total")]) / steps
        new = statistics.median(t[1] for t in times[(arm, "total")]) / steps
        f_old, f_new = (_flops(world, arm, plan, steps, lean) for lean in (False, True))
        kern = _kernel_seconds(world, arm, plan, steps) / steps
        floor = f_new["total"] / steps / rate / 1e9
        phases = ", ".join(f"{p} {f_old[p] / steps / 1e9:.1f}→{f_new[p] / steps / 1e9:.1f}"
                           for p in ("rollout", "scoring", "update"))
        g_old, g_new = f_old["total"] / steps / 1e9, f_new["total"] / steps / 1e9
        line = (f"{arm}: GFLOP/step old→new {g_old:.1f}→{g_new:.1f} ({phases}), run at {g_old / old:.0f}→"
                f"{g_new / new:.0f} GFLOP/s; new step {new:.3f} s, its floor at {rate:.0f} GFLOP/s {floor:.3f} s, its "
                f"matrix-product and attention kernels {kern:.3f} s; the goal (old {old:.3f} s ÷ 3) {old / 3:.3f} s")
        print("P7 floor " + line, flush=True)
        if write:
            C.record(f"P7 floor {arm}", f"CPU RL step ({arm}): new loop ÷ its arithmetic floor", [new / floor], None,
                     f"{steps} step(s) per side; {line}; FLOPs as torch.utils.flop_counter counts them (matrix "
                     "products and attention, each side over its own tokens), element-wise work not counted")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="one step per side, 2 repeats, trlvr and kl_reg")
    ap.add_argument("--steps", type=int, default=2, help="RL steps per side and repeat")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--arms", default="trlvr,grpo,kl_reg@0.1")
    ap.add_argument("--no-write", action="store_true", help="print only; do not append to RESULTS.md")
    ap.add_argument("--floor", action="store_true", help="then each arm's arithmetic floor (its FLOPs at this "
                    "thread's matrix-product rate) and the new loop's seconds in matrix-product and attention kernels")
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
    if a.floor:
        _floor(world, arms, plan, a.steps, times, not a.no_write)


if __name__ == "__main__":
    t0 = time.perf_counter()
    main()
    print(f"({time.perf_counter() - t0:.0f} s)")
