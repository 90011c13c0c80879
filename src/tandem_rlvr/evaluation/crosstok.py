"""Evaluation of any two causal LMs, whatever their tokenizers (step handoff through the text bridge).

:func:`evaluate_any_pair` is the entry point ``tandem-rlvr eval`` uses for every (senior, junior):

- **same vocabulary** (every token string maps to the same id and the output layers have the same
  rows): :func:`tandem_rlvr.evaluation.evaluate.evaluate_pair` unchanged (lockstep handoff, word-level curve,
  nats/token, top-1, KL), plus bits-per-byte legibility;
- **different tokenizers**: the solo chains as usual (the senior alone needs no junior), the step
  handoff through text (:func:`bridge_handoff`), the handoff-rate curve with word-level handoffs on
  text (:func:`word_bridge`), both played by the turn driver (:mod:`tandem_rlvr.engines.turns`),
  bits-per-byte legibility; nats/token, top-1 and
  KL are reported as :data:`NA` (they compare tokens or distributions over one vocabulary, which two
  tokenizers do not share).

Bridge handoff (``alternate``: the senior writes the first ``"\\n\\n"`` step, then strict
alternation, at most ``max_rounds`` turns). Each turn's text is re-encoded by the next author with
its own tokenizer. The one shared budget is counted in **senior
tokens**: after every turn the whole chain is re-encoded with the senior's tokenizer, and a chain
that would pass the budget is cut at the last senior token that fits, so a handoff chain is never
longer, in the senior's tokens, than a solo chain may be. A turn is capped at the remaining budget
in its author's own tokens. A chain ends on EOS (``eos``), an exhausted budget (``budget``), the
round limit (``max_rounds``) or a turn whose text is empty or only whitespace without EOS
(``empty_turn``); the counts are in ``handoff_stops``. An author whose context is too short for
prompt + history + turn reads the history truncated from the left (``handoff_context_truncations``).
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Sequence
from dataclasses import replace
from functools import partial

import torch

from tandem_rlvr.config import HandoffConfig, eval_default
from tandem_rlvr.engines.bridge import make_side, tokenizers_differ
from tandem_rlvr.engines.handoff import Schedule
from tandem_rlvr.engines.turns import Side, TurnRules, chains_to_rollout, encode_texts, run_turns, start_chains
from tandem_rlvr.engines.types import Sampling
from tandem_rlvr.evaluation import legibility as L

HANDOFF_MAX_ROUNDS = eval_default("max_rounds")  # the step handoff's turn limit (tandem_rlvr.config.EvalOptions)
WORD_MAX_GAP = HandoffConfig().max_gap  # the word schedule's K, as in training (tandem_rlvr.config.HandoffConfig)

log = logging.getLogger(__name__)

NA = "n/a (different tokenizers)"
NA_KEYS = ("junior_ce", "junior_top1", "junior_ce_by_decile", "kl_senior_junior", "kl_senior_junior_exact")
STOPS = ("eos", "budget", "max_rounds", "empty_turn")

__all__ = ["NA", "STOPS", "bridge_handoff", "evaluate_any_pair", "text_tandem", "word_bridge", "same_vocabulary", "template_kind"]


def same_vocabulary(senior, junior, s_tok, j_tok) -> bool:
    """True when the lockstep engine can pair the two: same token→id map and same output rows."""
    rows = [m.get_output_embeddings().weight.shape[0] for m in (senior, junior)]
    return not tokenizers_differ(s_tok, j_tok) and rows[0] == rows[1]


def template_kind(tokenizer) -> str:
    """``chat`` when the tokenizer has a chat template, else ``plain`` (``Question: ...\\nAnswer:``)."""
    return "chat" if getattr(tokenizer, "chat_template", None) else "plain"


def model_context(model, limit: int | None = None) -> int | None:
    """The positions ``model`` can read (``max_position_embeddings``), capped at ``limit``."""
    n = getattr(getattr(model, "config", None), "max_position_embeddings", None)
    vals = [int(v) for v in (n, limit) if v]
    return min(vals) if vals else None


# ---------------------------------------------------------------------------------------------------
# Step and word handoffs through the text bridge
# ---------------------------------------------------------------------------------------------------


def text_tandem(senior: Side, junior: Side, senior_prompts: Sequence[str], junior_prompts: Sequence[str],
                sampling: Sampling, schedule: Schedule, *, seed: int = 0, max_rounds: int | None = None,
                contexts: tuple[int | None, int | None] = (None, None)) -> dict:
    """Tandem generation between two tokenizers through the turn driver (:mod:`tandem_rlvr.engines.turns`),
    the budget ``sampling.max_new_tokens`` counted in senior tokens. Returns the senior-token ``rollout``,
    ``texts``, owner ``spans``, each chain's ``stops`` reason and the context ``truncations``.

    Step-level schedules end a chain on a turn of whitespace only (``empty_turn``: an author that writes
    nothing would hand the same history back forever); word turns can be a lone space and do not.
    """
    n = len(senior_prompts)
    chains = start_chains(schedule, schedule.coins(n, seed), int(sampling.max_new_tokens))
    prompt_ids = (encode_texts(senior.tokenizer, senior_prompts), encode_texts(junior.tokenizer, junior_prompts))
    rules = TurnRules(max_rounds=max_rounds, senior_budget=True, stop_empty=schedule.level == "step", contexts=contexts)
    truncations = run_turns((senior, junior), prompt_ids, chains, sampling, torch.Generator().manual_seed(int(seed)), rules)
    rollout = chains_to_rollout(senior, chains, prompt_ids[0], schedule.name, max_rounds)
    return {"rollout": rollout, "texts": [c.text for c in chains], "spans": [[tuple(s) for s in c.spans] for c in chains],
            "stops": [c.stop for c in chains], "truncations": truncations, "chains": chains}


def bridge_handoff(senior: Side, junior: Side, senior_prompts: Sequence[str], junior_prompts: Sequence[str],
                   sampling: Sampling, *, seed: int = 0, max_rounds: int | None = HANDOFF_MAX_ROUNDS,
                   contexts: tuple[int | None, int | None] = (None, None)) -> dict:
    """Step handoff (``alternate``: the senior writes the first step, then strict alternation) between two
    tokenizers (:func:`text_tandem`). The random draws are those of
    :func:`tandem_rlvr.engines.bridge.bridge_generate` with the same seed, so while no budget binds the
    texts are the training bridge's."""
    return text_tandem(senior, junior, senior_prompts, junior_prompts, sampling, Schedule("alternate"), seed=seed,
                       max_rounds=max_rounds, contexts=contexts)


