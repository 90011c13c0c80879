"""`tandem-rlvr demo --budget / --world-seed / --kl-betas`: the robustness checks of docs/demo.md from the
command line: parsed, checked before the world is built, passed to the plan and named in the report."""

import pytest

from tandem_rlvr.cli import build_parser, main
from tandem_rlvr.demo import FULL, PLANS, run_names, train_config
from tandem_rlvr.demo.plan import with_changes
from tandem_rlvr.demo.report import _build_seed
from tandem_rlvr.errors import TandemError


def test_with_changes_changes_only_what_is_given():
    assert with_changes(FULL) is FULL
    slips = PLANS["slips"][0]
    plan = with_changes(slips, budget=64, kl_betas=[], seeds=3)
    assert (plan.max_new_tokens, plan.kl_betas, plan.seeds) == (64, (), 3)
    assert {k: v for k, v in plan.__dict__.items() if k not in ("max_new_tokens", "kl_betas", "seeds")} == \
        {k: v for k, v in slips.__dict__.items() if k not in ("max_new_tokens", "kl_betas", "seeds")}
    assert run_names(plan) == ["grpo", "trlvr"]
    assert run_names(with_changes(FULL, kl_betas=(0.5, 2))) == ["grpo", "trlvr", "kl_reg@0.5", "kl_reg@2"]


def test_the_budget_reaches_the_training_rollouts(tmp_path):
    plan = with_changes(PLANS["slips"][0], budget=96)
    cfg = train_config("trlvr", 0, tmp_path / "r", plan, "s", None, progress=False, world="slips")
    assert cfg.rollout.max_new_tokens == 96


def test_the_command_line_passes_the_options_to_run_demo(tmp_path, monkeypatch):
    import tandem_rlvr.demo as demo

    calls = []
    monkeypatch.setattr(demo, "run_demo", lambda **kw: calls.append(kw))
    args = ["demo", "--world", "slips", "--junior", "self", "--out", str(tmp_path / "d")]
    assert main([*args, "--budget", "64", "--world-seed", "2234", "--kl-betas", "none"]) == 0
    assert {k: calls[-1][k] for k in ("world", "junior", "budget", "world_seed", "kl_betas")} == \
        {"world": "slips", "junior": "self", "budget": 64, "world_seed": 2234, "kl_betas": ()}
    assert main([*args, "--kl-betas", "0.1,1"]) == 0
    assert calls[-1]["kl_betas"] == (0.1, 1.0) and calls[-1]["budget"] is None and calls[-1]["world_seed"] is None
    parsed = build_parser().parse_args(["demo"])
    assert (parsed.budget, parsed.world_seed, parsed.kl_betas) == (None, None, None)  # the plan's own values


@pytest.mark.parametrize("bad", [["--kl-betas", "0.1,x"], ["--budget", "64.5"], ["--world-seed", "two"]])
def test_unparsable_options_are_usage_errors(bad, capsys):
    assert main(["demo", *bad]) == 2
    assert bad[0] in capsys.readouterr().err


@pytest.mark.parametrize("kw, says", [
    ({"budget": 0}, "--budget"), ({"budget": -8}, "--budget"), ({"world_seed": -1}, "--world-seed"),
    ({"kl_betas": (0.0,)}, "--kl-betas"), ({"kl_betas": (0.1, float("inf"))}, "--kl-betas"),
    ({"kl_betas": (0.1, 0.1)}, "--kl-betas"), ({"kl_betas": (float("nan"),)}, "--kl-betas"),
])
def test_bad_values_fail_before_the_world_is_built(kw, says, tmp_path, monkeypatch):
    import tandem_rlvr.world.build as build
    from tandem_rlvr.demo import run_demo

    monkeypatch.setattr(build, "build_world", lambda *a, **k: pytest.fail("the world was built"))
    with pytest.raises(TandemError, match=says):
        run_demo(tmp_path / "d", world="slips", junior="self", **kw)
    rc = main(["demo", "--out", str(tmp_path / "d"), *{"budget": ["--budget", str(kw.get("budget"))],
                                                       "world_seed": ["--world-seed", str(kw.get("world_seed"))],
                                                       "kl_betas": ["--kl-betas", ",".join(map(str, kw.get("kl_betas", ())))]
                                                       }[next(iter(kw))]])
    assert rc == 2


def test_the_report_names_a_rebuilt_world_and_not_the_shipped_one():
    assert _build_seed({"world": {"name": "slips", "seed": 2234}}) == "; world build seed 2234 (not the shipped build)"
    assert _build_seed({"world": {"name": "slips"}}) == "" and _build_seed({}) == ""


def test_a_budget_the_models_cannot_read_fails_before_any_job(world, tmp_path, monkeypatch):
    paths, _ = world
    monkeypatch.setenv("TANDEM_RLVR_CACHE", str(paths.root.parent))
    import tandem_rlvr.demo.runner as runner
    from tandem_rlvr.demo import run_demo

    monkeypatch.setattr(runner, "run_sequential", lambda *a, **k: pytest.fail("a job ran"))
    monkeypatch.setattr(runner, "run_parallel", lambda *a, **k: pytest.fail("a job ran"))
    with pytest.raises(TandemError, match=r"demo --budget 5000 does not fit the arith world's models: .*--budget <= \d+"):
        run_demo(tmp_path / "d", quick=True, budget=5000, workers=1)
    assert not (tmp_path / "d" / "results.json").exists()
    from tandem_rlvr.demo import QUICK

    fits = with_changes(QUICK, budget=64)  # a budget that fits passes the same check
    assert runner._check_budget(fits, "arith", str(paths.senior_dir), str(paths.junior_dir), tmp_path / "d") is None
