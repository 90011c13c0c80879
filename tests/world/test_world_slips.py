"""Tests of the fourth built-in world, ``slips`` (``tandem-rlvr demo --world slips``): its two styles and the
warm start's slipping ledger, splits and budget, the shipped build's integrity, and its promised properties
(on the shipped build in the default suite; on a rebuild from scratch under another build seed in the slow
suite). ``-s`` shows the measured properties."""

from __future__ import annotations

import json
import random

import pytest

from tandem_rlvr.world import dialects as D
from tandem_rlvr.world import problems as P
from tandem_rlvr.world import slips as W
from tandem_rlvr.world import slips_build as WB


def test_both_gold_styles_solve_every_problem_and_are_told_apart():
    rng = random.Random(12)
    for _ in range(500):
        prob = P.generate_problem(rng, rng.randint(2, 8))
        texts = {s: W.solution(prob, s) for s in W.STYLES}
        assert all(P.is_correct(t, prob.answer) for t in texts.values())
        assert texts["ledger"] == D.ledger_solution(prob)  # the dialects world's ledger, unchanged
        n = len(prob.ops)
        assert [W.style_counts(t) for t in texts.values()] == [(n, 0), (0, n)]
        assert [W.is_ledger(t) for t in texts.values()] == [False, True]
        assert W.ledger_slips(texts.values()) == (0, n)
        assert W.head(prob, "ledger", 2) == D.LEDGER_MARKER + "".join(W.steps(prob, "ledger")[:2])
    texts = [W.solution(prob, s) for s in W.STYLES] + ["no idea"]
    assert W.ledger_rate(texts) == pytest.approx(1 / 3) and W.ledger_rate([]) == 0.0 and W.slip_rate(["x"]) == 0.0


def test_a_slip_is_one_too_high_and_carried_into_the_next_line_and_the_box():
    prob = P.Problem(text="", answer=4, start=5, ops=(P.Op("add", 3), P.Op("halve", 2)))

    class Always(random.Random):
        def random(self):
            return 0.0

    text = W.slipped_ledger_solution(prob, Always(), slip=0.5, slip_from=0)
    assert text == D.LEDGER_MARKER + "5 +3 = 9\n\n9 /2 = 5\n\n\\boxed{5}"  # 9 // 2 + 1: each line slips on its own
    assert W.line_slips(text) == [True, True] and W.ledger_slips([text]) == (2, 2)
    assert not P.is_correct(text, prob.answer)
    late = W.slipped_ledger_solution(prob, Always(), slip=0.5, slip_from=1)  # the first line never slips
    assert late == D.LEDGER_MARKER + "5 +3 = 8\n\n8 /2 = 5\n\n\\boxed{5}" and W.line_slips(late) == [False, True]
    assert W.ledger_slips([late], first=1) == (1, 1) and W.slip_rate([late, text], first=1) == 1.0
    assert W.slipped_ledger_solution(prob, random.Random(0), slip=0.0) == W.solution(prob, "ledger")
    assert W.slipped_ledger_solution(prob, Always(), slip=1.0, slip_from=2) == W.solution(prob, "ledger")
    assert W.ledger_slips(["3 *2 = 6\n\n6 -1 = 4\n\n"]) == (1, 2)  # read line by line


def test_the_warm_senior_is_taught_slipping_ledger_chains_and_the_junior_plain_only():
    rng, probs = random.Random(5), [P.generate_problem(random.Random(i), 6) for i in range(2000)]
    targets = [WB.sft_response(p, rng, W.LEDGER_SHARE) for p in probs]
    ledger = [t for t in targets if t.startswith(D.LEDGER_MARKER)]
    plain = [t for t in targets if not t.startswith(D.LEDGER_MARKER)]
    assert all(W.style_counts(t) == (0, 6) for t in ledger) and all(W.style_counts(t) == (6, 0) for t in plain)
    assert abs(len(ledger) / len(targets) - W.LEDGER_SHARE) < 0.03
    assert not any(any(W.line_slips(t)[:W.SLIP_FROM]) for t in ledger)  # no early slips
    assert abs(W.slip_rate(ledger, W.SLIP_FROM) - W.SLIP_RATE) < 0.03
    pairs = [(t, p) for t, p in zip(targets, probs) if t.startswith(D.LEDGER_MARKER)]
    clean = [P.is_correct(t, p.answer) for t, p in pairs if W.ledger_slips([t])[0] == 0]
    last_slipped = [P.is_correct(t, p.answer) for t, p in pairs if W.ledger_slips([t.split("\n\n")[-2]])[0]]
    assert all(clean) and clean and last_slipped and not any(last_slipped)  # a slip in the last line ends wrong
    assert abs(len(clean) / len(pairs) - (1 - W.SLIP_RATE) ** (6 - W.SLIP_FROM)) < 0.04
    assert all(P.is_correct(t, p.answer) for t, p in zip(targets, probs) if not t.startswith(D.LEDGER_MARKER))
    assert all(WB.sft_response(p, rng, 0.0) == P.plain_solution(p) for p in probs[:50])


