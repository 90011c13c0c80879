"""Evaluation (docs/evaluation.md): solo, step handoff, communication tax, handoff-rate curve, legibility, drift.

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

Its settings are one object, :class:`EvalSettings` (built once from the command's options); one :class:`Job`
holds an evaluation's inputs, settings and output (:class:`ChainLog`), and the record and metric assembly here
(:func:`collect`, :func:`team_metrics`, :func:`curve_metrics`) serves the text bridge too
(:mod:`tandem_rlvr.evaluation.crosstok`). The teacher-forced scoring is :mod:`tandem_rlvr.evaluation.scoring`.
The command line (``tandem-rlvr eval``) lives in :mod:`tandem_rlvr.evaluation.eval_cli`, which calls this module.
"""

from __future__ import annotations

import logging
import zlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace

from tandem_rlvr.data import encode_prompts
from tandem_rlvr.engines.base import PromptBatch
from tandem_rlvr.engines.handoff import make_schedule
from tandem_rlvr.engines.inprocess import InProcessEngine
from tandem_rlvr.engines.types import Rollout, Sampling
from tandem_rlvr.evaluation import metrics as M
from tandem_rlvr.evaluation.options import eval_default
from tandem_rlvr.evaluation.scoring import chain_scores, drift_kl, junior_legibility, model_device
from tandem_rlvr.seeds import derive_seed

log = logging.getLogger(__name__)

__all__ = [
    "ChainLog", "EvalSettings", "Job", "ModeResult", "Problems", "chain_scores", "drift_kl", "encode_prompts", "eval_sampling", "evaluate_pair", "junior_legibility",
    "open_scorer", "solo_eval",
]


def eval_sampling(max_new_tokens: int = eval_default("max_new_tokens"), temperature: float = eval_default("temperature"),
                  top_p: float = eval_default("top_p"), top_k: int = eval_default("top_k")) -> Sampling:
    """The evaluation decoding of the paper's protocol: temperature 0.7, top_p 0.8, top_k 20, 3000 tokens (docs/evaluation.md)."""
    return Sampling(max_new_tokens=max_new_tokens, temperature=temperature, top_p=top_p, top_k=top_k)


@dataclass(frozen=True)
class EvalSettings:
    """How an evaluation samples, grades and scores: built once from the options (:meth:`of`) and passed through
    every mode, for a pair with one vocabulary and one without alike. The defaults are the options' (documented
    once, in :class:`~tandem_rlvr.evaluation.options.EvalOptions`; docs/evaluation.md). ``curve_ps`` empty: no
    handoff-rate curve; ``context`` None: no limit on prompt + response; ``max_prompt_tokens``: longer prompts
    are skipped (also those over ``context - 1``)."""

    n: int = eval_default("n")
    sampling: Sampling = eval_sampling()
    seed: int = eval_default("seed")
    batch_size: int = eval_default("batch_size")
    curve_ps: tuple[float, ...] = tuple(eval_default("curve_ps"))
    ks: tuple[int, ...] = M.DEFAULT_KS
    max_rounds: int = eval_default("max_rounds")
    context: int | None = eval_default("context")
    max_prompt_tokens: int | None = None
    chunk_tokens: int = eval_default("chunk_tokens")
    score_batch: int = eval_default("score_batch")
    progress: bool = True

    def __post_init__(self) -> None:
        object.__setattr__(self, "curve_ps", tuple(float(p) for p in self.curve_ps or ()))
        object.__setattr__(self, "ks", tuple(int(k) for k in self.ks))
        if self.n < 1 or self.batch_size < 1:
            raise ValueError(f"n and batch_size must be >= 1, got n={self.n}, batch_size={self.batch_size}")
        if self.chunk_tokens < 1 or self.score_batch < 1:
            raise ValueError("chunk_tokens and score_batch must be >= 1")

    @classmethod
    def of(cls, opts) -> EvalSettings:
        """The settings of :class:`~tandem_rlvr.evaluation.options.EvalOptions` ``opts``."""
        return cls(n=opts.n, sampling=eval_sampling(opts.max_new_tokens, opts.temperature, opts.top_p, opts.top_k),
                   seed=opts.seed, batch_size=opts.batch_size, curve_ps=tuple(opts.curve_ps) if opts.curve else (),
                   max_rounds=opts.max_rounds, context=opts.context, chunk_tokens=opts.chunk_tokens,
                   score_batch=opts.score_batch, progress=opts.progress)

    def but(self, **changes) -> EvalSettings:
        """These settings with ``changes`` (field name -> value; an unknown name is a TypeError)."""
        return replace(self, **changes) if changes else self


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
    """The sampling seed of batch ``b`` of the run ``tag`` (a mode: solo, handoff, a curve point)."""
    return derive_seed(seed, zlib.crc32(tag.encode()), b)


