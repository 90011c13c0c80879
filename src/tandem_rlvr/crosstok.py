"""Evaluation of any two causal LMs, whatever their tokenizers (step handoff through the text bridge).

:func:`evaluate_any_pair` is the entry point ``tandem-rlvr eval`` uses for every (senior, junior):

- **same vocabulary** (every token string maps to the same id and the output layers have the same
  rows): :func:`tandem_rlvr.evaluate.evaluate_pair` unchanged (lockstep handoff, word-level curve,
  nats/token, top-1, KL), plus bits-per-byte legibility;
- **different tokenizers**: the solo chains as usual (the senior alone needs no junior), the step
  handoff through the text bridge (:func:`bridge_handoff`), the handoff-rate curve with word-level
  handoffs on text (:mod:`tandem_rlvr.wordbridge`), bits-per-byte legibility; nats/token, top-1 and
  KL are reported as :data:`NA` (they compare tokens or distributions over one vocabulary, which two
  tokenizers do not share).

Bridge handoff (``alternate``: the senior writes the first ``"\\n\\n"`` step, then strict
alternation, at most ``max_rounds`` turns). Each turn's text is re-encoded by the next author with
its own tokenizer (:mod:`tandem_rlvr.bridge`). The one shared budget is counted in **senior
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

from tandem_rlvr import legibility as L
from tandem_rlvr.bridge import (
    Side,
    _Chains,
    _encode,
    _encode_prompts,
    _to_rollout,
    _turn_text,
    decode_turn,
    make_side,
    tokenizers_differ,
)
from tandem_rlvr.rollout import Sampling

log = logging.getLogger(__name__)

NA = "n/a (different tokenizers)"
NA_KEYS = ("junior_ce", "junior_top1", "junior_ce_by_decile", "kl_senior_junior", "kl_senior_junior_exact")
STOPS = ("eos", "budget", "max_rounds", "empty_turn")

__all__ = ["NA", "STOPS", "bridge_handoff", "evaluate_any_pair", "same_vocabulary", "template_kind"]


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
# Step handoff through the text bridge
# ---------------------------------------------------------------------------------------------------


def _fit_context(seqs: list[list[int]], caps: list[int], context: int | None) -> tuple[list, list, int]:
    """Left-truncate each input so that input + turn fits ``context``; returns (seqs, caps, n cut)."""
    if context is None:
        return seqs, caps, 0
    out_s, out_c, cut = [], [], 0
    for s, c in zip(seqs, caps):
        c = max(1, min(c, context // 2)) if len(s) + c > context else c
        keep = context - c
        cut += int(len(s) > keep)
        out_s.append(s[-keep:] if len(s) > keep else s)
        out_c.append(c)
    return out_s, out_c, cut


def _trim(ch: _Chains, b: int, cut: int) -> None:
    """Cut row ``b``'s text (and its owner spans) to its first ``cut`` characters."""
    ch.texts[b] = ch.texts[b][:cut]
    ch.spans[b] = [[s, min(e, cut), o] for s, e, o in ch.spans[b] if s < cut]


def _fit_cut(tok, text: str, offs, budget: int) -> int:
    """The longest prefix (in characters) that ends at a token end and re-encodes to <= ``budget`` tokens."""
    cut = int(offs[budget - 1][1]) if budget > 0 else 0
    while cut > 0 and len(tok(text[:cut], add_special_tokens=False)["input_ids"]) > budget:
        cut -= 1  # a character split over several byte tokens re-encodes whole: step back
    return cut


def _senior_used(ch: _Chains, rows: list[int], tok, budget: int) -> list[int | None]:
    """Senior tokens of each row's text; a row that passes ``budget`` is cut at its last fitting token (None)."""
    enc = tok([ch.texts[b] for b in rows], add_special_tokens=False, return_offsets_mapping=True)
    used: list[int | None] = []
    for b, ids, offs in zip(rows, enc["input_ids"], enc["offset_mapping"]):
        if len(ids) > budget:
            _trim(ch, b, _fit_cut(tok, ch.texts[b], offs, budget))
        used.append(len(ids) if len(ids) <= budget else None)
    return used