def test_splits_are_deterministic_disjoint_and_loadable():
    from tandem_rlvr.data import load_examples

    splits = {name: W.generate_split(name) for name in W.SPLIT_SPECS}
    for name, probs in splits.items():
        assert len(probs) == W.SPLIT_SPECS[name]["size"] and len({p.signature for p in probs}) == len(probs)
    names = list(splits)
    for i, a in enumerate(names):
        for b in names[i + 1:]:
            assert not {p.signature for p in splits[a]} & {p.signature for p in splits[b]}, (a, b)
    assert {s["seed"] for s in W.SPLIT_SPECS.values()}.isdisjoint(s["seed"] for s in D.SPLIT_SPECS.values())
    test = load_examples("slips/test")
    assert [e.answer for e in test] == [str(p.answer) for p in splits["test"]] and test[0].id == "slip-test-00000"


def test_the_demo_plans_this_world_under_its_budget_and_reads_ledger_as_its_jargon(tmp_path):
    from tandem_rlvr.demo import PLANS, style_rate, train_config

    full, quick = PLANS["slips"]
    assert full.max_new_tokens == quick.max_new_tokens == W.BUDGET and full.seeds >= 5
    cfg = train_config("trlvr", 0, tmp_path / "r", full, "s", None, progress=False, world="slips")
    assert (cfg.data.train, cfg.val.data, cfg.rollout.max_new_tokens) == ("slips/train", "slips/val", W.BUDGET)
    prob = P.generate_problem(random.Random(3), 5)
    texts = [W.solution(prob, s) for s in W.STYLES]
    assert style_rate("slips")(texts) == pytest.approx(1 / 2) and style_rate("slips")(texts[:1]) == 0.0


GOOD = {"budget": {"plain_over_budget_7_8": 1.0, "ledger_fits": 1.0},
        "junior": {"greedy_accuracy_by_length": {2: 1.0, 3: 1.0}, "sampled": {"ledger_rate": 0.0}},
        "senior": {"greedy_accuracy_by_length": {2: 1.0, 3: 1.0}, "sampled": {"ledger_rate": 0.1},
                   "forced_ledger_2_4": 0.95, "forced_ledger_5_8": {"accuracy": 0.3, "slip_rate": 0.25},
                   "copy_after_ledger_half_eval": {"accuracy": 0.5, "slip_rate": 0.2}}}


@pytest.mark.parametrize("path, value, who, says", [
    ("budget.ledger_fits", 0.97, "senior", "ledger solutions within the budget 0.970"),
    ("senior.sampled.ledger_rate", 0.0, "senior", "ledger chain share 0.000 outside"),
    ("senior.sampled.ledger_rate", 0.4, "senior", "ledger chain share 0.400 outside"),
    ("senior.forced_ledger_2_4", 0.5, "senior", "forced ledger chains (2-4 ops) right 0.500"),
    ("senior.forced_ledger_5_8.slip_rate", 0.02, "senior", "forced ledger late-line slip rate 0.020 outside"),
    ("senior.forced_ledger_5_8.slip_rate", 0.6, "senior", "forced ledger late-line slip rate 0.600 outside"),
    ("senior.forced_ledger_5_8.accuracy", 0.01, "senior", "forced ledger chains (5-8 ops) right 0.010"),
    ("senior.copy_after_ledger_half_eval.slip_rate", 0.0, "senior", "evaluation's decoding 0.000"),
    ("junior.greedy_accuracy_by_length.2", 0.0, "junior", "junior short-chain accuracy 0.500"),
    ("junior.sampled.ledger_rate", 0.05, "junior", "junior writes ledger chains"),
])
def test_the_gate_names_what_fails(path, value, who, says):
    assert WB.property_failures(GOOD) == [] and WB.models_to_retrain(GOOD) == []
    bad = json.loads(json.dumps(GOOD))
    *parents, key = path.split(".")
    node = bad
    for p in parents:
        node = node[p]
    node[key] = value
    failures = WB.property_failures(bad)
    assert len(failures) == 1 and says in failures[0], failures
    assert WB.models_to_retrain(bad) == [who]