def word_bridge(senior: Side, junior: Side, senior_prompts: Sequence[str], junior_prompts: Sequence[str],
                sampling: Sampling, *, p: float, seed: int = 0, max_gap: int = WORD_MAX_GAP,
                contexts: tuple[int | None, int | None] = (None, None)) -> dict:
    """Word-level tandem between two tokenizers (:func:`text_tandem`): the ``word`` schedule with P(senior)
    = ``p`` and K = ``max_gap``, each token fed to it in its author's vocabulary, so the coins fall where
    the same-tokenizer curve's do (after a word-start token, or after K tokens without one) and, as
    there, no turn limit. Each handoff costs the new author a fresh read of the history."""
    if not 0.0 <= p <= 1.0:
        raise ValueError(f"handoff p must be in [0, 1], got {p}")
    schedule = Schedule("word", p=float(p), max_gap=int(max_gap))
    return text_tandem(senior, junior, senior_prompts, junior_prompts, sampling, schedule, seed=seed, contexts=contexts)


# ---------------------------------------------------------------------------------------------------
# The evaluation of one pair
# ---------------------------------------------------------------------------------------------------


def _kept_problems(job, examples, tokenizer) -> list[str]:
    """The problem texts of the job's prompts, in its order (the prompts that fit the context)."""
    from tandem_rlvr.data import encode_prompts

    limit = None if job.context is None else job.context - 1
    keep, _ = encode_prompts(tokenizer, examples, max_prompt_tokens=limit, what="eval (problems)")
    return [examples[i].problem for i in keep]


