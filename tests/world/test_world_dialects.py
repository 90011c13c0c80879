"""Tests of the third built-in world, ``dialects`` (``tandem-rlvr demo --world dialects``): its three styles,
splits and budget, the shipped build's integrity, and its promised properties (on the shipped build in the
default suite; on a rebuild from scratch under another build seed in the slow suite). ``-s`` shows the
measured properties."""

from __future__ import annotations

import json
import random

import pytest

from tandem_rlvr.world import dialects as D
from tandem_rlvr.world import dialects_build as DB
from tandem_rlvr.world import problems as P
from tandem_rlvr.world import shorthand as S


def test_the_three_styles_solve_every_problem_and_are_told_apart():
    rng = random.Random(12)
    for _ in range(500):
        prob = P.generate_problem(rng, rng.randint(2, 8))
        texts = {s: D.solution(prob, s) for s in D.STYLES}
        assert all(P.is_correct(t, prob.answer) for t in texts.values())
        assert texts["shorthand"] == S.shorthand_solution(prob)  # dialect A is the shorthand world's, unchanged
        ledger = D.steps(prob, "ledger")
        assert texts["ledger"].startswith(D.LEDGER_MARKER) and len(ledger) == len(prob.ops) + 1
        olds = [prob.start, *prob.values[:-1]]
        assert ledger[:-1] == [f"{x} {op.symbol}{op.operand} = {v}\n\n" for x, op, v in zip(olds, prob.ops, prob.values)]
        n = len(prob.ops)
        assert [D.style_counts(t) for t in texts.values()] == [(n, 0, 0), (0, n, 0), (0, 0, n)]
        assert [D.is_ledger(t) for t in texts.values()] == [False, False, True]
        assert [D.is_shorthand(t) for t in texts.values()] == [False, True, False]
        assert D.head(prob, "ledger", 2) == D.LEDGER_MARKER + "".join(ledger[:2])
    texts = [D.solution(prob, s) for s in D.STYLES] + ["no idea"]
    assert D.shorthand_rate(texts) == 0.25 and D.ledger_rate(texts) == 0.25 and D.ledger_rate([]) == 0.0
    assert D.shorthand_step_share(texts) == D.ledger_step_share(texts) == pytest.approx(1 / 3)


def test_the_warm_senior_is_taught_whole_ledger_chains_and_per_step_shorthand_the_junior_plain_only():
    rng, probs = random.Random(5), [P.generate_problem(random.Random(i), 6) for i in range(2000)]
    targets = [DB.sft_response(p, rng, D.LEDGER_SHARE) for p in probs]
    assert all(P.is_correct(t, p.answer) for t, p in zip(targets, probs))
    ledger = [t for t in targets if t.startswith(D.LEDGER_MARKER)]
    assert all(D.style_counts(t) == (0, 0, 6) for t in ledger)  # once begun, the whole chain
    assert not any(D.style_counts(t)[2] for t in targets if not t.startswith(D.LEDGER_MARKER))
    assert abs(len(ledger) / len(targets) - D.LEDGER_SHARE) < 0.03
    rest = [t for t in targets if not t.startswith(D.LEDGER_MARKER)]
    assert abs(D.shorthand_step_share(rest) - D.SHORTHAND_SHARE) < 0.03
    assert all(DB.sft_response(p, rng, 0.0) == P.plain_solution(p) for p in probs[:50])


def test_splits_are_deterministic_disjoint_and_loadable():
    from tandem_rlvr.data import load_examples

    splits = {name: D.generate_split(name) for name in D.SPLIT_SPECS}
    for name, probs in splits.items():
        assert len(probs) == D.SPLIT_SPECS[name]["size"] and len({p.signature for p in probs}) == len(probs)
    names = list(splits)
    for i, a in enumerate(names):
        for b in names[i + 1:]:
            assert not {p.signature for p in splits[a]} & {p.signature for p in splits[b]}, (a, b)
    assert {s["seed"] for s in D.SPLIT_SPECS.values()}.isdisjoint(s["seed"] for s in S.SPLIT_SPECS.values())
    test = load_examples("dialects/test")
    assert [e.answer for e in test] == [str(p.answer) for p in splits["test"]] and test[0].id == "dial-test-00000"
    with pytest.raises(ValueError):
        D.load_split("test_hard")


