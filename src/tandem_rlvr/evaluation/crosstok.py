"""Evaluation of any two causal LMs, whatever their tokenizers (step handoff through the text bridge).

:func:`evaluate_any_pair` is the entry point ``tandem-rlvr eval`` uses for every (senior, junior):

- **same vocabulary** (every token string maps to the same id and the output layers have the same
  rows): :func:`tandem_rlvr.evaluation.evaluate.evaluate_pair` unchanged (lockstep handoff, word-level curve,
  nats/token, top-1, KL), plus bits-per-byte legibility. One tokenizer with output layers of different sizes
  (Qwen2.5-0.5B has 151,936 rows, Qwen2.5-7B 152,064: padding past the tokenizer's ids) is run as one vocabulary
  over the rows both have (:func:`shared_output_rows`);
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

import contextlib
import dataclasses
import logging
import math
from collections.abc import Callable, Sequence
from functools import partial

import torch

from tandem_rlvr.config import HandoffConfig
from tandem_rlvr.context import model_context
from tandem_rlvr.engines.bridge import make_side, tokenizers_differ
from tandem_rlvr.engines.handoff import Schedule
from tandem_rlvr.engines.turns import Side, TurnRules, chains_to_rollout, encode_texts, run_turns, start_chains
from tandem_rlvr.engines.types import Sampling
from tandem_rlvr.evaluation import legibility as L
from tandem_rlvr.evaluation.evaluate import EvalSettings, collect, curve_metrics, finish, make_job, run_mode, team_metrics

WORD_MAX_GAP = HandoffConfig().max_gap  # the word schedule's K, as in training (tandem_rlvr.config.HandoffConfig)

log = logging.getLogger(__name__)

NA = "n/a (different tokenizers)"
NA_KEYS = ("junior_ce", "junior_top1", "junior_ce_by_decile", "kl_senior_junior", "kl_senior_junior_exact")
STOPS = ("eos", "budget", "max_rounds", "empty_turn")

__all__ = ["NA", "STOPS", "bridge_handoff", "evaluate_any_pair", "text_tandem", "word_bridge", "same_vocabulary",
           "shared_output_rows", "template_kind"]


def same_vocabulary(senior, junior, s_tok, j_tok) -> bool:
    """True when the lockstep engine can pair the two: same token→id map and same output rows."""
    rows = [m.get_output_embeddings().weight.shape[0] for m in (senior, junior)]
    return not tokenizers_differ(s_tok, j_tok) and rows[0] == rows[1]


@contextlib.contextmanager
def shared_output_rows(senior, junior, s_tok, j_tok):
    """Within the block, a pair with one tokenizer whose output layers differ in size has the larger layer cut to
    the smaller's rows (a view of its weight, no copy; restored on exit), so the pair runs as one vocabulary.

    The rows cut are ids past every id of the shared tokenizer, which no text encodes: the larger model's
    distribution is renormalized over the ids both can name, and the probability it put on the cut rows is
    dropped (a trained model puts next to none there). Yields a one-line note of what was cut, or None when
    nothing was (same rows, different tokenizers, a tokenizer longer than the smaller layer, an output layer
    that is not a plain ``nn.Linear``).
    """
    heads = [m.get_output_embeddings() if hasattr(m, "get_output_embeddings") else None for m in (senior, junior)]
    if not all(isinstance(h, torch.nn.Linear) for h in heads):
        yield None
        return
    rows = [h.weight.shape[0] for h in heads]
    keep = min(rows)
    if rows[0] == rows[1] or tokenizers_differ(s_tok, j_tok) or len(s_tok) > keep:
        yield None
        return
    role = "senior" if rows[0] > rows[1] else "junior"
    big = heads[0] if role == "senior" else heads[1]
    weight, bias, features = big.weight, big.bias, big.out_features
    big.weight = torch.nn.Parameter(weight.detach()[:keep], requires_grad=False)
    if bias is not None:
        big.bias = torch.nn.Parameter(bias.detach()[:keep], requires_grad=False)
    big.out_features = keep
    log.info("one tokenizer (%d ids), output layers of %d (senior) and %d (junior) rows: the %s's cut to the first %d",
             len(s_tok), rows[0], rows[1], role, keep)
    try:
        yield (f"senior {rows[0]} rows, junior {rows[1]}: the {role}'s output layer cut to the first {keep} "
               f"(the tokenizer has {len(s_tok)} ids)")
    finally:
        big.weight, big.bias, big.out_features = weight, bias, features


def template_kind(tokenizer) -> str:
    """``chat`` when the tokenizer has a chat template, else ``plain`` (``Question: ...\\nAnswer:``)."""
    return "chat" if getattr(tokenizer, "chat_template", None) else "plain"


def read_limit(role: str, model, cap: int | None = None) -> int | None:
    """The positions ``model`` reads, as :func:`tandem_rlvr.context.model_context` decides them for
    training and preflight (rope scaling included), capped at ``cap`` (the evaluation's ``--context``)."""
    known = model_context(role, type(model).__name__, getattr(model, "config", None)).limit
    vals = [int(v) for v in (known, cap) if v]
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
                   sampling: Sampling, *, seed: int = 0, max_rounds: int | None = EvalSettings.max_rounds,
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


def _run_bridge_mode(job, sides: tuple[Side, Side], mode: str, runner: Callable) -> tuple:
    """One mode through text (``runner``: :func:`bridge_handoff`-like), batch by batch with the budgets and seeds of
    the same-vocabulary modes: a ``ModeResult``, stop counts, truncations."""
    from tandem_rlvr.data import render_prompt

    res = job.result()
    stops, truncations = dict.fromkeys(STOPS, 0), 0
    for b, rows in enumerate(job.batches()):
        probs = [job.problems.texts[pi] for pi, _ in rows]
        out = runner(*sides, [render_prompt(sides[0].tokenizer, p) for p in probs],
                     [render_prompt(sides[1].tokenizer, p) for p in probs], job.budget(rows), seed=job.seed(b))
        rewards = job.grader.grade(out["texts"], [job.problems.golds[pi] for pi, _ in rows])
        truncations += out["truncations"]
        for stop in out["stops"]:
            stops[stop] += 1
        extra = [{"stop": stop, "spans": [list(sp) for sp in spans]} for stop, spans in zip(out["stops"], out["spans"])]
        collect(job, res, mode, rows, out["rollout"], out["texts"], rewards, partial(_bridge_turns, out), extra=extra)
    return res, stops, truncations


def _bridge_turns(out: dict, i: int) -> list[dict]:
    """Chain ``i``'s turns from its character spans: owner, text, characters."""
    text = out["texts"][i]
    return [{"owner": "senior" if o else "junior", "text": text[s:e], "chars": e - s} for s, e, o in out["spans"][i]]


def _cross_pair(senior, junior, s_tok, j_tok, examples, settings, **io) -> tuple[dict, list]:
    """Solo (lockstep, senior alone), bridged step handoff and the bridged word curve of a pair with different
    tokenizers; ``io``: :func:`tandem_rlvr.evaluation.evaluate.make_job`'s keyword arguments."""
    from tandem_rlvr.engines.handoff import make_schedule
    from tandem_rlvr.models import eos_ids

    if io.pop("engine", None) is not None:
        raise ValueError("--engine vllm serves same-tokenizer pairs only; use --engine hf for a pair with different tokenizers")
    job = make_job(senior, None, s_tok, examples, settings, **io)
    solo = run_mode(job, "solo", make_schedule("none"))
    sides = (make_side(senior, s_tok, eos_ids(s_tok, senior)), make_side(junior, j_tok))
    contexts = (read_limit("senior", senior, settings.context), read_limit("junior", junior))
    hand, stops, trunc = _run_bridge_mode(job, sides, "handoff",
                                          partial(bridge_handoff, max_rounds=settings.max_rounds, contexts=contexts))
    out = team_metrics(job, solo, hand)
    out["handoff_stops"] = stops
    out["handoff_context_truncations"] = trunc
    out.update(dict.fromkeys(NA_KEYS, NA))
    if settings.curve_ps:
        out["curve"] = curve_metrics(job, solo, lambda p: _run_bridge_mode(
            job, sides, f"curve-p{p}", partial(word_bridge, p=p, contexts=contexts))[0])
    return finish(job, out)


def evaluate_any_pair(senior, junior, senior_tokenizer, junior_tokenizer, examples: Sequence,
                      settings: EvalSettings | None = None, *, sink: Callable | None = None, **io) -> tuple[dict, list[dict]]:
    """Evaluate one senior with one junior, with or without a shared vocabulary (see the module docstring), with
    ``settings`` (:class:`~tandem_rlvr.evaluation.evaluate.EvalSettings`).

    Keyword arguments are those of :func:`tandem_rlvr.evaluation.evaluate.evaluate_pair` (the grader, labels,
    ``keep_chains``, the engine, and changes to the settings' fields). Every solo chain also gets ``junior_bpb``
    (the junior's bits per UTF-8 byte of its text, :mod:`tandem_rlvr.evaluation.legibility`); the metrics get
    ``junior_bpb`` and its counts, ``vocabulary``: ``shared`` or ``different``, and where one output layer was
    cut to the other's rows (:func:`shared_output_rows`) ``output_rows``: what was cut.
    """
    from tandem_rlvr.evaluation.evaluate import evaluate_pair  # looked up per call (tests replace it)

    fields = {f.name for f in dataclasses.fields(EvalSettings)}
    s = (settings or EvalSettings()).but(**{k: io.pop(k) for k in list(io) if k in fields})
    with shared_output_rows(senior, junior, senior_tokenizer, junior_tokenizer) as cut:
        scorer = L.BpbSink(junior, junior_tokenizer, examples, sink, batch=s.score_batch, chunk_tokens=s.chunk_tokens)
        if same_vocabulary(senior, junior, senior_tokenizer, junior_tokenizer):
            metrics, chains = evaluate_pair(senior, junior, senior_tokenizer, examples, s, sink=scorer, **io)
            metrics["vocabulary"] = "shared"
        else:
            metrics, chains = _cross_pair(senior, junior, senior_tokenizer, junior_tokenizer, examples, s, sink=scorer,
                                          **io)
            metrics["vocabulary"] = "different"
        scorer.flush()
    metrics.update(scorer.summary())
    if cut:
        metrics["output_rows"] = cut
    return metrics, chains


def finite_or_na(value):
    """A metric for tables and plots: the number, or None where it is :data:`NA` or not finite."""
    if isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value):
        return float(value)
    return None