def _after_eval_turn(ch: _Chains, b: int, turn, text: str, used: int | None, budget: int,
                     max_rounds: int | None, stops: list[str]) -> None:
    """Strict alternation after row ``b``'s turn, or the end of the chain with its reason (``used`` None: cut)."""
    ch.remaining[b] = budget - (budget if used is None else used)
    ch.last_author[b] = ch.author[b]
    stop = ("budget" if used is None else "eos" if turn.hit_eos else "budget" if ch.remaining[b] <= 0 or not turn.step_end
            else "empty_turn" if not text.strip() else None)
    if stop is None and max_rounds is not None and ch.rounds[b] >= max_rounds:
        stop = "max_rounds"
    if stop is not None:
        ch.done[b], ch.finished[b], stops[b] = True, stop == "eos", stop
        return
    ch.rounds[b] += 1
    ch.author[b] = not ch.author[b]


def bridge_handoff(senior: Side, junior: Side, senior_prompts: Sequence[str], junior_prompts: Sequence[str],
                   sampling: Sampling, *, seed: int = 0, max_rounds: int | None = 150,
                   contexts: tuple[int | None, int | None] = (None, None)) -> dict:
    """Step handoff (``alternate``) between two tokenizers, budget ``sampling.max_new_tokens`` senior tokens.

    Returns ``{"bridge": BridgeRollout-like fields, "stops": [...], "truncations": int}`` where the
    rollout is over the senior's tokens with ownership from the character spans (see the module
    docstring). The random draws are those of :func:`tandem_rlvr.bridge.bridge_generate` with the same
    seed, so while no budget binds the texts are the training bridge's.
    """
    n, budget = len(senior_prompts), int(sampling.max_new_tokens)
    ch = _Chains.start(n, [True] * n, budget)
    prompt_ids = {True: _encode_prompts(senior.tokenizer, senior_prompts),
                  False: _encode_prompts(junior.tokenizer, junior_prompts)}
    ctx = {True: contexts[0], False: contexts[1]}
    gen = torch.Generator().manual_seed(int(seed))
    stops, truncations = [""] * n, 0
    while not all(ch.done):
        for is_senior, side in ((True, senior), (False, junior)):
            rows = [b for b in range(n) if not ch.done[b] and ch.author[b] == is_senior]
            if not rows:
                continue
            history = _encode(side.tokenizer, [ch.texts[b] for b in rows])
            seqs = [prompt_ids[is_senior][b] + h for b, h in zip(rows, history)]
            seqs, caps, cut = _fit_context(seqs, [ch.remaining[b] for b in rows], ctx[is_senior])
            truncations += cut
            turns = decode_turn(side, seqs, caps, sampling, gen)
            added = [_turn_text(side, t) for t in turns]
            for b, text in zip(rows, added):
                ch.add_text(b, text, int(is_senior))
            used = _senior_used(ch, rows, senior.tokenizer, budget)
            for b, turn, text, u in zip(rows, turns, added, used):
                _after_eval_turn(ch, b, turn, text, u, budget, max_rounds, stops)
    rollout = _to_rollout(senior, ch, prompt_ids[True], "alternate")
    spans = [[(s, e, o) for s, e, o in row] for row in ch.spans]
    return {"rollout": rollout, "texts": list(ch.texts), "spans": spans, "stops": stops, "truncations": truncations}


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
    """One mode through text (``runner``: :func:`bridge_handoff`-like): a ``_ModeResult``, stop counts, truncations."""
    from tandem_rlvr.data import render_prompt
    from tandem_rlvr.evaluate import _batch_seed, _ModeResult

    res = _ModeResult(rewards=[[0.0] * job.n for _ in job.prompts])
    stops, truncations = dict.fromkeys(STOPS, 0), 0
    tag = str(job.labels.get("benchmark", ""))
    for b, rows in enumerate(job.batches()):
        budget = job.sampling.max_new_tokens
        if job.context is not None:
            budget = max(1, min(budget, job.context - max(len(job.prompts[pi]) for pi, _ in rows)))
        probs = [problems[pi] for pi, _ in rows]
        out = runner(*sides, [render_prompt(sides[0].tokenizer, p) for p in probs],
                     [render_prompt(sides[1].tokenizer, p) for p in probs],
                     replace(job.sampling, max_new_tokens=budget), seed=_batch_seed(job.seed, tag, b))
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
    """pass@1 of word-level tandem through text (:mod:`tandem_rlvr.wordbridge`) at each P(senior); p = 1 is solo."""
    from tandem_rlvr import metrics as M
    from tandem_rlvr.wordbridge import word_bridge

    curve = {}
    for p in ps:
        res = solo if float(p) == 1.0 else _run_bridge_mode(
            job, sides, problems, f"curve-p{float(p)}", partial(word_bridge, p=float(p), **ctx))[0]
        curve[str(float(p))] = M.mean_pass_at_k(res.rewards, 1)
    return curve


