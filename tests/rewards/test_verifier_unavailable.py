"""A verifier pool that cannot start at all is an error (VerifierUnavailable, exit code 2), never a batch of zeros;
a start that fails once and then succeeds, and a check that fails on a working pool, are not (the latter stays a
counted error: tests/rewards/test_rewards.py)."""

from __future__ import annotations

import sys

import pytest

from tandem_rlvr.errors import EXIT_USER, TandemError, VerifierUnavailable, user_errors


def test_a_checker_that_cannot_import_is_an_error_naming_reward_and_cause(monkeypatch):
    """The reviewer's case: math-verify broken in the workers' interpreter. Before, every answer scored 0 and
    the evaluation exited 0."""
    from tandem_rlvr.rewards import RewardScorer, workers

    monkeypatch.setattr(workers, "worker_argv", lambda fd, mb, *pid: [sys.executable, "-c", "raise ImportError('broken')"])
    with RewardScorer("gsm8k", num_workers=1, time_limit=1.0) as sc:
        with pytest.raises(VerifierUnavailable) as e:
            sc.score([r"so \boxed{\frac{1}{2}}"] * 3, ["#### 1/2"] * 3)
    msg = str(e.value)
    assert "reward 'gsm8k'" in msg and "exited before it was ready" in msg and "import math_verify" in msg, msg
    assert isinstance(e.value, TandemError) and isinstance(e.value, user_errors()) and e.value.exit_code == EXIT_USER


def test_a_start_that_fails_once_is_retried_and_scores(monkeypatch):
    from tandem_rlvr.rewards import RewardScorer, workers

    real, calls = workers.Worker.start, []

    def flaky(self):
        calls.append(1)
        if len(calls) == 1:
            raise OSError("resource temporarily unavailable")
        real(self)

    monkeypatch.setattr(workers.Worker, "start", flaky)
    with RewardScorer("math", num_workers=1, time_limit=5.0) as sc:
        rewards, stats = sc.score([r"\boxed{2.0}", r"\boxed{5.0}"], ["2", "3"])
    assert rewards == [1.0, 0.0] and stats["reward/errors"] == 0.0 and len(calls) == 2