def _bridge_record(job, mode: str, pi: int, si: int, out: dict, i: int, reward: float, n_tok: int) -> dict:
    text, spans = out["texts"][i], out["spans"][i]
    turns = [{"owner": "senior" if o else "junior", "text": text[s:e], "chars": e - s} for s, e, o in spans]
    return {**job.labels, "problem_id": job.ids[pi], "sample": si, "mode": mode, "reward": reward,
            "gold": job.golds[pi], "n_tokens": n_tok, "finished": bool(out["rollout"].finished_B[i]),
            "rounds": int(out["rollout"].rounds_B[i]), "stop": out["stops"][i], "text": text, "turns": turns,
            "spans": [list(s) for s in spans]}


def _run_bridge_mode(job, sides: tuple[Side, Side], problems: list[str], mode: str, runner: Callable) -> tuple:
    """One mode through text (``runner``: :func:`bridge_handoff`-like): a ``ModeResult``, stop counts, truncations."""
    from tandem_rlvr.data import render_prompt
    from tandem_rlvr.evaluation.evaluate import batch_seed, ModeResult

    res = ModeResult(rewards=[[0.0] * job.n for _ in job.prompts])
    stops, truncations = dict.fromkeys(STOPS, 0), 0
    tag = str(job.labels.get("benchmark", ""))
    for b, rows in enumerate(job.batches()):
        budget = job.sampling.max_new_tokens
        if job.context is not None:
            budget = max(1, min(budget, job.context - max(len(job.prompts[pi]) for pi, _ in rows)))
        probs = [problems[pi] for pi, _ in rows]
        out = runner(*sides, [render_prompt(sides[0].tokenizer, p) for p in probs],
                     [render_prompt(sides[1].tokenizer, p) for p in probs],
                     replace(job.sampling, max_new_tokens=budget), seed=batch_seed(job.seed, tag, b))
        ro = out["rollout"]
        rewards = job.grader.grade(out["texts"], [job.golds[pi] for pi, _ in rows])
        n_tok = ro.response_mask_BT.sum(-1).tolist()
        res.senior_tokens += int((ro.owner_BT * ro.response_mask_BT).sum())
        truncations += out["truncations"]
        for i, (pi, si) in enumerate(rows):
            res.rewards[pi][si] = rewards[i]
            res.n_tokens.append(int(n_tok[i]))
            res.finished.append(bool(ro.finished_B[i]))
            res.rounds.append(int(ro.rounds_B[i]))
            stops[out["stops"][i]] += 1
            rec = _bridge_record(job, mode, pi, si, out, i, rewards[i], int(n_tok[i]))
            if job.keep_chains:
                job.chains.append(rec)
            if job.sink is not None:
                job.sink(rec)
    return res, stops, truncations


def _word_curve(job, sides, problems: list[str], ps: list[float], solo, ctx: dict) -> dict:
    """pass@1 of word-level tandem through text (:func:`word_bridge`) at each P(senior); p = 1 is solo."""
    from tandem_rlvr.evaluation import metrics as M

    curve = {}
    for p in ps:
        res = solo if float(p) == 1.0 else _run_bridge_mode(
            job, sides, problems, f"curve-p{float(p)}", partial(word_bridge, p=float(p), contexts=ctx["contexts"]))[0]
        curve[str(float(p))] = M.mean_pass_at_k(res.rewards, 1)
    return curve


