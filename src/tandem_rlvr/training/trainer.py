"""The training loop, and nothing else: rollout → reward → old log-probs → PPO updates → log → save.

The formulas live in :mod:`tandem_rlvr.training.core`; the arms differ only in three choices made in
:func:`arm_plan`: the rollout schedule, the loss mask and the KL weight. Every step's randomness
(data order, sampling, handoff coins) is a pure function of ``(train.seed, step)``, so a resumed
run continues exactly where an uninterrupted one would be.
"""

from __future__ import annotations

import contextlib
import logging
import math
import time
from pathlib import Path

import numpy as np
import torch

from tandem_rlvr.config import Config
from tandem_rlvr.engines.base import PromptBatch
from tandem_rlvr.engines import fastpath
from tandem_rlvr.engines.scoring import drops_out, read_prompts, routes_experts, sequence_logps
from tandem_rlvr.engines.types import Rollout, Sampling, concat_rollouts
from tandem_rlvr.errors import TandemError
from tandem_rlvr import logs, trackers
from tandem_rlvr.io import append_jsonl
from tandem_rlvr.training import checkpoint as ckpt_mod
from tandem_rlvr.training import core, dist, fsdp, preempt, rundir
from tandem_rlvr.training.arms import arm_plan, check_senior_frac, loss_mask
from tandem_rlvr.training.build import RunParts, build_run
from tandem_rlvr.training.ownership import check_ownership
from tandem_rlvr.seeds import derive_seed

log = logging.getLogger(__name__)


