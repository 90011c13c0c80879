"""Evaluation (METHOD.md §5): solo, step handoff, communication tax, handoff-rate curve, legibility, drift.

For each benchmark and senior:

1. **solo**: the senior alone, ``n`` samples per problem, unbiased pass@k;
2. **handoff**: the engine's ``alternate`` schedule (senior writes the first ``"\\n\\n"`` step, then
   strict alternation), one shared budget, at most 150 rounds; the team answer is graded;
3. **communication tax** = solo pass@1 − handoff pass@1, in points;
4. **handoff-rate curve**: pass@1 of word-level tandem generation at P(senior) = p;
5. **legibility**: the junior's per-token cross-entropy (nats) and top-1 accuracy on the senior's solo
   chains, teacher-forced after the same prompt; averaged per chain, then per benchmark, then macro;
   plus CE by relative token position (deciles);
6. **drift**: per-token KL(senior ‖ junior) on the solo chains at temperature 1: Monte-Carlo
   (``log p_s − log p_j`` of the sampled token) and exact (full vocabulary), chain-averaged like CE.
   The MC value is an unbiased estimate of the exact one only when the chains are sampled from the
   senior at temperature 1 without top-k/top-p; with the eval decoding (0.7 / 0.8 / 20) read the
   exact value as the drift and the MC value as the estimator the trainer logs.

Every mode of a benchmark uses the *same* per-batch seeds (common random numbers): the handoff chains
start with the very tokens the solo chains start with, which lowers the variance of the tax, and
word-level tandem at p = 1 is token-for-token the solo run, so the curve's p = 1 point reuses it.
Results are a pure function of (models, data, seed, batch size) on CPU.

The command line (``tandem-rlvr eval``) lives in :mod:`tandem_rlvr.evaluation.eval_cli`, which calls this module.
"""

from __future__ import annotations

import logging
import weakref
import zlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace

import torch

from tandem_rlvr.evaluation import metrics as M
from tandem_rlvr.config import eval_default
from tandem_rlvr.data import encode_prompts
from tandem_rlvr.engines.base import PromptBatch
from tandem_rlvr.engines.inprocess import InProcessEngine
from tandem_rlvr.engines.handoff import make_schedule
from tandem_rlvr.engines.scoring import teacher_inputs
from tandem_rlvr.engines.types import Rollout, Sampling

log = logging.getLogger(__name__)

# The evaluation's defaults are tandem_rlvr.config.EvalOptions's (documented there, once).
EVAL_TEMPERATURE, EVAL_TOP_P, EVAL_TOP_K = (eval_default(k) for k in ("temperature", "top_p", "top_k"))
EVAL_MAX_NEW_TOKENS = eval_default("max_new_tokens")
EVAL_CONTEXT = eval_default("context")
MAX_ROUNDS = eval_default("max_rounds")
CURVE_PS = tuple(eval_default("curve_ps"))
EVAL_N, EVAL_SEED, EVAL_BATCH_SIZE = (eval_default(k) for k in ("n", "seed", "batch_size"))
EVAL_CHUNK_TOKENS, EVAL_SCORE_BATCH = eval_default("chunk_tokens"), eval_default("score_batch")

__all__ = [
    "CURVE_PS", "MAX_ROUNDS", "chain_scores", "drift_kl", "encode_prompts", "eval_sampling",
    "evaluate_pair", "junior_legibility", "open_scorer", "solo_eval", "validate",
]


def eval_sampling(max_new_tokens: int = EVAL_MAX_NEW_TOKENS, temperature: float = EVAL_TEMPERATURE,
                  top_p: float = EVAL_TOP_P, top_k: int = EVAL_TOP_K) -> Sampling:
    """The evaluation decoding of METHOD §5 (temperature 0.7, top_p 0.8, top_k 20, 3000 tokens)."""
    return Sampling(max_new_tokens=max_new_tokens, temperature=temperature, top_p=top_p, top_k=top_k)


# ---------------------------------------------------------------------------------------------------
# Teacher-forced scoring: junior CE / top-1 and KL(senior || junior), batched and chunked over tokens
# ---------------------------------------------------------------------------------------------------

_SPLIT_OK: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def model_device(model) -> torch.device:
    return next(iter(model.parameters())).device