def test_the_other_worlds_recipe_keys_are_unchanged():
    """The arith and shorthand worlds keep their recipes (and so their shipped files and demo numbers)."""
    from tandem_rlvr.world.build import prebuilt_world, world_key

    assert world_key(world="arith") == "world-v1-ea8a805c50" and prebuilt_world("arith") is not None
    assert world_key(world="shorthand") == "shorthand-v1-e1976321b0" and prebuilt_world("shorthand") is not None
    assert world_key(world="dialects").startswith("dialects-v1-")


def test_the_demo_plans_this_world_under_its_budget_and_reads_dialect_a_as_its_jargon(tmp_path):
    from tandem_rlvr.demo import PLANS, style_rate, train_config

    full, quick = PLANS["dialects"]
    assert full.max_new_tokens == quick.max_new_tokens == D.BUDGET and full.seeds >= 5
    cfg = train_config("trlvr", 0, tmp_path / "r", full, "s", None, progress=False, world="dialects")
    assert (cfg.data.train, cfg.val.data, cfg.rollout.max_new_tokens) == ("dialects/train", "dialects/val", D.BUDGET)
    prob = P.generate_problem(random.Random(3), 5)
    texts = [D.solution(prob, s) for s in D.STYLES]
    assert style_rate("dialects")(texts) == pytest.approx(1 / 3) and style_rate("dialects")(texts[2:]) == 0.0


# ------------------------------------------------------------------------------ the built world


@pytest.fixture(scope="session")
def dialects_world(tmp_path_factory):
    """The shipped dialects world, installed into a temporary cache (no training)."""
    from tandem_rlvr.world.build import build_world

    return build_world(tmp_path_factory.mktemp("dialects_cache"), progress=False, world="dialects")


def test_the_shipped_world_is_intact_and_of_this_recipe(dialects_world):
    from tandem_rlvr.world.build import PREBUILT_DIR, is_complete, prebuilt_world, recipe

    shipped = prebuilt_world("dialects")
    assert shipped is not None, "no intact shipped dialects world for this recipe"
    assert sorted(p.name for p in PREBUILT_DIR.iterdir() if p.is_dir() and p.name.startswith("dialects-")) == [shipped.name]
    manifest = json.loads((shipped / "manifest.json").read_text())
    assert manifest["recipe"] == json.loads(json.dumps(recipe(world="dialects")))
    assert manifest["tries"][-1]["failures"] == [] and all(t["failures"] for t in manifest["tries"][:-1])
    assert is_complete(dialects_world.root, world="dialects")
    size = sum(p.stat().st_size for p in shipped.rglob("*") if p.is_file())
    assert size < 5_000_000


def test_the_budget_fits_both_dialects_but_not_long_plain_solutions(dialects_world):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(dialects_world.tokenizer_dir))
    facts = DB.budget_facts(tok)
    print("\nBUDGET " + json.dumps(facts))
    assert facts["plain_over_budget_7_8"] == 1.0 and facts["shorthand_fits"] == 1.0 and facts["ledger_fits"] == 1.0
    for n, tokens in facts["mean_tokens"].items():
        assert tokens["shorthand"] <= 0.5 * tokens["plain"] and tokens["ledger"] <= 0.65 * tokens["plain"], (n, tokens)
    marker = tok(D.LEDGER_MARKER, add_special_tokens=False)["input_ids"]
    firsts = {tok(D.solution(P.generate_problem(random.Random(1), 3), s), add_special_tokens=False)["input_ids"][0]
              for s in D.STYLES}
    assert len(marker) <= 2 and len(firsts) == 3  # a short marker line whose first token no other style starts with