class Trainer:
    """Runs one training run to the end (:meth:`train`) over the parts :func:`~tandem_rlvr.training.build.build_run`
    made from the same config (:func:`make_trainer` does both)."""

    def __init__(self, cfg: Config, parts: RunParts):
        self.cfg = cfg
        self.run_dir = Path(cfg.train.out_dir)
        self.plan = arm_plan(cfg)
        if parts.schedule.name != self.plan.schedule:
            raise TandemError(f"the run's parts roll out under handoff schedule {parts.schedule.name!r}, but the config's arm "
                              f"({cfg.algo.arm}) needs {self.plan.schedule!r}: build them from this config (build_run(cfg))")
        self.acc, self.pair, self.senior, self.sharded = parts.acc, parts.pair, parts.senior, parts.sharded
        self.opt, self.sched, self.schedule, self.engine = parts.opt, parts.lr_sched, parts.schedule, parts.engine
        self.tok, self.junior, self.eos = parts.pair.tokenizer, parts.pair.junior, parts.eos
        self.bridge = parts.pair.junior_tokenizer is not None
        self.examples, self.prompts, self.prompt_example = parts.examples, parts.prompts, parts.prompt_example
        self.context, self.reward_fn, self.text_metrics = parts.context, parts.reward_fn, parts.text_metrics
        self.resume_from, self.lock = parts.resume_from, parts.lock  # the run directory's lock (main process)
        self.scorer = None
        self.step = 0
        self.nonfinite_run = 0
        self.best = {"val": None, "step": None}
        head = self.acc.unwrap_model(self.senior).get_output_embeddings()
        vocab = head.weight.shape[0] if head is not None else self.acc.unwrap_model(self.senior).config.vocab_size
        self.rows_per_forward = core.forward_rows(cfg.algo.micro_batch, cfg.rollout.max_new_tokens, vocab)

    # -- run directory and resume -------------------------------------------------------------
    def _resume(self) -> None:
        if self.resume_from is None:
            if self.acc.is_main_process:  # an unfinished attempt's files: the rerun writes them anew
                (self.run_dir / "metrics.jsonl").unlink(missing_ok=True)
                (self.run_dir / trackers.SAMPLES_FILE).unlink(missing_ok=True)
                ckpt_mod.cut_best_back(self.run_dir, 0)
            return
        state = ckpt_mod.load_checkpoint(self.resume_from, model=self.acc.unwrap_model(self.senior),
                                         optimizer=self.opt, scheduler=self.sched,
                                         sharded_main=self.acc.is_main_process if self.sharded else None,
                                         rank=self.acc.process_index, num_processes=self.acc.num_processes)
        self.step = int(state["step"])
        self.nonfinite_run = int(state.get("nonfinite_run", 0))
        self.best = state.get("best", self.best)
        self._push_to_engine()
        if self.acc.is_main_process:  # a kill between publishing a checkpoint and pruning left extras
            rundir.truncate_metrics(self.run_dir, self.step)
            rundir.truncate_metrics(self.run_dir, self.step, trackers.SAMPLES_FILE)
            ckpt_mod.prune(self.run_dir / "checkpoints", self.cfg.train.keep_last)
        best = {"metric": f"val/{self.cfg.val.select}", **self.best}  # best/ as an uninterrupted run has it here
        again = self.acc.is_main_process and ckpt_mod.cut_best_back(self.run_dir, self.step, best)
        again = dist.gather_objects(self.acc, again)[0]  # the main process's verdict: saving best/ is collective
        if again:
            self._save_model(self.run_dir / "best", {"best.json": again})
        log.info("resumed from %s at step %d", self.resume_from, self.step)

    # -- one step -------------------------------------------------------------------------------
    def _step_prompts(self, step: int) -> list[int]:
        """Indices of this step's prompts: epoch-wise seeded permutations, a pure function of step."""
        n, k = len(self.prompts), self.cfg.train.prompts_per_step
        start = step * k
        out = []
        while len(out) < k:
            epoch, offset = divmod(start + len(out), n)
            perm = np.random.default_rng([self.cfg.train.seed, epoch]).permutation(n)
            out.extend(perm[offset:offset + k - len(out)].tolist())
        return out

    def _local_prompts(self, step: int) -> list[tuple[int, int]]:
        """This process's ``(global position, prompt index)`` pairs for ``step``.

        Each PPO mini-batch of ``mini_batch_prompts`` prompts is split evenly over the processes, so
        every process owns whole groups (advantages stay local) and a mini-batch spans all processes.
        """
        k, n, r = self.cfg.mini_batch_prompts(), self.acc.num_processes, self.acc.process_index
        share = k // n
        order = self._step_prompts(step)
        return [(g, order[g]) for m in range(0, len(order), k) for g in range(m + r * share, m + (r + 1) * share)]

    def rollout(self, step: int) -> tuple[Rollout, list[int]]:
        """Generate ``group_size`` responses for each of this process's prompts of ``step``.

        Generation runs in chunks of ``rollout.batch_size`` rollouts (default: one chunk per process
        and mini-batch); a chunk's padding and seed depend only on its global position, so the same
        global batch gives the same rollouts whatever the number of processes.
        """
        cfg, G = self.cfg, self.cfg.algo.group_size
        local = self._local_prompts(step)
        chunk_prompts = max(1, (cfg.rollout.batch_size // G) if cfg.rollout.batch_size else len(local))
        sampling = Sampling(cfg.rollout.max_new_tokens, cfg.rollout.temperature, cfg.rollout.top_p, cfg.rollout.top_k)
        senior = self.acc.unwrap_model(self.senior)
        senior.eval()
        with contextlib.nullcontext() if self.engine.own_weights else fsdp.gathered(senior):  # vLLM: its own copy
            return self._rollout_chunks(local, chunk_prompts, sampling, step)

    def _rollout_chunks(self, local, chunk_prompts: int, sampling: Sampling, step: int):
        """Every chunk of this process's prompts, in one engine call (vLLM batches them; each keeps its seeds)."""
        cfg, G = self.cfg, self.cfg.algo.group_size
        batches, idx = [], []
        for c in range(0, len(local), chunk_prompts):
            chunk = local[c:c + chunk_prompts]
            rows = [i for _, i in chunk for _ in range(G)]
            prompts = PromptBatch.left_padded([self.prompts[i] for i in rows], self.tok.pad_token_id, self.acc.device,
                                              [self.examples[self.prompt_example[i]].problem for i in rows])
            batches.append((prompts, _step_seed(cfg.train.seed, step) + chunk[0][0]))
            idx.extend(rows)
        try:
            parts = self.engine.generate_many(batches, self.schedule, sampling)
        except RuntimeError as e:
            if "probability tensor" not in str(e):
                raise
            raise TandemError(f"non-finite logits while sampling the rollout of step {step + 1} "
                              f"(senior {cfg.model.senior!r} or junior {cfg.model.junior!r}): the weights "
                              "hold NaN/inf or the dtype overflows; try model.dtype=float32") from None
        return concat_rollouts(parts, self.tok.pad_token_id), idx

    def rewards(self, texts: list[str], idx: list[int]) -> tuple[torch.Tensor, dict]:
        """Score every co-written response against its gold answer."""
        golds = [self.examples[self.prompt_example[i]].answer for i in idx]
        if self.reward_fn is not None:
            vals, stats = [float(self.reward_fn(t, g)) for t, g in zip(texts, golds)], {}
        elif self.scorer is not None:  # train() keeps one open for the whole run
            vals, stats = self.scorer.score(texts, golds)
        else:
            with self._scorer() as scorer:
                vals, stats = scorer.score(texts, golds)
        out = torch.tensor(vals, dtype=torch.float)
        if not torch.isfinite(out).all():
            name = getattr(self.reward_fn, "__name__", None) or self.cfg.data.reward
            raise TandemError(f"reward function {name!r} returned a non-finite reward for "
                              f"{int((~torch.isfinite(out)).sum())} of {len(vals)} responses")
        return out, stats

    def update(self, rollout: Rollout, adv_B: torch.Tensor, step: int) -> dict:
        """PPO mini-batch updates on this step's rollouts; returns averaged metrics."""
        cfg, plan, G = self.cfg, self.plan, self.cfg.algo.group_size
        senior = self.acc.unwrap_model(self.senior)
        temp = cfg.rollout.temperature
        t0 = time.perf_counter()
        with torch.no_grad():
            senior.eval()
            old = self._old_logps(senior, rollout)
            junior_lp = rollout.junior_logps_BT
            if junior_lp is None and self.junior is not None and not self.bridge:  # other vocabulary: no per-token KL
                junior_lp = sequence_logps(self.junior, rollout, temp, self.rows_per_forward)
        mask = loss_mask(rollout, plan, reduce=lambda x: dist.reduce_scalar(self.acc, x, "sum"))
        # the drift compares like with like: log-probs the engine recorded for both models while decoding (under
        # mixed precision ``old`` is a teacher-forced forward, another computation than the junior's recorded one)
        recorded = rollout.junior_logps_BT is not None and rollout.logps_recorded
        metrics = self._drift_metrics(rollout.senior_logps_BT if recorded else old, junior_lp, rollout)
        metrics["time/score_s"] = time.perf_counter() - t0  # teacher-forced old (and junior) log-probs
        senior.train()
        mb = cfg.mini_batch_prompts() * G // self.acc.num_processes
        acc_metrics: list[dict] = []
        device = rollout.response_mask_BT.device  # the rewards' advantages are a CPU tensor; rows index both
        adv_B = adv_B.to(device)
        for _ in range(cfg.algo.ppo_epochs):
            for m in range(0, rollout.batch_size, mb):
                rows = torch.arange(m, min(m + mb, rollout.batch_size), device=device)
                acc_metrics.append(self._minibatch(rollout, rows, old, junior_lp, adv_B, mask))
        metrics.update(core.merge_metrics(acc_metrics))  # token means weighted by each mini-batch's tokens
        metrics["train/lr"] = self.sched.get_last_lr()[0]
        return metrics

    def _old_logps(self, senior, rollout: Rollout) -> torch.Tensor:
        """The PPO ratio's old log-probs (``algo.old_logps``): the rollout's own where the engine recorded
        them, else one teacher-forced pass of the senior."""
        choice, recorded = self.cfg.algo.old_logps, rollout.logps_recorded
        # float32 compute (float32 weights, no mixed precision from the run or the launch config): a KV-cached
        # decode and a teacher-forced forward then differ by float order only, not by two bf16 computations
        f32 = self.cfg.model.dtype == "float32" and self.acc.mixed_precision == "no"
        if choice == "rollout" and not recorded:
            raise TandemError("algo.old_logps=rollout, but the rollout engine recorded no log-probs "
                              f"(rollout.engine={self.cfg.rollout.engine}, bridge={self.bridge}): use recompute or auto")
        if choice == "rollout" or (choice == "auto" and recorded and f32):
            return rollout.senior_logps_BT
        return sequence_logps(senior, rollout, self.cfg.rollout.temperature, self.rows_per_forward)

    def _minibatch(self, rollout, rows, old, junior_lp, adv_B, mask) -> dict:
        cfg, plan, n_proc = self.cfg, self.plan, self.acc.num_processes
        n_tok = dist.reduce_scalar(self.acc, float(mask[rows].sum()), "sum")
        max_len = int(dist.reduce_scalar(self.acc, float(rollout.response_mask_BT[rows].sum(-1).max()), "max"))
        n_rows = len(rows)  # the chunks' shares count every row, also those left out below
        if fastpath.SKIP_ZERO_ADVANTAGE and n_proc == 1 and not drops_out(self.senior) and not routes_experts(self.senior):
            rows = core.rows_with_gradient(adv_B, rows, plan.kl_beta)  # DDP would need a backward per process
        micro = min(self.rows_per_forward, cfg.algo.micro_batch or len(rows))  # within the logits budget
        if 1 < micro < len(rows):  # chunks of similar length: each forward is cut to its own longest response
            rows = rows[torch.argsort(rollout.response_mask_BT[rows].sum(-1), stable=True)]
        chunks = [rows[i:i + micro] for i in range(0, len(rows), micro)]
        self.opt.zero_grad(set_to_none=True)
        prefix = read_prompts(self.senior, rollout, rows, max_prompts=micro) if n_proc == 1 else None
        parts = []
        for i, r in enumerate(chunks):
            # the forward too: DDP decides in the forward whether the backward all-reduces
            with dist.no_sync_unless_last(self.acc, self.senior, i == len(chunks) - 1):
                logps = sequence_logps(self.senior, rollout, cfg.rollout.temperature, rows=r, prefix=prefix)
                loss, met = core.policy_loss(
                    logps, old[r], adv_B[r], mask[r], loss_type=cfg.algo.loss_type, clip_eps=cfg.algo.clip_eps,
                    clip_eps_high=cfg.algo.clip_eps_high, kl_beta=plan.kl_beta,
                    ref_logps_BT=junior_lp[r] if plan.kl_beta > 0 else None,
                    num_tokens=n_tok, max_len=max_len, kl_clamp=cfg.algo.kl_clamp or None, allow_empty=True,
                )
                weight, share = core.chunk_weight(cfg.algo.loss_type, len(r), n_rows, n_proc)
                self.acc.backward(loss * weight)
            met = {k: _num(v) for k, v in met.items()}
            parts.append(met | {"train/loss": _num(loss) * share, "train/pg_loss": met.get("train/pg_loss", 0.0) * share})
        if prefix is not None:
            prefix.backward()  # the prompts' share of the gradient, once for all chunks
        grad_norm = self._clip_and_step()
        out = core.merge_metrics(parts, summed={"train/loss", "train/pg_loss", "train/num_tokens"})  # chunks add up
        if len(rows) < n_rows:  # rows left out (one process): their tokens still count
            out["train/num_tokens"] = n_tok
        scale = core.process_scale(cfg.algo.loss_type, n_proc)  # pg_loss is averaged over processes in reduce_row
        out["train/loss"] = dist.reduce_scalar(self.acc, out["train/loss"], "mean") * scale
        out["train/pg_loss"] *= scale
        out["train/grad_norm"] = grad_norm
        return out

    def _drift_metrics(self, old_BT: torch.Tensor, junior_BT: torch.Tensor | None, rollout: Rollout) -> dict:
        """Token means over senior-written tokens (global over processes) of log p_s - log p_j and k3."""
        if junior_BT is None:
            return {}
        sm = rollout.response_mask_BT.float() * rollout.owner_BT.float()
        n = max(1.0, dist.reduce_scalar(self.acc, float(sm.sum()), "sum"))
        mc = dist.reduce_scalar(self.acc, float(((old_BT - junior_BT) * sm).sum()), "sum")
        k3_BT = core.k3_kl(old_BT, junior_BT, self.cfg.algo.kl_clamp or None)
        k3 = dist.reduce_scalar(self.acc, float((k3_BT * sm).sum()), "sum")
        return {"kl/senior_junior": mc / n, "kl/senior_junior_k3": k3 / n}

    def _clip_and_step(self) -> float:
        params = [p for p in self.senior.parameters() if p.requires_grad]
        max_norm = self.cfg.algo.max_grad_norm or float("inf")
        norm = float(self.acc.clip_grad_norm_(params, max_norm))
        if not math.isfinite(norm):
            scaler = getattr(self.opt, "scaler", None)
            if scaler is not None:  # fp16: its loss scaler skips the step and lowers the scale itself (it has
                self.opt.step()  # unscaled these gradients: it must reach update() before the next unscale)
            self.opt.zero_grad(set_to_none=True)
            if scaler is not None and scaler.get_scale() >= 1.0:  # an overflow the scaler absorbs: not non-finite
                log.info("fp16 gradient overflow (norm=%s): update skipped, loss scale now %g", norm, scaler.get_scale())
                return norm
            self.nonfinite_run += 1
            log.warning("non-finite gradient (norm=%s): update skipped (%d in a row)", norm, self.nonfinite_run)
            return norm
        self.nonfinite_run = 0
        self.opt.step()
        self.opt.zero_grad(set_to_none=True)
        return norm

    def _push_to_engine(self) -> None:
        """Give the rollout engine the senior's current weights (engines with their own copy load them)."""
        self.engine.sync_senior(self.acc.unwrap_model(self.senior))

    def train_step(self, step: int) -> dict:
        """One full step; returns its metrics row."""
        t0 = time.perf_counter()
        rollout, idx = self.rollout(step)
        self.engine.sleep()  # rollout.vllm_sleep: its memory goes to the update until the push
        t1 = time.perf_counter()
        owned = {}
        if self.plan.mask_owner:  # fail closed on a lost or wrong ownership mask (tandem_rlvr.training.ownership)
            owned = check_ownership(rollout, self.schedule, self.cfg.rollout.max_new_tokens,
                                    reduce=lambda v: dist.reduce_scalar(self.acc, v, "sum"))
        senior_tok = float((rollout.owner_BT * rollout.response_mask_BT).sum())
        frac = dist.reduce_scalar(self.acc, senior_tok, "sum") / max(
            1.0, dist.reduce_scalar(self.acc, float(rollout.response_mask_BT.sum()), "sum"))
        if self.plan.mask_owner:
            check_senior_frac(frac, self.cfg.senior_band(), self.schedule)
        texts = rollout.texts(self.tok)
        rewards, rstats = self.rewards(texts, idx)
        self._log_samples(rollout, idx, rewards, step + 1)
        if self.text_metrics is not None:
            rstats = {**rstats, **self.text_metrics(texts)}
        adv, ametrics = core.group_advantages(rewards, self.cfg.algo.group_size, normalize_std=self.cfg.algo.normalize_std)
        t2 = time.perf_counter()
        metrics = self.update(rollout, adv, step)
        self.sched.step()
        self._push_to_engine()
        t3 = time.perf_counter()
        row = {"step": step + 1, **{k: float(v) for k, v in ametrics.items()}, **rstats, **metrics}
        row.update({
            "rollout/senior_token_frac": frac,
            "rollout/response_len": float(rollout.response_mask_BT.sum(-1).float().mean()),
            "rollout/rounds_mean": float(rollout.rounds_B.float().mean()),
            "rollout/finished_frac": float(rollout.finished_B.float().mean()),
            "train/nonfinite_run": self.nonfinite_run,
            "dist/num_processes": self.acc.num_processes,
            "time/rollout_s": t1 - t0, "time/reward_s": t2 - t1, "time/update_s": t3 - t2, "time/step_s": t3 - t0,
        })
        all_r = self.acc.gather(rewards.to(self.acc.device)).float()
        row = dist.reduce_row(self.acc, row)
        row.update({**owned, "rollout/senior_token_frac": frac, "reward/mean": float(all_r.mean()),
                    "reward/std": float(all_r.std()) if all_r.numel() > 1 else 0.0})
        return row

    def _log_samples(self, rollout: Rollout, idx: list[int], rewards: torch.Tensor, step: int) -> None:
        """``train.log_samples`` of this process's rollouts of ``step`` to samples.jsonl and the trackers (main
        process, every ``train.log_every`` steps and at the last)."""
        t = self.cfg.train
        if not (t.log_samples and self.acc.is_main_process and (step % t.log_every == 0 or step == t.steps)):
            return
        info = [{"problem_id": str(getattr(ex, "id", "")), "problem": ex.problem, "gold": str(ex.answer)}
                for ex in (self.examples[self.prompt_example[i]] for i in idx)]
        rows = trackers.sample_rows(rollout, self.tok, step, t.log_samples, self.cfg.algo.group_size, info, rewards)
        trackers.write_samples(self.run_dir, rows)
        if t.trackers:
            trackers.log_samples(self.acc, rows, step)

    # -- the loop -------------------------------------------------------------------------------
    def train(self) -> Path:
        """Run (or resume) to ``train.steps``; returns the ``final/`` directory. Progress: a bar on a terminal,
        else one line every ``train.log_every`` steps (:func:`tandem_rlvr.logs.progress`)."""
        self._resume()
        cfg = self.cfg
        if self.acc.is_main_process and cfg.train.trackers:
            trackers.start(self.acc, cfg, self.step)
        bar = logs.progress(cfg.train.steps, f"train {cfg.algo.arm}", unit="step", initial=self.step,
                            enabled=cfg.train.progress and self.acc.is_main_process, every=cfg.train.log_every)
        guard = preempt.RunGuard(self)  # signals, watchdog, heartbeats: see tandem_rlvr.training.preempt
        with self._scorer() as scorer, guard.running():
            self.scorer = scorer
            try:
                while self.step < cfg.train.steps:
                    row = self.train_step(self.step)
                    self.step += 1
                    guard.beat(f"logging, validating and saving step {self.step}")
                    self._after_step(row)
                    guard.after_step()
                    bar.set_postfix(refresh=False, **headline(row))
                    bar.update(1)
            finally:
                self.scorer = None
        bar.close()
        return self._finish()

    def _scorer(self):
        if self.reward_fn is not None:
            return contextlib.nullcontext()
        from tandem_rlvr.rewards import RewardScorer

        c = self.cfg.data
        return RewardScorer(c.reward, time_limit=c.reward_timeout_s, num_workers=c.reward_workers)

    def _after_step(self, row: dict) -> None:
        cfg = self.cfg
        if cfg.val.every and self.step % cfg.val.every == 0:
            row.update(self.validate())
        if self.acc.is_main_process:
            append_jsonl(self.run_dir / "metrics.jsonl", row)
            if cfg.train.trackers:
                self.acc.log(row, step=self.step)
        if self.nonfinite_run >= cfg.train.max_nonfinite:
            self.save()
            self.acc.wait_for_everyone()  # no process exits (and has the launcher kill the writer) before it is written
            raise TandemError(f"{self.nonfinite_run} non-finite updates in a row at step {self.step}; "
                              f"stopped with a checkpoint in {self.run_dir / 'checkpoints'}")
        if cfg.train.save_every and self.step % cfg.train.save_every == 0 and self.step < cfg.train.steps:
            self.save()

    def validate(self) -> dict:
        """Solo validation of the senior (as the paper does); tracks the best checkpoint."""
        from accelerate.utils import gather_object

        from tandem_rlvr.evaluation.validation import validate as run_val

        cfg, senior, own = self.cfg, self.acc.unwrap_model(self.senior), self.engine.own_weights
        with contextlib.nullcontext() if own else fsdp.gathered(senior):  # vLLM: its own copy, no gather
            metrics = run_val(senior, self.tok, cfg, step=self.step, reward_fn=self.reward_fn,
                              engine=self.engine if own else None, shard=(self.acc.process_index, self.acc.num_processes),
                              gather=lambda chains: [c for part in gather_object([chains]) for c in part])
        if self.acc.num_processes > 1:  # every process takes the main one's verdict (saving best/ is collective)
            from accelerate.utils import broadcast_object_list

            metrics = broadcast_object_list([metrics])[0]
        key = f"val/{cfg.val.select}"
        if key not in metrics:
            raise TandemError(f"validation did not compute {key} (val.select={cfg.val.select}, val.n={cfg.val.n})")
        if improves(self.best["val"], metrics[key]):
            self.best = {"val": metrics[key], "step": self.step, "metric": key}
            self._save_model(self.run_dir / "best", {"best.json": {"metric": key, "value": metrics[key], "step": self.step}})
        return metrics

    def _save_model(self, out_dir: Path, extra_json: dict | None = None) -> None:
        """The senior as a plain HF directory (with ``extra_json`` files inside), written by the main process
        (gathered by all if sharded)."""
        senior = self.acc.unwrap_model(self.senior)
        state = fsdp.full_model_state(senior) if self.sharded else None
        if self.acc.is_main_process:
            ckpt_mod.save_model(senior, self.tok, out_dir, state_dict=state, extra_json=extra_json)

    def save(self) -> Path | None:
        """Checkpoint the current step (written by the main process; a sharded senior is gathered by all)."""
        senior = self.acc.unwrap_model(self.senior)
        states = {}
        if self.sharded:
            states = {"model_state": fsdp.full_model_state(senior), "optim_state": fsdp.full_optim_state(senior, self.opt)}
        states["rng_states"] = dist.gather_objects(self.acc, ckpt_mod.rng_state())  # every process's own
        if not self.acc.is_main_process:
            return None
        return ckpt_mod.save_checkpoint(
            self.run_dir, self.step, model=senior, tokenizer=self.tok,
            optimizer=self.opt, scheduler=self.sched, keep_last=self.cfg.train.keep_last,
            trainer_state={"nonfinite_run": self.nonfinite_run, "best": self.best, "arm": self.cfg.algo.arm}, **states,
        )

    def _finish(self) -> Path:
        self.acc.wait_for_everyone()
        final = self.run_dir / "final"
        if self.cfg.train.save_every:
            self.save()
        self._save_model(final)
        if self.cfg.train.trackers:
            self.acc.end_training()
        return final


def headline(row: dict) -> dict:
    """The main metrics of a step's row, formatted for the progress bar or line."""
    out = {"reward": f"{row['reward/mean']:.3f}", "senior": f"{row['rollout/senior_token_frac']:.2f}"}
    for key, name, fmt in (("train/loss", "loss", ".4g"), ("kl/senior_junior", "kl", ".3g")):
        if isinstance(row.get(key), (int, float)):
            out[name] = format(row[key], fmt)
    val = next((k for k in row if k.startswith("val/")), None)
    if val is not None and isinstance(row[val], (int, float)):
        out[val] = f"{row[val]:.3f}"
    return out


def _num(v) -> float:
    return float(v.detach()) if torch.is_tensor(v) else float(v)


def _step_seed(seed: int, step: int) -> int:
    return derive_seed(seed, step)


def improves(best: float | None, value: float) -> bool:
    """Whether a validation ``value`` replaces the ``best`` so far (strictly better: ties keep the earlier step)."""
    return best is None or value > best


def best_step(rows, metric: str) -> tuple[int | None, float | None]:
    """The step and value :class:`Trainer` keeps in ``best/`` for the validation rows of a ``metrics.jsonl``."""
    best, step = None, None
    for row in rows:
        if metric in row and improves(best, row[metric]):
            best, step = row[metric], row["step"]
    return step, best


def make_trainer(cfg: Config, **kw) -> Trainer:
    """A :class:`Trainer` over :func:`~tandem_rlvr.training.build.build_run` ``(cfg, **kw)`` (its keyword
    arguments: ``plan``, ``pair``, ``examples``, ``reward_fn``, ``restart``, ``text_metrics``, ``vllm_engine``)."""
    return Trainer(cfg, build_run(cfg, **kw))


def train(cfg: Config, *, restart: bool = False, **kw) -> Path:
    """Train one run from a config; resumes from the newest checkpoint of ``train.out_dir``. The run directory
    stays locked until the run ends (:mod:`tandem_rlvr.runlock`)."""
    trainer = make_trainer(cfg, restart=restart, **kw)
    try:
        return trainer.train()
    finally:
        if trainer.lock is not None:
            trainer.lock.release()