def _split_head(model):
    """``(decoder, head)`` if ``head(decoder(x).last_hidden_state)`` equals ``model(x).logits``, else None.

    Checked once per model on a short input; models without the split (or with extra logit
    transforms it would miss) fall back to full-logit forwards one row at a time.
    """
    try:
        dec, head = model.get_decoder(), model.get_output_embeddings()
    except Exception:  # e.g. the LoRA adapter-off junior wrapper
        return None
    if dec is model or head is None:
        return None
    ok = _SPLIT_OK.get(model)
    if ok is None:
        try:
            x = (torch.arange(1, 7, device=model_device(model)) % head.weight.shape[0])[None]
            ref = model(input_ids=x, use_cache=False).logits[0].float()
            got = head(dec(input_ids=x, use_cache=False).last_hidden_state)[0].float()
            ok = bool(torch.allclose(ref, got, rtol=1e-3, atol=1e-3 * max(1.0, float(ref.abs().max()))))
        except Exception:
            ok = False
        _SPLIT_OK[model] = ok
    return (dec, head) if ok else None


class LogitSource:
    """Logits of one model at arbitrary (row, column) positions of a teacher-forced batch.

    Fast path: one decoder forward for the batch, then the LM head on chunks of gathered hidden
    states (memory ∝ chunk × vocab). Fallback: one full forward per row, one row kept at a time.
    """

    def __init__(self, model, ids, mask, pos):
        self.model, self.ids, self.mask, self.pos = model, ids, mask, pos
        self.split = _split_head(model)
        self.hidden = None
        self._row, self._row_logits = None, None
        if self.split is not None:
            dec, _ = self.split
            self.hidden = dec(input_ids=ids, attention_mask=mask, position_ids=pos, use_cache=False).last_hidden_state

    def logits(self, rows_N: torch.Tensor, cols_N: torch.Tensor) -> torch.Tensor:
        if self.split is not None:
            return self.split[1](self.hidden[rows_N, cols_N])
        out = []
        for r in torch.unique_consecutive(rows_N).tolist():
            if r != self._row:
                sl = slice(r, r + 1)
                self._row_logits = self.model(input_ids=self.ids[sl], attention_mask=self.mask[sl],
                                              position_ids=self.pos[sl], use_cache=False).logits[0]
                self._row = r
            out.append(self._row_logits[cols_N[rows_N == r]])
        return torch.cat(out)


def _teacher_batch(rollout: Rollout, rows: torch.Tensor):
    """Prompt + response of ``rows`` (:func:`~tandem_rlvr.engines.scoring.teacher_inputs`, trimmed) and the
    response-token coordinates: row, response column, input column that predicts it, target id; lengths."""
    ids, mask, pos = teacher_inputs(rollout, rows, trim=True)
    r_mask = rollout.response_mask_BT[rows].long()
    T = max(int(r_mask.sum(-1).max()), 1)
    r_ids, r_mask = rollout.response_ids_BT[rows, :T], r_mask[:, :T]
    b_N, t_N = r_mask.nonzero(as_tuple=True)
    cols_N = ids.shape[1] - T - 1 + t_N
    return ids, mask, pos, b_N, t_N, cols_N, r_ids[b_N, t_N], r_mask.sum(-1)


def _score_rows(senior, junior, rollout: Rollout, rows: torch.Tensor, chunk_tokens: int) -> dict:
    ids, mask, pos, b_N, t_N, cols_N, tgt_N, len_B = _teacher_batch(rollout, rows)
    j_src = LogitSource(junior, ids, mask, pos)
    s_src = LogitSource(senior, ids, mask, pos) if senior is not None else None
    parts: list[dict] = []
    for c in range(0, int(b_N.numel()), chunk_tokens):
        sl = slice(c, c + chunk_tokens)
        s_logits = s_src.logits(b_N[sl], cols_N[sl]) if s_src is not None else None
        parts.append(M.token_scores(j_src.logits(b_N[sl], cols_N[sl]), tgt_N[sl], s_logits))
    tok = {k: torch.cat([p[k] for p in parts]).cpu() for k in parts[0]}
    b_N, t_N, len_N, nb = b_N.cpu(), t_N.cpu(), len_B[b_N].cpu(), len(rows)
    out = {
        "junior_ce": M.chain_means(tok["ce"], b_N, nb),
        "junior_top1": M.chain_means(tok["top1"], b_N, nb),
        "junior_ce_deciles": M.per_chain_deciles(tok["ce"], b_N, t_N, len_N, nb),
        "n_tokens": len_B.cpu(),
    }
    if s_src is not None:
        out["kl_mc"] = M.chain_means(tok["kl_mc"], b_N, nb)
        out["kl_exact"] = M.chain_means(tok["kl_exact"], b_N, nb)
    return out


