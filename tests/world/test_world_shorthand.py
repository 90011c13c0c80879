"""Tests of the second built-in world, ``shorthand`` (``tandem-rlvr demo --world shorthand``): its styles,
splits and budget, the shipped build's integrity, and its promised properties (on the shipped build in the
default suite; on a rebuild from scratch under two build seeds in the slow suite). ``-s`` shows the
measured properties."""

from __future__ import annotations

import json
import random

import pytest

from tandem_rlvr.world import problems as P
from tandem_rlvr.world import shorthand as S
from tandem_rlvr.world import shorthand_build as SB


def test_shorthand_steps_drop_the_sentence_the_ordinal_and_the_old_total():
    rng = random.Random(11)
    for _ in range(500):
        prob = P.generate_problem(rng, rng.randint(2, 8))
        short, plain = S.shorthand_solution(prob), S.solution(prob, "plain")
        assert P.is_correct(short, prob.answer) and P.is_correct(plain, prob.answer)
        steps = S.steps(prob, "shorthand")
        assert len(steps) == len(prob.ops) + 1 and all(s.endswith("\n\n") for s in steps[:-1])
        assert steps[:-1] == [f"> {op.symbol}{op.operand} = {v}\n\n" for op, v in zip(prob.ops, prob.values)]
        assert not any(o in short for o in P.ORDINALS) and steps[0].startswith(f"> {prob.ops[0].symbol}")
        assert S.is_shorthand(short) and not S.is_shorthand(plain)
        mixed = S.mixed_solution(prob, random.Random(len(prob.ops)), 0.5)
        assert P.is_correct(mixed, prob.answer) and sum(S.style_counts(mixed)) == len(prob.ops)
    assert S.mixed_solution(prob, rng, 0.0) == plain and S.mixed_solution(prob, rng, 1.0) == short
    assert S.shorthand_rate([short, plain, "no idea", short]) == 0.5 and S.shorthand_rate([]) == 0.0
    assert S.shorthand_step_share([short, plain]) == 0.5 and S.shorthand_step_share(["none"]) == 0.0


def test_splits_are_deterministic_disjoint_and_loadable():
    from tandem_rlvr.data import load_examples

    splits = {name: S.generate_split(name) for name in S.SPLIT_SPECS}
    for name, probs in splits.items():
        assert len(probs) == S.SPLIT_SPECS[name]["size"] and len({p.signature for p in probs}) == len(probs)
    names = list(splits)
    for i, a in enumerate(names):
        for b in names[i + 1:]:
            assert not {p.signature for p in splits[a]} & {p.signature for p in splits[b]}, (a, b)
    test = load_examples("shorthand/test")
    assert [e.answer for e in test] == [str(p.answer) for p in splits["test"]] and test[0].id == "short-test-00000"
    with pytest.raises(ValueError):
        S.load_split("test_hard")


def test_the_arith_worlds_recipe_key_is_unchanged():
    """The default world keeps its recipe (and so its shipped files and demo numbers)."""
    from tandem_rlvr.world.build import prebuilt_world, world_key

    assert world_key() == world_key(world="arith") and world_key().startswith("world-v1-")
    assert world_key(world="shorthand").startswith("shorthand-v1-") and prebuilt_world() is not None


# ------------------------------------------------------------------------------ the built world


@pytest.fixture(scope="session")
def shorthand_world(tmp_path_factory):
    """The shipped shorthand world, installed into a temporary cache (no training)."""
    from tandem_rlvr.world.build import build_world

    return build_world(tmp_path_factory.mktemp("shorthand_cache"), progress=False, world="shorthand")


def test_the_shipped_world_is_intact_and_of_this_recipe(shorthand_world):
    from tandem_rlvr.world.build import PREBUILT_DIR, is_complete, prebuilt_world, recipe

    shipped = prebuilt_world("shorthand")
    assert shipped is not None, "no intact shipped shorthand world for this recipe"
    assert sorted(p.name for p in PREBUILT_DIR.iterdir() if p.is_dir() and p.name.startswith("shorthand-")) == [shipped.name]
    manifest = json.loads((shipped / "manifest.json").read_text())
    assert manifest["recipe"] == json.loads(json.dumps(recipe(world="shorthand")))
    assert manifest["tries"][-1]["failures"] == [] and all(t["failures"] for t in manifest["tries"][:-1])
    assert is_complete(shorthand_world.root, world="shorthand")
    size = sum(p.stat().st_size for p in shipped.rglob("*") if p.is_file())
    assert size < 5_000_000


def test_the_budget_fits_shorthand_but_not_long_plain_solutions(shorthand_world):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(shorthand_world.tokenizer_dir))
    facts = SB.budget_facts(tok)
    print("\nBUDGET " + json.dumps(facts))
    assert facts["plain_over_budget_7_8"] == 1.0 and facts["shorthand_fits"] == 1.0
    for n, tokens in facts["mean_tokens"].items():
        assert tokens["shorthand"] <= 0.5 * tokens["plain"], (n, tokens)  # at most half the tokens


@pytest.fixture(scope="session", params=["shipped", *(pytest.param(s, marks=pytest.mark.slow) for s in (1234, 2234))])
def measured(request, shorthand_world, tmp_path_factory):
    """What the build's gate measures: on the shipped world, or on a rebuild from scratch (slow)."""
    from tandem_rlvr.world.build import build_world

    paths = shorthand_world
    if request.param != "shipped":
        paths = build_world(tmp_path_factory.mktemp(f"short{request.param}"), progress=False, prebuilt=False,
                            seed=request.param, world="shorthand")
        print(f"\nREBUILD seed {request.param}: " + json.dumps(paths.manifest["tries"]))
    out = SB.measure_models(paths, count=SB.PROPERTY_COUNT)
    print(f"\nSHORTHAND WORLD ({request.param}) " + json.dumps(SB.property_values(out)))
    return out


def test_the_promised_properties_hold(measured):
    assert SB.property_failures(measured) == []


def test_the_warm_senior_rarely_writes_shorthand_steps_but_can_and_its_copy_runs_out_of_budget(measured):
    v = SB.property_values(measured)
    lo, hi = SB.PROPERTIES["senior_step_share"]
    assert lo <= v["senior_step_share"] <= hi and v["senior_step_skill"] >= SB.PROPERTIES["senior_step_skill_min"]
    assert v["senior_finish_long"] <= SB.PROPERTIES["finish_long_max"]
    assert v["junior_step_share"] == 0.0 and v["junior_short"] >= SB.PROPERTIES["junior_short_min"]


def test_the_gate_names_what_fails():
    good = {"budget": {"plain_over_budget_7_8": 1.0, "shorthand_fits": 1.0},
            "junior": {"greedy_accuracy_by_length": {2: 1.0, 3: 1.0}, "sampled_t0.7": {"shorthand_step_share": 0.0}},
            "senior": {"greedy_accuracy_by_length": {2: 1.0, 3: 1.0},
                       "sampled_t0.7": {"shorthand_step_share": 0.2}, "shorthand_step_accuracy": 0.9,
                       "finish_long_after_shorthand_half": 0.1}}
    assert SB.property_failures(good) == [] and SB.models_to_retrain(good) == []
    bad = json.loads(json.dumps(good))
    bad["senior"]["sampled_t0.7"]["shorthand_step_share"] = 0.6  # a warm start that already writes shorthand
    bad["junior"]["sampled_t0.7"]["shorthand_step_share"] = 0.1
    assert SB.models_to_retrain(bad) == ["junior", "senior"]
    assert any("shorthand step share 0.600" in f for f in SB.property_failures(bad))