@pytest.fixture(scope="session", params=["shipped", pytest.param(2234, marks=pytest.mark.slow)])
def measured(request, dialects_world, tmp_path_factory):
    """What the build's gate measures: on the shipped world, or on a rebuild from scratch (slow)."""
    from tandem_rlvr.world.build import build_world

    paths = dialects_world
    if request.param != "shipped":
        paths = build_world(tmp_path_factory.mktemp(f"dial{request.param}"), progress=False, prebuilt=False,
                            seed=request.param, world="dialects")
        print(f"\nREBUILD seed {request.param}: " + json.dumps(paths.manifest["tries"]))
    out = DB.measure_models(paths, count=DB.PROPERTY_COUNT)
    print(f"\nDIALECTS WORLD ({request.param}) " + json.dumps(DB.property_values(out)))
    return out


def test_the_promised_properties_hold(measured):
    assert DB.property_failures(measured) == []


def test_both_dialects_are_rare_skills_and_the_copy_follows_ledger_but_not_shorthand(measured):
    v, props = DB.property_values(measured), DB.PROPERTIES
    assert props["senior_step_share"][0] <= v["senior_step_share"] <= props["senior_step_share"][1]
    assert props["senior_ledger_rate"][0] <= v["senior_ledger_rate"] <= props["senior_ledger_rate"][1]
    assert v["senior_step_skill"] >= props["senior_step_skill_min"]
    assert v["senior_ledger_skill"] >= props["senior_ledger_skill_min"]
    assert v["senior_finish_ledger"] >= props["finish_ledger_min"] >= props["finish_long_max"] >= v["senior_finish_long"]
    assert v["junior_dialect_steps"] == 0.0 and v["junior_short"] >= props["junior_short_min"]


GOOD = {"budget": {"plain_over_budget_7_8": 1.0, "shorthand_fits": 1.0, "ledger_fits": 1.0},
        "junior": {"greedy_accuracy_by_length": {2: 1.0, 3: 1.0},
                   "sampled": {"shorthand_step_share": 0.0, "ledger_step_share": 0.0}},
        "senior": {"greedy_accuracy_by_length": {2: 1.0, 3: 1.0},
                   "sampled": {"shorthand_step_share": 0.15, "ledger_rate": 0.04},
                   "shorthand_step_accuracy": 0.9, "forced_ledger_accuracy_5_8": 0.7,
                   "finish_long_after_ledger_half": 0.8, "finish_long_after_shorthand_half": 0.1}}


@pytest.mark.parametrize("path, value, who, says", [
    ("budget.ledger_fits", 0.97, "senior", "ledger solutions within the budget 0.970"),
    ("senior.sampled.ledger_rate", 0.0, "senior", "ledger chain share 0.000 outside"),
    ("senior.sampled.ledger_rate", 0.3, "senior", "ledger chain share 0.300 outside"),
    ("senior.sampled.shorthand_step_share", 0.5, "senior", "shorthand step share 0.500 outside"),
    ("senior.forced_ledger_accuracy_5_8", 0.2, "senior", "forced ledger chains (5-8 ops) right 0.200"),
    ("senior.finish_long_after_ledger_half", 0.3, "senior", "after a ledger half 0.300"),
    ("senior.finish_long_after_shorthand_half", 0.7, "senior", "after a shorthand half 0.700"),
    ("junior.sampled.ledger_step_share", 0.05, "junior", "junior writes shorthand or ledger steps"),
])
def test_the_gate_names_what_fails(path, value, who, says):
    assert DB.property_failures(GOOD) == [] and DB.models_to_retrain(GOOD) == []
    bad = json.loads(json.dumps(GOOD))
    *parents, key = path.split(".")
    node = bad
    for p in parents:
        node = node[p]
    node[key] = value
    failures = DB.property_failures(bad)
    assert len(failures) == 1 and says in failures[0], failures
    assert DB.models_to_retrain(bad) == [who]