def _cross_pair(senior, junior, s_tok, j_tok, examples, *, ks, max_rounds, context, kw: dict) -> tuple[dict, list]:
    """Solo (lockstep, senior alone) and bridged step handoff of a pair with different tokenizers."""
    from tandem_rlvr.evaluate import _make_job, _pass_metrics, _run_mode, _tax
    from tandem_rlvr.handoff import make_schedule

    if kw.pop("engine", None) is not None:
        raise ValueError("--engine vllm serves same-tokenizer pairs only; use --engine hf for a pair with different tokenizers")
    curve_ps = list(kw.pop("curve_ps", None) or [])
    job, skipped = _make_job(senior, None, s_tok, examples, context=context, **kw)
    problems = _kept_problems(job, examples, s_tok)
    solo = _run_mode(job, "solo", make_schedule("none"))
    sides = (make_side(senior, s_tok, job.eos), make_side(junior, j_tok))
    ctx = dict(max_rounds=max_rounds, contexts=(model_context(senior, context), model_context(junior)))
    hand, stops, trunc = _run_bridge_mode(job, sides, problems, "handoff", partial(bridge_handoff, **ctx))
    out = {"n_problems": len(job.prompts), "n_samples": job.n, "n_chains": len(job.prompts) * job.n, "n_skipped": skipped}
    out.update(_pass_metrics("solo", solo, ks))
    out.update(_pass_metrics("handoff", hand, ks))
    out.update(_tax(solo, hand))
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
                      sink: Callable | None = None, keep_chains: bool = True, score_batch: int = 8,
                      chunk_tokens: int = 1024, **kw) -> tuple[dict, list[dict]]:
    """Evaluate one senior with one junior, with or without a shared vocabulary (see the module docstring).

    Keyword arguments are those of :func:`tandem_rlvr.evaluate.evaluate_pair`. Every solo chain also
    gets ``junior_bpb`` (the junior's bits per UTF-8 byte of its text, :mod:`tandem_rlvr.legibility`);
    the metrics get ``junior_bpb`` and its counts, and ``vocabulary``: ``shared`` or ``different``.
    """
    from tandem_rlvr.evaluate import evaluate_pair

    scorer = L.BpbSink(junior, junior_tokenizer, examples, sink, batch=score_batch, chunk_tokens=chunk_tokens)
    common = dict(sink=scorer, keep_chains=keep_chains, score_batch=score_batch, chunk_tokens=chunk_tokens)
    if same_vocabulary(senior, junior, senior_tokenizer, junior_tokenizer):
        metrics, chains = evaluate_pair(senior, junior, senior_tokenizer, examples, **common, **kw)
        metrics["vocabulary"] = "shared"
    else:
        ks = kw.pop("ks", (1, 2, 4, 8))
        max_rounds, context = kw.pop("max_rounds", 150), kw.pop("context", 4096)
        kw.setdefault("n", 8)
        kw.setdefault("seed", 0)
        kw.setdefault("batch_size", 64)
        kw.setdefault("labels", None)
        kw.setdefault("progress", True)
        kw.setdefault("reward_fn", None)
        kw.setdefault("scorer", None)
        if kw.get("sampling") is None:
            from tandem_rlvr.evaluate import eval_sampling

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