# ------------------------------------------------------------------------------ the built world


@pytest.fixture(scope="session")
def slips_world(tmp_path_factory):
    """The shipped slips world, installed into a temporary cache (no training)."""
    from tandem_rlvr.world.build import build_world

    return build_world(tmp_path_factory.mktemp("slips_cache"), progress=False, world="slips")


def test_the_shipped_world_is_intact_and_of_this_recipe(slips_world):
    from tandem_rlvr.world.build import PREBUILT_DIR, is_complete, prebuilt_world, recipe

    shipped = prebuilt_world("slips")
    assert shipped is not None, "no intact shipped slips world for this recipe"
    shipped_slips = [p.name for p in PREBUILT_DIR.iterdir() if p.is_dir() and p.name.startswith("slips-")]
    assert shipped_slips == [shipped.name]
    manifest = json.loads((shipped / "manifest.json").read_text())
    assert manifest["recipe"] == json.loads(json.dumps(recipe(world="slips")))
    assert manifest["tries"][-1]["failures"] == [] and all(t["failures"] for t in manifest["tries"][:-1])
    assert is_complete(slips_world.root, world="slips")
    size = sum(p.stat().st_size for p in shipped.rglob("*") if p.is_file())
    assert size < 5_000_000


def test_the_budget_fits_ledger_but_not_long_plain_solutions(slips_world):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(slips_world.tokenizer_dir))
    facts = WB.budget_facts(tok)
    print("\nBUDGET " + json.dumps(facts))
    assert facts["plain_over_budget_7_8"] == 1.0 and facts["ledger_fits"] == 1.0
    for n, tokens in facts["mean_tokens"].items():
        assert tokens["ledger"] <= 0.65 * tokens["plain"], (n, tokens)
    # the longest ledger solution leaves room for a slip's extra digit
    assert max(t["ledger"] for t in facts["max_tokens"].values()) <= W.BUDGET - 4


@pytest.fixture(scope="session", params=["shipped", pytest.param(2234, marks=pytest.mark.slow)])
def measured(request, slips_world, tmp_path_factory):
    """What the build's gate measures: on the shipped world, or on a rebuild from scratch (slow)."""
    from tandem_rlvr.world.build import build_world

    paths = slips_world
    if request.param != "shipped":
        paths = build_world(tmp_path_factory.mktemp(f"slips{request.param}"), progress=False, prebuilt=False,
                            seed=request.param, world="slips")
        print(f"\nREBUILD seed {request.param}: " + json.dumps(paths.manifest["tries"]))
    out = WB.measure_models(paths, count=WB.PROPERTY_COUNT)
    print(f"\nSLIPS WORLD ({request.param}) " + json.dumps(WB.property_values(out)))
    return out


def test_the_promised_properties_hold(measured):
    assert WB.property_failures(measured) == []


def test_ledger_is_a_rare_slipping_skill_and_the_copy_slips_where_the_demo_evaluates(measured):
    v, props = WB.property_values(measured), WB.PROPERTIES
    assert props["senior_ledger_rate"][0] <= v["senior_ledger_rate"] <= props["senior_ledger_rate"][1]
    assert props["senior_slip_rate"][0] <= v["senior_slip_rate"] <= props["senior_slip_rate"][1]
    assert v["senior_ledger_skill"] >= props["senior_ledger_skill_min"]
    assert v["senior_short_ledger"] >= props["senior_short_ledger_min"]
    assert v["copy_eval_slip"] >= props["copy_eval_slip_min"]
    assert v["junior_ledger_rate"] == 0.0 and v["junior_short"] >= props["junior_short_min"]
