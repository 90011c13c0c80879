"""The evaluation's budgets and statistics against hand computation: each chain's own response budget, the tax and
the pass@1 standard error from the thresholded pass@1, the verifier's counts summed over benchmarks, a finished part
not reused under another reward time limit.

Tiny random Qwen2 models on the fixture tokenizer, or hand-made inputs to the metric functions.
"""

from __future__ import annotations

import math

import pytest

from helpers.tiny_models import bias_token, make_tiny_model
from tandem_rlvr.data import Example as _Ex
from tandem_rlvr.evaluation import metrics as M
from tandem_rlvr.evaluation.evaluate import (
    EvalSettings,
    ModeResult,
    eval_sampling,
    pass_metrics,
    solo_eval,
    tax_metrics,
)




def _never_ending_senior(tokenizer):
    """A tiny senior that never emits EOS: every chain runs to its budget."""
    from tandem_rlvr.models import eos_ids

    senior = make_tiny_model(len(tokenizer), seed=0, hidden=48)
    for e in eos_ids(tokenizer, senior):
        bias_token(senior, e, -50.0)
    return senior


def _prompt_len(tokenizer, problem: str) -> int:
    from tandem_rlvr.data import render_prompt

    return len(tokenizer(render_prompt(tokenizer, problem), add_special_tokens=False)["input_ids"])


# ---------------------------------------------------------------------------------------------------
# 1. A chain's response budget depends on the other prompts in its batch (evaluate.py Job.budget)
# ---------------------------------------------------------------------------------------------------


def test_a_chains_budget_is_its_own_context_room_not_its_batch_neighbours(tokenizer):
    """With --context C and --max-new-tokens N, a chain may write min(N, C - its own prompt length) tokens (the
    prompt + response limit is per chain; left padding is not read). Job.budget cut every chain of a batch to
    C - (longest prompt in the batch), so a short problem batched with a long one gets a shorter budget than
    when it is alone: its chains are truncated earlier and its pass@k and the tax depend on batch_size."""
    senior = _never_ending_senior(tokenizer)
    short, long_ = "7?", "What is 3 plus 4? Add them up. Add them up. Add them up. Add them up."
    examples = [_Ex("short", short, "7"), _Ex("long", long_, "7")]
    context, max_new = 200, 100
    ls, ll = _prompt_len(tokenizer, short), _prompt_len(tokenizer, long_)
    assert context - ll < max_new < context - ls  # the long prompt binds the budget, the short one does not
    lengths = {}
    for bs in (1, 2):
        s = EvalSettings(n=1, sampling=eval_sampling(max_new), batch_size=bs, context=context, curve_ps=(),
                         progress=False)
        _, chains = solo_eval(senior, tokenizer, examples, s, reward_fn=lambda t, g: 0.0)
        lengths[bs] = {c["problem_id"]: c["n_tokens"] for c in chains}
    expected = {"short": min(max_new, context - ls), "long": min(max_new, context - ll)}  # 100 and 58 here
    assert lengths[1] == expected
    assert lengths[2] == expected, f"batch_size=2 gives {lengths[2]} (short problem cut to the long prompt's room)"


# ---------------------------------------------------------------------------------------------------
# 3. The tax and the pass@1 s.e. use raw reward means; pass@1 thresholds the rewards (reward >= 0.5)
# ---------------------------------------------------------------------------------------------------


