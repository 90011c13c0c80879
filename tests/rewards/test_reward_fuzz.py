"""Adversarial fuzzing of the verifier: whatever the completion and gold, ``RewardScorer.score`` never
raises, returns 0.0 or 1.0 and comes back within its time limit (+1 s).

The strategies live in scripts/fuzz_rewards.py (random unicode, 100k-char strings, braces and boxes
nested 10k deep, towers of powers, lone backslashes, unclosed boxes, broken LaTeX), which runs the
same property on 10,000 inputs. tests/rewards/test_rewards.py already has a (correctness) property test of
``extract_boxed`` on plain answers and fixed pathological inputs for ``math_reward``; this one is the
adversarial-generator robustness test.
"""

from __future__ import annotations

import importlib.util
import math
import time

import pytest
from hypothesis import HealthCheck, example, given, settings

from tandem_rlvr.rewards import RewardScorer, extract_boxed
from helpers.paths import ROOT

_SPEC = importlib.util.spec_from_file_location("fuzz_rewards", ROOT / "scripts" / "fuzz_rewards.py")
fuzz = importlib.util.module_from_spec(_SPEC)
_SPEC.loader.exec_module(fuzz)

LIMIT = 1.0
SLACK = 1.0
B = "\\boxed"


@pytest.fixture(scope="module")
def scorer():
    with RewardScorer("math", num_workers=2, time_limit=LIMIT) as s:
        s.start(wait=True)
        yield s


@settings(max_examples=60, deadline=None, database=None, derandomize=True,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.large_base_example,
                                 HealthCheck.function_scoped_fixture])
@given(case=fuzz.cases())
@example(case=("x" * 50_000 + f"{B}{{2}}" + "y" * 50_000, "2", "math"))  # 100k chars
@example(case=(f"{B}{{" + "{" * 10_000 + "1" + "}" * 10_000 + "}", "1", "math"))  # braces 10k deep
@example(case=(f"{B}{{" * 10_000 + "1", "1", "gsm8k"))  # 10k unclosed boxes
@example(case=(f"{B}{{9^{{9^{{9^{{9}}}}}}}}", "1", "math"))  # a tower of powers
@example(case=(f"{B}{{(10^{{1000}})!}}", "10^{1000}", "math"))
@example(case=("\\" * 1001 + f"{B}{{\\}}" + "\\", "\\", "math"))  # lone backslashes
@example(case=(f"{B}{{\ud800\x00\u202e١٢٣😀}}", "123", "math"))  # surrogate, NUL, RTL, Arabic digits
@example(case=(f"the answer is {B}{{\\frac{{1}}{{2}}", "\\frac{1}{2}", "boxed_exact"))  # unclosed
def test_scorer_never_raises_and_keeps_its_limit(scorer, case):
    completion, gold, kind = case
    box = extract_boxed(completion)
    assert box is None or box in completion
    value, seconds, stats = fuzz.check_one(scorer, completion, gold, kind, LIMIT)
    assert value in (0.0, 1.0)
    assert seconds <= LIMIT + SLACK, (seconds, kind, completion[:80])
    assert stats["reward/n"] == 1.0
    assert all(math.isfinite(v) and v >= 0 for v in stats.values()), stats


def test_known_answers_still_score_through_the_fuzz_scorer(scorer):
    """The fuzzed scorer is not trivially returning 0: ordinary answers are still right."""
    t0 = time.perf_counter()
    values, _ = scorer.score([f"{B}{{\\frac{{1}}{{2}}}}", f"{B}{{0.5}}", f"{B}{{3}}", ""], ["0.5", "1/2", "4", "1"])
    assert values == [1.0, 1.0, 0.0, 0.0] and time.perf_counter() - t0 < LIMIT + SLACK