@dataclass(frozen=True)
class Problems:
    """The problems an evaluation samples: those whose prompt fits, in the examples' order, with their prompt ids on
    the senior's tokenizer, their text (a :class:`~tandem_rlvr.prompts.ChatProblem` keeps its messages, for
    the text bridge), gold answers and ids; ``skipped``: how many did not fit."""

    prompts: list[list[int]]
    texts: list[str]
    golds: list[str]
    ids: list[str]
    skipped: int

    @classmethod
    def encode(cls, tokenizer, examples: Sequence, max_prompt_tokens: int | None) -> Problems:
        keep, prompts = encode_prompts(tokenizer, examples, max_prompt_tokens=max_prompt_tokens)
        kept = [examples[i] for i in keep]
        return cls(prompts, [e.problem for e in kept], [str(e.answer) for e in kept], [str(e.id) for e in kept],
                   len(examples) - len(keep))


class ChainLog:
    """Where an evaluation's graded chains go, as records: to ``sink`` (each as soon as it is graded) and, unless
    ``keep`` is False, into :attr:`chains`."""

    def __init__(self, sink: Callable | None = None, keep: bool = True):
        self.sink, self.keep, self.chains = sink, keep, []

    def add(self, record: dict) -> None:
        if self.keep:
            self.chains.append(record)
        if self.sink is not None:
            self.sink(record)


@dataclass
class Job:
    """One (senior, benchmark) evaluation: its inputs (the models, the engine that samples, the grader, the problems,
    the ``labels`` copied into every record, this process's ``shard`` = ``(rank, processes)``: the batches b
    with b % processes == rank), its :class:`EvalSettings` and its output (the :class:`ChainLog`)."""

    senior: object
    junior: object
    tokenizer: object
    engine: object
    grader: _Grader
    problems: Problems
    settings: EvalSettings
    log: ChainLog
    labels: dict = field(default_factory=dict)
    shard: tuple[int, int] = (0, 1)

    def batches(self) -> list[list[tuple[int, int]]]:
        """(problem, sample) rows, problems in prompt-length order so a batch pads little; a batch holds rows of
        one response budget (:meth:`room`), so no chain is cut short by a longer prompt beside it."""
        prompts, n, size = self.problems.prompts, self.settings.n, self.settings.batch_size
        order = sorted(range(len(prompts)), key=lambda i: len(prompts[i]))
        out: list[list[tuple[int, int]]] = []
        room = None  # the last batch's budget
        for pi in order:
            if self.room(pi) != room:
                room = self.room(pi)
                out.append([])
            for si in range(n):
                if len(out[-1]) == size:
                    out.append([])
                out[-1].append((pi, si))
        return out

    def room(self, pi: int) -> int:
        """Problem ``pi``'s response budget: ``max_new_tokens``, cut so its own prompt + response fit the context."""
        budget = self.settings.sampling.max_new_tokens
        if self.settings.context is None:
            return budget
        return max(1, min(budget, self.settings.context - len(self.problems.prompts[pi])))

    def budget(self, rows) -> Sampling:
        """The sampling of the batch ``rows`` (one budget: :meth:`batches`)."""
        return replace(self.settings.sampling, max_new_tokens=min(self.room(pi) for pi, _ in rows))

    def seed(self, b: int) -> int:
        """The seed of batch ``b`` (the same in every mode: common random numbers)."""
        return batch_seed(self.settings.seed, str(self.labels.get("benchmark", "")), b)

    def result(self) -> ModeResult:
        return ModeResult(rewards=[[0.0] * self.settings.n for _ in self.problems.prompts])