def test_tax_is_solo_pass1_minus_handoff_pass1_for_non_binary_rewards():
    """docs/evaluation.md: communication_tax = solo_pass@1 - handoff_pass@1 (points). pass@1 counts a sample as
    correct when reward >= 0.5 (metrics.mean_pass_at_k); the tax averages the raw rewards instead.
    Solo [[0.4, 1], [1, 1]]: pass@1 = (1/2 + 1)/2 = 0.75; handoff [[0, 1], [1, 1]]: 0.75 -> tax 0.0.
    It was 100 * mean(0.7 - 0.5, 0) = 10.0."""
    solo = ModeResult(rewards=[[0.4, 1.0], [1.0, 1.0]])
    hand = ModeResult(rewards=[[0.0, 1.0], [1.0, 1.0]])
    ps, ph = pass_metrics("solo", solo, (1,)), pass_metrics("handoff", hand, (1,))
    assert ps["solo_pass@1"] == pytest.approx(0.75) and ph["handoff_pass@1"] == pytest.approx(0.75)
    t = tax_metrics(solo, hand)
    assert t["communication_tax"] == pytest.approx(100 * (ps["solo_pass@1"] - ph["handoff_pass@1"]))  # 0.0
    assert t["communication_tax_se"] == pytest.approx(0.0)  # per-problem pass@1 differences are (0, 0)


def test_pass1_standard_error_is_that_of_the_reported_pass1():
    """solo_pass@1_se must be the s.e. over problems of the per-problem pass@1 that solo_pass@1 averages:
    per-problem pass@1 (threshold 0.5) = [0.5, 1.0] -> s.e. = sqrt(((0.25^2 + 0.25^2)/1)/2) = 0.25.
    It used the raw reward means [0.7, 1.0] -> 0.15."""
    res = ModeResult(rewards=[[0.4, 1.0], [1.0, 1.0]])
    m = pass_metrics("solo", res, (1,))
    assert m["solo_pass@1"] == pytest.approx(0.75)
    assert m["solo_pass@1_se"] == pytest.approx(M.std_error([0.5, 1.0]))  # 0.25
    assert M.std_error([0.5, 1.0]) == pytest.approx(0.25)


# ---------------------------------------------------------------------------------------------------
# 4. The macro average averages the verifier's counts (timeouts, errors, n) instead of summing them
# ---------------------------------------------------------------------------------------------------


def test_macro_reward_stats_are_summed_like_the_other_counts():
    """reward_stats holds counts (checks, timeouts, errors, ...): over two benchmarks with 0 and 3 timed-out
    checks (of 10 and 30) the macro row must say 3 timeouts of 40 checks, as n_problems and handoff_stops are
    summed (metrics.COUNT_KEYS). macro_average gave their mean: 1.5 timeouts of 20 checks."""
    a = {"n_problems": 10, "solo_pass@1": 0.5, "reward_stats": {"reward/n": 10.0, "reward/timeouts": 0.0}}
    b = {"n_problems": 30, "solo_pass@1": 0.7, "reward_stats": {"reward/n": 30.0, "reward/timeouts": 3.0}}
    m = M.macro_average({"a": a, "b": b})
    assert m["n_problems"] == 40
    assert m["reward_stats"]["reward/timeouts"] == 3
    assert m["reward_stats"]["reward/n"] == 40
    assert math.isclose(m["solo_pass@1"], 0.6)


# ---------------------------------------------------------------------------------------------------
# 5. A finished part is reused after --reward-timeout-s changes (its timed-out checks scored 0)
# ---------------------------------------------------------------------------------------------------


def test_part_fingerprint_changes_with_the_reward_time_limit():
    """A timed-out check scores 0 and enters pass@k's denominator as a wrong answer, so the time limit changes
    the numbers of a part: rerunning with a longer --reward-timeout-s (the fix for timeouts) must recompute the
    parts, not reuse the ones whose timeouts were scored 0. eval_cli._fingerprint left it out."""
    from dataclasses import replace

    from tandem_rlvr.evaluation.eval_cli import _fingerprint
    from tandem_rlvr.evaluation.options import load_options

    opts = load_options(None, {"seniors": ["s=/nonexistent/senior"], "junior": "/nonexistent/junior",
                               "benchmarks": ["arith/test"]})
    ex = [_Ex("0", "What is 3 plus 4?", "7")]
    a = _fingerprint(opts, "/nonexistent/senior", "arith/test", ex, "/nonexistent/junior")
    b = _fingerprint(replace(opts, reward_timeout_s=opts.reward_timeout_s * 10), "/nonexistent/senior",
                     "arith/test", ex, "/nonexistent/junior")
    assert a != b