def _cross_pair(senior, junior, s_tok, j_tok, examples, *, ks, max_rounds, context, kw: dict) -> tuple[dict, list]:
    """Solo (lockstep, senior alone) and bridged step handoff of a pair with different tokenizers."""
    from tandem_rlvr.evaluation.evaluate import make_job, pass_metrics, run_mode, tax_metrics
    from tandem_rlvr.engines.handoff import make_schedule

    if kw.pop("engine", None) is not None:
        raise ValueError("--engine vllm serves same-tokenizer pairs only; use --engine hf for a pair with different tokenizers")
    curve_ps = list(kw.pop("curve_ps", None) or [])
    job, skipped = make_job(senior, None, s_tok, examples, context=context, **kw)
    problems = _kept_problems(job, examples, s_tok)
    solo = run_mode(job, "solo", make_schedule("none"))
    sides = (make_side(senior, s_tok, job.eos), make_side(junior, j_tok))
    ctx = dict(max_rounds=max_rounds, contexts=(model_context(senior, context), model_context(junior)))
    hand, stops, trunc = _run_bridge_mode(job, sides, problems, "handoff", partial(bridge_handoff, **ctx))
    out = {"n_problems": len(job.prompts), "n_samples": job.n, "n_chains": len(job.prompts) * job.n, "n_skipped": skipped}
    out.update(pass_metrics("solo", solo, ks))
    out.update(pass_metrics("handoff", hand, ks))
    out.update(tax_metrics(solo, hand))
    out["handoff_rounds"] = sum(hand.rounds) / max(1, len(hand.rounds))
    out["handoff_senior_frac"] = hand.senior_tokens / max(1, sum(hand.n_tokens))
    out["handoff_stops"] = stops
    out["handoff_context_truncations"] = trunc
    out.update(dict.fromkeys(NA_KEYS, NA))
    if curve_ps:
        out["curve"] = _word_curve(job, sides, problems, curve_ps, solo, ctx)
    if job.grader.stats:
        out["reward_stats"] = dict(job.grader.stats)
    return out, job.chains


def evaluate_any_pair(senior, junior, senior_tokenizer, junior_tokenizer, examples: Sequence, *,
                      sink: Callable | None = None, keep_chains: bool = True, score_batch: int = L.SCORE_BATCH,
                      chunk_tokens: int = L.CHUNK_TOKENS, **kw) -> tuple[dict, list[dict]]:
    """Evaluate one senior with one junior, with or without a shared vocabulary (see the module docstring).

    Keyword arguments are those of :func:`tandem_rlvr.evaluation.evaluate.evaluate_pair`. Every solo chain also
    gets ``junior_bpb`` (the junior's bits per UTF-8 byte of its text, :mod:`tandem_rlvr.evaluation.legibility`);
    the metrics get ``junior_bpb`` and its counts, and ``vocabulary``: ``shared`` or ``different``.
    """
    from tandem_rlvr.evaluation.evaluate import evaluate_pair

    scorer = L.BpbSink(junior, junior_tokenizer, examples, sink, batch=score_batch, chunk_tokens=chunk_tokens)
    common = dict(sink=scorer, keep_chains=keep_chains, score_batch=score_batch, chunk_tokens=chunk_tokens)
    if same_vocabulary(senior, junior, senior_tokenizer, junior_tokenizer):
        metrics, chains = evaluate_pair(senior, junior, senior_tokenizer, examples, **common, **kw)
        metrics["vocabulary"] = "shared"
    else:
        from tandem_rlvr.evaluation import evaluate as E

        ks = kw.pop("ks", E.M.DEFAULT_KS)
        max_rounds, context = kw.pop("max_rounds", E.MAX_ROUNDS), kw.pop("context", E.EVAL_CONTEXT)
        kw.setdefault("n", E.EVAL_N)
        kw.setdefault("seed", E.EVAL_SEED)
        kw.setdefault("batch_size", E.EVAL_BATCH_SIZE)
        kw.setdefault("curve_ps", E.CURVE_PS)
        kw.setdefault("labels", None)
        kw.setdefault("progress", True)
        kw.setdefault("reward_fn", None)
        kw.setdefault("scorer", None)
        if kw.get("sampling") is None:
            from tandem_rlvr.evaluation.evaluate import eval_sampling

            kw["sampling"] = eval_sampling()
        metrics, chains = _cross_pair(senior, junior, senior_tokenizer, junior_tokenizer, examples, ks=ks,
                                      max_rounds=max_rounds, context=context,
                                      kw={**kw, "sink": scorer, "keep_chains": keep_chains})
        metrics["vocabulary"] = "different"
    scorer.flush()
    metrics.update(scorer.summary())
    return metrics, chains


def finite_or_na(value):
    """A metric for tables and plots: the number, or None where it is :data:`NA` or not finite."""
    if isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value):
        return float(value)
    return None