@dataclass
class ModeResult:
    rewards: list[list[float]]
    n_tokens: list[int] = field(default_factory=list)
    finished: list[bool] = field(default_factory=list)
    rounds: list[int] = field(default_factory=list)
    senior_tokens: int = 0
    scores: dict[str, list] = field(default_factory=dict)


def run_mode(job: Job, mode: str, schedule, *, max_rounds: int | None = None, score: bool = False) -> ModeResult:
    """Sample ``n`` chains per problem under ``schedule``, grade them, optionally score them."""
    from tandem_rlvr.logs import progress

    res, s = job.result(), job.settings
    desc = " ".join(str(v) for v in (*job.labels.values(), mode))
    total = len(job.problems.prompts) * s.n
    bar = progress(total, desc, unit="chain", enabled=s.progress, every=max(1, total // 4), leave=False)
    for group in _call_groups(job, job.tokenizer.pad_token_id, model_device(job.senior)):
        rollouts = job.engine.generate_many([(prompts, seed) for _, prompts, _, seed in group], schedule, group[0][2],
                                            max_rounds=max_rounds)  # one budget per group
        for (rows, _, _, _), ro in zip(group, rollouts):
            texts = ro.texts(job.tokenizer)
            rewards = job.grader.grade(texts, [job.problems.golds[pi] for pi, _ in rows])
            sc = chain_scores(job.senior, job.junior, ro, chunk_tokens=s.chunk_tokens,
                              score_batch=s.score_batch) if score else None
            collect(job, res, mode, rows, ro, texts, rewards, lambda i, ro=ro: ro.turns(job.tokenizer, i), scores=sc)
            bar.update(len(rows))
    bar.close()
    return res


def _call_groups(job: Job, pad: int, device) -> list[list[tuple]]:
    """The job's batches as ``(rows, prompts, sampling, seed)``, grouped into engine calls: one batch per call
    in-process; for an engine that batches requests itself (vLLM), every run of batches with the same budget."""
    groups: list[list[tuple]] = []
    rank, processes = job.shard
    for b, rows in enumerate(job.batches()):
        if b % processes != rank:
            continue
        prompts = PromptBatch.left_padded([job.problems.prompts[pi] for pi, _ in rows], pad, device)
        item = (rows, prompts, job.budget(rows), job.seed(b))
        if groups and getattr(job.engine, "batches_requests", False) and groups[-1][-1][2] == item[2]:
            groups[-1].append(item)
        else:
            groups.append([item])
    return groups


def collect(job: Job, res: ModeResult, mode: str, rows, ro: Rollout, texts, rewards, turns: Callable[[int], list], *,
            scores: dict | None = None, extra: Sequence[dict] = ()) -> None:
    """Record one batch of graded chains (rows ``(problem, sample)``, the :class:`Rollout` ``ro`` in the senior's
    tokens, their ``texts`` and ``rewards``): rewards, lengths, ends, rounds and senior tokens in ``res``, and one
    record per chain in the job's log, with its ``turns(i)``, its teacher-forced ``scores`` (also kept in
    ``res``) and ``extra[i]`` (the text bridge's stop reason and character spans)."""
    p = job.problems
    n_tok = ro.response_mask_BT.sum(-1).tolist()
    res.senior_tokens += int((ro.owner_BT * ro.response_mask_BT).sum())
    for i, (pi, si) in enumerate(rows):
        res.rewards[pi][si] = rewards[i]
        res.n_tokens.append(int(n_tok[i]))
        res.finished.append(bool(ro.finished_B[i]))
        res.rounds.append(int(ro.rounds_B[i]))
        rec = {**job.labels, "problem_id": p.ids[pi], "sample": si, "mode": mode, "reward": rewards[i],
               "gold": p.golds[pi], "n_tokens": int(n_tok[i]), "finished": bool(ro.finished_B[i]),
               "rounds": int(ro.rounds_B[i]), "text": texts[i], "turns": turns(i), **(extra[i] if extra else {})}
        if scores is not None:
            for k in ("junior_ce", "junior_top1", "kl_mc", "kl_exact"):
                if k in scores:
                    res.scores.setdefault(k, []).append(float(scores[k][i]))
                    rec[k] = float(scores[k][i])
            res.scores.setdefault("junior_ce_deciles", []).append(scores["junior_ce_deciles"][i].tolist())
        job.log.add(rec)


# ---------------------------------------------------------------------------------------------------
# Summaries and the library entry points
# ---------------------------------------------------------------------------------------------------


def pass_metrics(prefix: str, res: ModeResult, ks: Sequence[int]) -> dict:
    out = {f"{prefix}_pass@{k}": v for k, v in M.pass_at_ks(res.rewards, ks).items()}
    out[f"{prefix}_pass@1_se"] = M.std_error(M.pass1_per_problem(res.rewards))
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
    d = [a - b for a, b in zip(M.pass1_per_problem(solo.rewards), M.pass1_per_problem(hand.rewards))]
    return {"communication_tax": 100.0 * sum(d) / len(d), "communication_tax_se": 100.0 * M.std_error(d)}


def team_metrics(job: Job, solo: ModeResult, hand: ModeResult) -> dict:
    """The metrics of a pair's solo and step-handoff modes: counts, pass@k, the communication tax, the handoff's
    rounds and senior share (``eval.json``'s keys, for a pair with one vocabulary or two)."""
    n, problems = job.settings.n, len(job.problems.prompts)
    out = {"n_problems": problems, "n_samples": n, "n_chains": problems * n, "n_skipped": job.problems.skipped}
    out.update(pass_metrics("solo", solo, job.settings.ks))
    out.update(pass_metrics("handoff", hand, job.settings.ks))
    out.update(tax_metrics(solo, hand))
    out["handoff_rounds"] = M.nanmean(hand.rounds)
    out["handoff_senior_frac"] = hand.senior_tokens / max(1, sum(hand.n_tokens))
    return out


def curve_metrics(job: Job, solo: ModeResult, run_at: Callable[[float], ModeResult]) -> dict:
    """pass@1 of word-level tandem at each P(senior) of the settings' curve, ``run_at(p)`` sampling it; p = 1 is
    the solo run (token for token, so its chains are reused)."""
    return {str(p): M.mean_pass_at_k((solo if p == 1.0 else run_at(p)).rewards, 1) for p in job.settings.curve_ps}


def finish(job: Job, out: dict) -> tuple[dict, list[dict]]:
    """``(metrics, chains)`` of a finished job: the grader's counts (timeouts, ...) added to ``out``."""
    if job.grader.stats:
        out["reward_stats"] = dict(job.grader.stats)
    return out, job.log.chains


def make_job(senior, junior, tokenizer, examples: Sequence, settings: EvalSettings, *, reward_fn: Callable | None = None,
             scorer=None, labels: dict | None = None, sink: Callable | None = None, keep_chains: bool = True,
             engine=None, shard: tuple[int, int] = (0, 1)) -> Job:
    """The :class:`Job` of one evaluation; the prompts that fit ``settings.context`` (and ``max_prompt_tokens``)."""
    from tandem_rlvr.models import eos_ids, junior_eos_ids

    c, mp = settings.context, settings.max_prompt_tokens
    problems = Problems.encode(tokenizer, examples, mp if c is None else min(c - 1, mp or c))
    if not problems.prompts:
        from tandem_rlvr.errors import DataError

        what = ", ".join(f"{k} {v!r}" for k, v in (labels or {}).items()) or "this run"
        limits = [f"context {c} (the prompt and one token)" if c is not None else "",
                  f"max_prompt_tokens {mp}" if mp is not None else ""]
        why = "no problems were given" if not examples else (
            f"none of its {len(examples)} prompts fits {' and '.join(x for x in limits if x)}")
        raise DataError(f"eval: nothing to evaluate for {what}: {why}")
    if engine is None:
        engine = InProcessEngine(senior, junior, eos_token_ids=eos_ids(tokenizer, senior),
                                 pad_token_id=tokenizer.pad_token_id,
                                 junior_eos_token_ids=junior_eos_ids(tokenizer, senior, junior))
    return Job(senior=senior, junior=junior, tokenizer=tokenizer, engine=engine, grader=_Grader(reward_fn, scorer),
               problems=problems, settings=settings, log=ChainLog(sink, keep_chains), labels=dict(labels or {}),
               shard=shard)


def evaluate_pair(senior, junior, tokenizer, examples: Sequence, settings: EvalSettings | None = None, *,
                  reward_fn: Callable | None = None, scorer=None, labels: dict | None = None, sink: Callable | None = None,
                  keep_chains: bool = True, engine=None, **changes) -> tuple[dict, list[dict]]:
    """Evaluate one loaded senior with one loaded junior on ``examples`` (``Example(id, problem, answer)``) with
    ``settings`` (default: the evaluation's, :class:`EvalSettings`; keyword arguments named after its fields
    change them: ``n=2, curve_ps=None``).

    Returns ``(metrics, chains)``: the per-benchmark metrics (keys as in ``eval.json``) and every
    sampled chain as a dict (``labels`` are copied into each; ``sink`` is also called with each as
    soon as it is graded; ``keep_chains=False`` returns an empty list instead). Grading uses exactly one of
    ``reward_fn(completion, gold)`` or a ``scorer`` with ``.score(texts, golds) -> (rewards, stats)``. The prompt
    plus response never exceeds ``settings.context`` tokens. ``engine``: the rollout engine over the same two
    models that samples every chain (:func:`tandem_rlvr.engines.factory.build_engine`; default: in-process
    lockstep); it must serve ``none``, ``alternate`` and, for the curve, ``word``. Scoring runs in-process.
    """
    s = (settings or EvalSettings()).but(**changes)
    job = make_job(senior, junior, tokenizer, examples, s, reward_fn=reward_fn, scorer=scorer, labels=labels,
                   sink=sink, keep_chains=keep_chains, engine=engine)
    vocab = senior.get_output_embeddings().weight.shape[0]
    solo = run_mode(job, "solo", make_schedule("none"), score=True)
    hand = run_mode(job, "handoff", make_schedule("alternate", tokenizer, vocab_size=vocab), max_rounds=s.max_rounds)
    out = team_metrics(job, solo, hand)
    if s.curve_ps:
        out["curve"] = curve_metrics(job, solo, lambda p: run_mode(
            job, f"curve-p{p}", make_schedule("word", tokenizer, p=p, vocab_size=vocab)))
    out.update(_legibility_metrics(solo))
    return finish(job, out)


def solo_eval(senior, tokenizer, examples: Sequence, settings: EvalSettings | None = None, *,
              reward_fn: Callable | None = None, scorer=None, labels: dict | None = None, engine=None,
              shard: tuple[int, int] = (0, 1), **changes) -> tuple[dict, list[dict]]:
    """Solo accuracy only (no junior): ``solo_pass@k``, its s.e., length and finished fraction, with ``settings``
    (default: the evaluation's without progress bars; keyword arguments change its fields). ``engine``: the rollout
    engine that samples the chains (in-process when None); ``shard``: ``(rank, processes)``, this process samples
    its share of the batches only (the metrics then cover its share: combine the chains)."""
    s = (settings or EvalSettings(progress=False)).but(**changes)
    job = make_job(senior, None, tokenizer, examples, s, reward_fn=reward_fn, scorer=scorer, labels=labels,
                   engine=engine, shard=shard)
    res = run_mode(job, "solo", make_schedule("none"))
    out = {"n_problems": len(job.problems.prompts), "n_samples": s.n, "n_skipped": job.problems.skipped,
           **pass_metrics("solo", res, s.ks)}
    return out, job.log.chains
