"""`tandem-rlvr demo --world shorthand`: the option, its plan and data, and (slow) a quick run end to end."""

import json

import pytest

from tandem_rlvr.cli import build_parser
from tandem_rlvr.demo import FULL, PLANS, QUICK, SHORTHAND_FULL, run_demo, style_rate, train_config


def test_the_world_option_defaults_to_the_arithmetic_world():
    parser = build_parser()
    assert parser.parse_args(["demo"]).world == "arith"
    assert parser.parse_args(["demo", "--world", "shorthand", "--junior", "self"]).world == "shorthand"
    with pytest.raises(SystemExit):
        parser.parse_args(["demo", "--world", "nowhere"])
    assert PLANS["arith"] == (FULL, QUICK)  # the default world's plan is unchanged


def test_an_unknown_world_fails_before_anything_is_built(tmp_path, monkeypatch):
    import tandem_rlvr.world.build as build
    from tandem_rlvr.errors import TandemError

    monkeypatch.setattr(build, "build_world", lambda *a, **k: pytest.fail("the world was built"))
    with pytest.raises(TandemError, match="demo world must be one of"):
        run_demo(tmp_path / "d", world="nowhere")


def test_the_shorthand_plan_trains_on_its_own_data_under_its_budget(tmp_path):
    from tandem_rlvr.world.shorthand import BUDGET, shorthand_solution
    from tandem_rlvr.world.problems import generate_problem, plain_solution
    import random

    assert SHORTHAND_FULL.max_new_tokens == BUDGET and SHORTHAND_FULL.seeds >= 5
    cfg = train_config("trlvr", 0, tmp_path / "r", SHORTHAND_FULL, "s", None, progress=False, world="shorthand")
    assert cfg.data.train == "shorthand/train" and cfg.val.data == "shorthand/val"
    assert cfg.rollout.max_new_tokens == BUDGET
    assert train_config("trlvr", 0, tmp_path / "r", FULL, "s", None, progress=False).data.train == "arith/train"
    prob = generate_problem(random.Random(3), 5)
    assert style_rate("shorthand")([shorthand_solution(prob), plain_solution(prob)]) == 0.5


@pytest.mark.slow
def test_the_quick_shorthand_demo_runs_and_names_its_world(tmp_path, monkeypatch):
    monkeypatch.setenv("TANDEM_RLVR_CACHE", str(tmp_path / "cache"))
    from tandem_rlvr.cli import main

    out = tmp_path / "demo"
    assert main(["demo", "--quick", "--world", "shorthand", "--junior", "self", "--workers", "2", "--out", str(out)]) == 0
    results = json.loads((out / "results.json").read_text())
    assert results["world"]["name"] == "shorthand" and results["junior"] == "self"
    assert results["plan"]["max_new_tokens"] == SHORTHAND_FULL.max_new_tokens
    assert "shorthand world" in (out / "report.md").read_text()
    assert next(iter(json.loads((out / "chains" / "problems.json").read_text()))).startswith("short-test-")
