"""`tandem-rlvr demo --quick` runs end to end and writes every output (world from the shared fixture)."""

import json

from tandem_rlvr.cli import main
from tandem_rlvr.demo import ARMS
from tandem_rlvr.demo_report import METRICS

# --quick draws 2 samples per problem, so pass@k exists for k <= 2 only
EVAL_KEYS = [k for k, *_ in METRICS if k != "solo_pass@4"] + ["curve", "solo_pass@2", "n_problems"]
CURVE_KEYS = ("step", "reward/mean", "rollout/senior_token_frac", "kl/senior_junior", "rollout/jargon_rate")


def test_demo_quick_writes_every_output(world, tmp_path, monkeypatch):
    paths, _ = world
    monkeypatch.setenv("TANDEM_RLVR_CACHE", str(paths.root.parent))
    out = tmp_path / "demo"
    assert main(["demo", "--quick", "--workers", "2", "--out", str(out)]) == 0
    results = json.loads((out / "results.json").read_text())
    for key in EVAL_KEYS:
        assert key in results["warm_start"], key
    for arm in ARMS:
        seeds = results["arms"][arm]
        assert list(seeds) == ["0"], arm
        for key in EVAL_KEYS:
            assert key in seeds["0"], (arm, key)
        rows = results["curves"][arm]["0"]
        assert rows and all(k in rows[-1] for k in CURVE_KEYS), (arm, rows[-1])
    report = (out / "report.md").read_text()
    assert "## Claims" in report and report.count("\n1. ") == 1 and "5. KL-Reg" in report
    for png in ("training_curves.png", "claims.png"):
        assert (out / png).stat().st_size > 1000
    assert (out / "runs" / "trlvr-seed0" / "final" / "model.safetensors").exists()

    assert results["workers"] == 2
    # A killed demo resumes after its last finished evaluation: drop kl_reg's entries (as if killed while
    # it trained) and the finished-run marker; the rerun trains only kl_reg and keeps the other numbers.
    # The rerun has one job, so it runs in this process: its numbers equal those of the worker process.
    import shutil

    partial = json.loads((out / "results.json").read_text())
    kept = {arm: partial["arms"][arm]["0"] for arm in ("grpo", "trlvr")}
    in_worker = (partial["arms"]["kl_reg"]["0"], partial["curves"]["kl_reg"]["0"])
    del partial["arms"]["kl_reg"]["0"], partial["curves"]["kl_reg"]["0"], partial["total_s"]
    (out / "results.json").write_text(json.dumps(partial))
    for arm in ARMS:
        shutil.rmtree(out / "runs" / f"{arm}-seed0")
    assert main(["demo", "--quick", "--out", str(out)]) == 0
    resumed = json.loads((out / "results.json").read_text())
    assert resumed["resumed"] is True and set(resumed["arms"]["kl_reg"]) == {"0"}
    for arm, metrics in kept.items():
        assert resumed["arms"][arm]["0"] == metrics
        assert not (out / "runs" / f"{arm}-seed0").exists(), f"{arm} was trained again"
    assert (out / "runs" / "kl_reg-seed0" / "final" / "model.safetensors").exists()
    assert resumed["workers"] == 1
    assert _untimed(resumed["arms"]["kl_reg"]["0"]) == _untimed(in_worker[0])
    assert _untimed(resumed["curves"]["kl_reg"]["0"]) == _untimed(in_worker[1])


def _untimed(x):
    """``x`` without wall-clock entries (the only thing that may differ between two equal runs)."""
    if isinstance(x, dict):
        return {k: _untimed(v) for k, v in x.items() if not k.startswith("time/")}
    if isinstance(x, list):
        return [_untimed(v) for v in x]
    return x


def test_demo_worker_count_is_checked_and_capped_by_the_jobs():
    import pytest

    from tandem_rlvr.demo import _n_workers
    from tandem_rlvr.errors import TandemError

    with pytest.raises(TandemError, match="workers must be >= 1"):
        _n_workers(0, 4)
    assert _n_workers(8, 3) == 3 and _n_workers(2, 10) == 2 and _n_workers(None, 1) == 1