@torch.inference_mode()
def chain_scores(senior, junior, rollout: Rollout, *, chunk_tokens: int = EVAL_CHUNK_TOKENS, score_batch: int = EVAL_SCORE_BATCH) -> dict:
    """Per-chain teacher-forced scores of ``rollout``'s responses after their prompts, at temperature 1.

    Returns float64 tensors over chains: ``junior_ce`` (mean nats per token), ``junior_top1``,
    ``junior_ce_deciles`` ``(B, 10)`` (NaN where a chain has no token in a decile), ``n_tokens``, and
    with a ``senior``: ``kl_mc`` and ``kl_exact`` (mean per-token KL(senior ‖ junior)). One forward per
    model per ``score_batch`` rows; the vocabulary-sized work is chunked to ``chunk_tokens`` tokens.
    EOS tokens count as response tokens.
    """
    if chunk_tokens < 1 or score_batch < 1:
        raise ValueError("chunk_tokens and score_batch must be >= 1")
    order = torch.arange(rollout.batch_size, device=rollout.response_ids_BT.device)
    parts = [_score_rows(senior, junior, rollout, order[i:i + score_batch], chunk_tokens)
             for i in range(0, rollout.batch_size, score_batch)]
    return {k: torch.cat([p[k] for p in parts]) for k in parts[0]}


def junior_legibility(junior, rollout: Rollout, **kw) -> dict:
    """The junior's per-chain CE (nats/token), top-1 accuracy and CE by position decile on ``rollout``."""
    return chain_scores(None, junior, rollout, **kw)


def drift_kl(senior, junior, rollout: Rollout, **kw) -> dict:
    """Per-chain mean per-token KL(senior ‖ junior): ``{"kl_mc": ..., "kl_exact": ...}``."""
    s = chain_scores(senior, junior, rollout, **kw)
    return {"kl_mc": s["kl_mc"], "kl_exact": s["kl_exact"]}


# ---------------------------------------------------------------------------------------------------
# Sampling chains and grading them
# ---------------------------------------------------------------------------------------------------


class _Grader:
    """A plain ``reward_fn(completion, gold)`` or a ``RewardScorer``-like ``.score(texts, golds)``."""

    def __init__(self, reward_fn: Callable | None = None, scorer=None):
        if (reward_fn is None) == (scorer is None):
            raise ValueError("pass exactly one of reward_fn or scorer")
        self.reward_fn, self.scorer = reward_fn, scorer
        self.stats: dict[str, float] = {}

    def grade(self, texts: list[str], golds: list[str]) -> list[float]:
        if self.reward_fn is not None:
            return [float(self.reward_fn(t, g)) for t, g in zip(texts, golds)]
        vals, stats = self.scorer.score(texts, golds)
        for k, v in (stats or {}).items():  # per-batch counts (timeouts, no_box, ...) add up; means do not
            if isinstance(v, (int, float)) and not isinstance(v, bool) and "mean" not in k:
                self.stats[k] = self.stats.get(k, 0.0) + float(v)
        return [float(v) for v in vals]


def open_scorer(reward: str, timeout_s: float = eval_default("reward_timeout_s"),
                num_workers: int = eval_default("reward_workers")):
    """A :class:`tandem_rlvr.rewards.RewardScorer` (a context manager) with a hard per-check limit."""
    from tandem_rlvr.rewards import RewardScorer

    return RewardScorer(reward, num_workers=num_workers, time_limit=timeout_s)


def batch_seed(seed: int, tag: str, b: int) -> int:
    return (int(seed) * 1_000_003 + zlib.crc32(tag.encode()) * 7919 + b * 104_729) % (2**31 - 1)


@dataclass
class _Job:
    """What every mode of one (senior, benchmark) evaluation shares."""

    senior: object
    junior: object
    tokenizer: object
    prompts: list[list[int]]
    golds: list[str]
    ids: list[str]
    n: int
    sampling: Sampling
    seed: int
    batch_size: int
    grader: _Grader
    eos: list[int]
    context: int | None
    labels: dict = field(default_factory=dict)
    chunk_tokens: int = EVAL_CHUNK_TOKENS
    score_batch: int = EVAL_SCORE_BATCH
    progress: bool = True
    sink: Callable | None = None
    keep_chains: bool = True
    chains: list = field(default_factory=list)
    engine: object = None  # the rollout engine (tandem_rlvr.engines); in-process lockstep when None
    shard: tuple[int, int] = (0, 1)  # (rank, processes): this process samples the batches b with b % processes == rank

    def batches(self) -> list[list[tuple[int, int]]]:
        """(problem, sample) rows, problems in prompt-length order so a batch pads little."""
        order = sorted(range(len(self.prompts)), key=lambda i: len(self.prompts[i]))
        rows = [(pi, si) for pi in order for si in range(self.n)]
        return [rows[i:i + self.batch_size] for i in range(0, len(rows), self.batch_size)]


@dataclass
class ModeResult:
    rewards: list[list[float]]
    n_tokens: list[int] = field(default_factory=list)
    finished: list[bool] = field(default_factory=list)
    rounds: list[int] = field(default_factory=list)
    senior_tokens: int = 0
    scores: dict[str, list] = field(default_factory=dict)


def run_mode(job: _Job, mode: str, schedule, *, max_rounds: int | None = None, score: bool = False) -> ModeResult:
    """Sample ``n`` chains per problem under ``schedule``, grade them, optionally score them."""
    from tandem_rlvr.logs import progress

    res = ModeResult(rewards=[[0.0] * job.n for _ in job.prompts])
    pad = job.tokenizer.pad_token_id
    device = model_device(job.senior)
    desc = " ".join(str(v) for v in (*job.labels.values(), mode))
    total = len(job.prompts) * job.n
    bar = progress(total, desc, unit="chain", enabled=job.progress, every=max(1, total // 4), leave=False)
    for group in _call_groups(job, pad, device):
        rollouts = job.engine.generate_many([(prompts, seed) for _, prompts, _, seed in group], schedule, group[0][2],
                                            max_rounds=max_rounds)  # one budget per group
        for (rows, _, _, _), ro in zip(group, rollouts):
            texts = ro.texts(job.tokenizer)
            rewards = job.grader.grade(texts, [job.golds[pi] for pi, _ in rows])
            sc = chain_scores(job.senior, job.junior, ro, chunk_tokens=job.chunk_tokens,
                              score_batch=job.score_batch) if score else None
            _collect(job, res, mode, rows, ro, texts, rewards, sc)
            bar.update(len(rows))
    bar.close()
    return res


def _call_groups(job: _Job, pad: int, device) -> list[list[tuple]]:
    """The job's batches as ``(rows, prompts, sampling, seed)``, grouped into engine calls: one batch per call
    in-process; for an engine that batches requests itself (vLLM), every run of batches with the same budget."""
    tag = str(job.labels.get("benchmark", ""))
    groups: list[list[tuple]] = []
    rank, processes = job.shard
    for b, rows in enumerate(job.batches()):
        if b % processes != rank:
            continue
        prompts = PromptBatch.left_padded([job.prompts[pi] for pi, _ in rows], pad, device)
        budget = job.sampling.max_new_tokens
        if job.context is not None:
            budget = max(1, min(budget, job.context - prompts.ids_BP.shape[1]))
        item = (rows, prompts, replace(job.sampling, max_new_tokens=budget), batch_seed(job.seed, tag, b))
        if groups and getattr(job.engine, "batches_requests", False) and groups[-1][-1][2] == item[2]:
            groups[-1].append(item)
        else:
            groups.append([item])
    return groups


def _collect(job: _Job, res: ModeResult, mode: str, rows, ro: Rollout, texts, rewards, sc) -> None:
    n_tok = ro.response_mask_BT.sum(-1).tolist()
    res.senior_tokens += int((ro.owner_BT * ro.response_mask_BT).sum())
    for i, (pi, si) in enumerate(rows):
        res.rewards[pi][si] = rewards[i]
        res.n_tokens.append(int(n_tok[i]))
        res.finished.append(bool(ro.finished_B[i]))
        res.rounds.append(int(ro.rounds_B[i]))
        rec = {**job.labels, "problem_id": job.ids[pi], "sample": si, "mode": mode, "reward": rewards[i],
               "gold": job.golds[pi], "n_tokens": int(n_tok[i]), "finished": bool(ro.finished_B[i]),
               "rounds": int(ro.rounds_B[i]), "text": texts[i], "turns": ro.turns(job.tokenizer, i)}
        if sc is not None:
            for k in ("junior_ce", "junior_top1", "kl_mc", "kl_exact"):
                if k in sc:
                    res.scores.setdefault(k, []).append(float(sc[k][i]))
                    rec[k] = float(sc[k][i])
            res.scores.setdefault("junior_ce_deciles", []).append(sc["junior_ce_deciles"][i].tolist())
        if job.keep_chains:
            job.chains.append(rec)
        if job.sink is not None:
            job.sink(rec)


# ---------------------------------------------------------------------------------------------------
# Summaries and the library entry points
# ---------------------------------------------------------------------------------------------------


def pass_metrics(prefix: str, res: ModeResult, ks: Sequence[int]) -> dict:
    out = {f"{prefix}_pass@{k}": v for k, v in M.pass_at_ks(res.rewards, ks).items()}
    out[f"{prefix}_pass@1_se"] = M.std_error([sum(r) / len(r) for r in res.rewards])
    out[f"{prefix}_len"] = M.nanmean(res.n_tokens)
    out[f"{prefix}_finished"] = M.nanmean(res.finished)
    return out


def solo_metrics_from_chains(chains: Sequence[dict], n: int, problems: int, ks: Sequence[int] = M.DEFAULT_KS) -> dict:
    """:func:`solo_eval`'s metrics from its chains (e.g. every process's share of a sharded evaluation): ``n``
    samples of each of ``problems`` problems, told apart by ``problem_id`` (which must be unique)."""
    rewards: dict[str, list[float]] = {}
    seen = {(c["problem_id"], c["sample"]) for c in chains}
    if len(seen) != len(chains) or len(seen) != n * problems:
        raise ValueError(f"solo_metrics_from_chains: {len(chains)} chains for {problems} problems x {n} samples "
                         f"({len(seen)} distinct): are the problem ids unique?")
    for c in chains:
        rewards.setdefault(c["problem_id"], [0.0] * n)[c["sample"]] = c["reward"]
    res = ModeResult(rewards=list(rewards.values()), n_tokens=[c["n_tokens"] for c in chains],
                      finished=[c["finished"] for c in chains])
    return {"n_problems": len(rewards), **pass_metrics("solo", res, ks)}


def _legibility_metrics(res: ModeResult) -> dict:
    s = res.scores
    deciles = [M.nanmean(col) for col in zip(*s["junior_ce_deciles"])]
    out = {"junior_ce": M.nanmean(s["junior_ce"]), "junior_top1": M.nanmean(s["junior_top1"]),
           "junior_ce_by_decile": deciles}
    if "kl_mc" in s:
        out["kl_senior_junior"] = M.nanmean(s["kl_mc"])
        out["kl_senior_junior_exact"] = M.nanmean(s["kl_exact"])
    return out


def tax_metrics(solo: ModeResult, hand: ModeResult) -> dict:
    d = [sum(a) / len(a) - sum(b) / len(b) for a, b in zip(solo.rewards, hand.rewards)]
    return {"communication_tax": 100.0 * sum(d) / len(d), "communication_tax_se": 100.0 * M.std_error(d)}


def make_job(senior, junior, tokenizer, examples, *, n, sampling, seed, reward_fn, scorer, batch_size,
              context, labels, progress, sink, max_prompt_tokens=None, **kw) -> tuple[_Job, int]:
    from tandem_rlvr.models import eos_ids

    if n < 1 or batch_size < 1:
        raise ValueError(f"n and batch_size must be >= 1, got n={n}, batch_size={batch_size}")
    limit = max_prompt_tokens if context is None else min(context - 1, max_prompt_tokens or context)
    keep, prompts = encode_prompts(tokenizer, examples, max_prompt_tokens=limit)
    if not prompts:
        raise ValueError(f"no evaluation prompt left for {labels or 'this run'} (0 of {len(examples)} fit)")
    eos = eos_ids(tokenizer, senior)
    if kw.get("engine") is None:
        kw["engine"] = InProcessEngine(senior, junior, eos_token_ids=eos, pad_token_id=tokenizer.pad_token_id)
    job = _Job(senior=senior, junior=junior, tokenizer=tokenizer, prompts=prompts,
               golds=[str(examples[i].answer) for i in keep], ids=[str(examples[i].id) for i in keep],
               n=n, sampling=sampling, seed=seed, batch_size=batch_size, grader=_Grader(reward_fn, scorer),
               eos=eos, context=context, labels=dict(labels or {}),
               progress=progress, sink=sink, **kw)
    return job, len(examples) - len(keep)


def evaluate_pair(senior, junior, tokenizer, examples: Sequence, *, n: int = EVAL_N, sampling: Sampling | None = None,
                  seed: int = EVAL_SEED, reward_fn: Callable | None = None, scorer=None, curve_ps: Sequence[float] | None = CURVE_PS,
                  batch_size: int = EVAL_BATCH_SIZE, ks: Sequence[int] = M.DEFAULT_KS, max_rounds: int = MAX_ROUNDS,
                  context: int | None = EVAL_CONTEXT, chunk_tokens: int = EVAL_CHUNK_TOKENS, score_batch: int = EVAL_SCORE_BATCH,
                  labels: dict | None = None, progress: bool = True, sink: Callable | None = None,
                  keep_chains: bool = True, engine=None) -> tuple[dict, list[dict]]:
    """Evaluate one loaded senior with one loaded junior on ``examples`` (``Example(id, problem, answer)``).

    Returns ``(metrics, chains)``: the per-benchmark metrics (keys as in ``eval.json``) and every
    sampled chain as a dict (``labels`` are copied into each; ``sink`` is also called with each as
    soon as it is graded; ``keep_chains=False`` returns an empty list instead). Grading uses exactly one of ``reward_fn(completion, gold)`` or a
    ``scorer`` with ``.score(texts, golds) -> (rewards, stats)``. ``curve_ps`` empty/None skips the
    curve. The prompt plus response never exceeds ``context`` tokens. ``engine``: the rollout engine
    over the same two models that samples every chain (:func:`tandem_rlvr.engines.factory.eval_engine`;
    default: in-process lockstep); it must serve ``none``, ``alternate`` and, for the curve, ``word``.
    Scoring runs in-process.
    """
    sampling = sampling or eval_sampling()
    job, skipped = make_job(senior, junior, tokenizer, examples, n=n, sampling=sampling, seed=seed,
                             reward_fn=reward_fn, scorer=scorer, batch_size=batch_size, context=context,
                             labels=labels, progress=progress, sink=sink, chunk_tokens=chunk_tokens,
                             score_batch=score_batch, keep_chains=keep_chains, engine=engine)
    vocab = senior.get_output_embeddings().weight.shape[0]
    solo = run_mode(job, "solo", make_schedule("none"), score=True)
    hand = run_mode(job, "handoff", make_schedule("alternate", tokenizer, vocab_size=vocab), max_rounds=max_rounds)
    out = {"n_problems": len(job.prompts), "n_samples": n, "n_chains": len(job.prompts) * n, "n_skipped": skipped}
    out.update(pass_metrics("solo", solo, ks))
    out.update(pass_metrics("handoff", hand, ks))
    out.update(tax_metrics(solo, hand))
    out["handoff_rounds"] = M.nanmean(hand.rounds)
    out["handoff_senior_frac"] = hand.senior_tokens / max(1, sum(hand.n_tokens))
    if curve_ps:
        out["curve"] = {}
        for p in curve_ps:
            res = solo if float(p) == 1.0 else run_mode(
                job, f"curve-p{float(p)}", make_schedule("word", tokenizer, p=float(p), vocab_size=vocab))
            out["curve"][str(float(p))] = M.mean_pass_at_k(res.rewards, 1)
    out.update(_legibility_metrics(solo))
    if job.grader.stats:
        out["reward_stats"] = dict(job.grader.stats)
    return out, job.chains


def solo_eval(senior, tokenizer, examples: Sequence, *, n: int = EVAL_N, sampling: Sampling | None = None, seed: int = EVAL_SEED,
              reward_fn: Callable | None = None, scorer=None, batch_size: int = EVAL_BATCH_SIZE, ks: Sequence[int] = M.DEFAULT_KS,
              context: int | None = EVAL_CONTEXT, max_prompt_tokens: int | None = None, labels: dict | None = None,
              progress: bool = False, engine=None, shard: tuple[int, int] = (0, 1)) -> tuple[dict, list[dict]]:
    """Solo accuracy only (no junior): ``solo_pass@k``, its s.e., length and finished fraction. ``engine``: the
    rollout engine that samples the chains (in-process when None); ``shard``: ``(rank, processes)``, this
    process samples its share of the batches only (the metrics then cover its share: combine the chains)."""
    job, skipped = make_job(senior, None, tokenizer, examples, n=n, sampling=sampling or eval_sampling(), seed=seed,
                             reward_fn=reward_fn, scorer=scorer, batch_size=batch_size, context=context,
                             labels=labels, progress=progress, sink=None, max_prompt_tokens=max_prompt_tokens,
                             engine=engine, shard=shard)
    res = run_mode(job, "solo", make_schedule("none"))
    out = {"n_problems": len(job.prompts), "n_samples": n, "n_skipped": skipped, **pass_metrics("solo", res, ks)}
    return out, job.chains
