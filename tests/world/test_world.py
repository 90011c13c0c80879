"""Tests of the built-in arithmetic world: generator, splits, styles, tokenizer, cache, warm starts.

One world is built from scratch per session into a temporary cache (about a minute on two cores);
the model-behaviour tests share it. ``-s`` shows the measured report.
"""

from __future__ import annotations

import json
import random
import shutil

from dataclasses import replace

import pytest
import torch

from tandem_rlvr.world import problems as P
from tandem_rlvr.world.properties import PROPERTIES, PROPERTY_COUNT
from tandem_rlvr.world.rules import MAX_TRIES, TRY_SEED_STEP

# ----------------------------------------------------------------------------- generator / splits


def test_generator_answers_match_an_independent_text_solver():
    rng = random.Random(2024)
    for _ in range(3000):
        n = rng.randint(P.MIN_OPS, P.MAX_OPS)
        prob = P.generate_problem(rng, n)
        assert len(prob.ops) == n
        assert P.solve_problem_text(prob.text) == prob.answer
        assert all(0 <= v <= P.MAX_VALUE for v in [prob.start, *prob.values])
        assert P.is_correct(P.plain_solution(prob), prob.answer)
        assert P.is_correct(P.jargon_solution(prob), str(prob.answer))
        assert not P.is_correct(P.plain_solution(prob), prob.answer + 1)


def test_generator_is_deterministic_under_a_seed():
    a = [P.generate_problem(random.Random(7), 5) for _ in range(3)]
    b = [P.generate_problem(random.Random(7), 5) for _ in range(3)]
    assert a == b
    assert P.generate_problem(random.Random(8), 5) != a[0]


def test_splits_are_deterministic_sized_and_disjoint():
    splits = {name: P.generate_split(name) for name in P.SPLIT_SPECS}
    for name, probs in splits.items():
        spec = P.SPLIT_SPECS[name]
        assert len(probs) == spec["size"]
        lo, hi = spec["ops"]
        assert all(lo <= len(p.ops) <= hi for p in probs)
        assert len({p.signature for p in probs}) == len(probs)
    assert max(len(p.ops) for p in splits["test_hard"]) > max(len(p.ops) for p in splits["train"])
    names = list(splits)
    for i, a in enumerate(names):
        for b in names[i + 1 :]:
            assert not {p.signature for p in splits[a]} & {p.signature for p in splits[b]}, (a, b)
            assert not {p.text for p in splits[a]} & {p.text for p in splits[b]}, (a, b)
    examples = P.load_split("val")
    assert examples == P.load_split("val")
    assert [e.answer for e in examples] == [str(p.answer) for p in splits["val"]]
    assert len({e.id for e in P.load_split("train")}) == 2000
    with pytest.raises(ValueError):
        P.load_split("dev")


def test_sft_stream_stays_in_the_train_bucket():
    held_out = {p.signature for name in ("val", "test", "test_hard") for p in P.generate_split(name)}
    stream = P.sft_problems(seed=3)
    for _ in range(2000):
        _, prob = next(stream)
        assert prob.signature not in held_out
        assert P.in_buckets(prob, P.SPLIT_SPECS["train"]["buckets"])


def test_style_detector_and_grader():
    prob = P.generate_problem(random.Random(1), 6)
    plain, jargon = P.plain_solution(prob), P.jargon_solution(prob)
    assert not P.is_jargon(plain) and P.is_jargon(jargon)
    assert P.jargon_rate([plain, jargon, jargon, "no idea"]) == 0.5
    assert P.jargon_rate([]) == 0.0
    assert plain.count("\n\n") == 6 and jargon.count("\n\n") == 3
    assert jargon.count("<<") == 6  # every operation as a calculator note, two per step
    assert P.world_boxed(r"so \boxed{3} then \boxed{\frac{1}{2}}") == r"\frac{1}{2}"
    assert not P.is_correct("no box", 3) and not P.is_correct(r"\boxed{x}", 3)


# ------------------------------------------------------------------------------ shared world


@pytest.fixture(scope="session")
def tok(world):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(world[0].tokenizer_dir))


BUILD_SEEDS = (1234, 2234, 3234)  # the shipped recipe's seed and two more (slow: a gated build each)


@pytest.fixture(scope="session", params=["shipped", *(pytest.param(s, marks=pytest.mark.slow) for s in BUILD_SEEDS)])
def built(request, world, tmp_path_factory):
    """The world the behaviour tests measure: the shipped one (default run), or a rebuild from scratch on
    this machine under each build seed (slow: a few minutes per try)."""
    if request.param == "shipped":
        return world[0]
    from tandem_rlvr.world.build import build_world

    paths = build_world(tmp_path_factory.mktemp(f"rebuild{request.param}"), progress=False, prebuilt=False,
                        seed=request.param)
    print(f"\nREBUILD seed {request.param}: " + json.dumps(paths.manifest["tries"]))
    return paths


@pytest.fixture(scope="session")
def report(built):
    from tandem_rlvr.world.probe import world_report

    rep = world_report(built, count=PROPERTY_COUNT)
    print("\nWORLD REPORT\n" + json.dumps(rep, indent=1))
    return rep


def test_prompt_is_the_library_prompt(tok):
    """The world's prompts are the library's (one instruction, one renderer): its chat template, one user turn."""
    from tandem_rlvr.data import PROMPT_SUFFIX, render_prompt

    prob = P.generate_problem(random.Random(0), 3)
    text = render_prompt(tok, prob.text)
    assert text == f"<|im_start|>user\n{prob.text}{PROMPT_SUFFIX}<|im_end|>\n<|im_start|>assistant\n"


def test_tokenizer_is_tight_and_marks_word_starts(world, tok):
    from transformers import AutoTokenizer

    assert tok.eos_token == "<|im_end|>" and tok.pad_token == "<|endoftext|>" and tok.padding_side == "left"
    assert len(tok) <= 1024
    for d in range(10):
        assert len(tok.encode(str(d))) == 1 and len(tok.encode(f" {d}")) == 1
    assert any(t.startswith("Ġ") for t in tok.convert_ids_to_tokens(tok.encode(" Add 3: 9 + 3 = 12.")))
    from tandem_rlvr.data import render_prompt

    prob = P.generate_problem(random.Random(5), 8)
    full = render_prompt(tok, prob.text) + P.plain_solution(prob)
    assert len(tok.encode(full)) < 260
    for d in (world[0].senior_dir, world[0].junior_dir):  # a model folder must load the same tokenizer
        assert AutoTokenizer.from_pretrained(str(d)).encode(full) == tok.encode(full)


def test_build_is_cached_and_verified(world, monkeypatch):
    from tandem_rlvr.world import build
    from tandem_rlvr.world.build import build_world, is_complete

    paths = world[0]
    assert is_complete(paths.root)

    def no_work(*a, **k):
        raise AssertionError("a cache hit must neither build nor copy the world")

    monkeypatch.setattr(build, "_build_into", no_work)
    monkeypatch.setattr(build.shutil, "copytree", no_work)
    again = build_world(paths.root.parent, progress=False)
    assert again == paths
    assert paths.junior("self") == paths.senior_dir and paths.junior("weak") == paths.junior_dir
    for d in (paths.senior_dir, paths.junior_dir):
        assert (d / "model.safetensors").is_file() and (d / "tokenizer.json").is_file()
    assert not list(paths.root.parent.glob(".tmp-*"))


def test_a_damaged_or_interrupted_build_is_not_trusted(world, tmp_path, monkeypatch):
    from tandem_rlvr.world import build

    copy = tmp_path / world[0].root.name
    shutil.copytree(world[0].root, copy)
    assert build.is_complete(copy)
    (copy / "junior" / "model.safetensors").write_bytes(b"truncated")
    assert not build.is_complete(copy)
    (copy / "manifest.json").unlink()
    assert not build.is_complete(copy)

    def killed(tmp, progress, seed, world):
        (tmp / "senior").mkdir()
        (tmp / "senior" / "model.safetensors").write_bytes(b"half")
        raise KeyboardInterrupt

    cache = tmp_path / "cache"
    monkeypatch.setattr(build, "_build_into", killed)
    with pytest.raises(KeyboardInterrupt):
        build.build_world(cache, progress=False, prebuilt=False)
    assert not (cache / build.world_key()).exists()
    assert not list(cache.glob(".tmp-*"))


def test_the_shipped_world_is_intact_and_of_this_recipe(world):
    """The package ships the world of the current recipe (so the first demo needs no build): every file
    matches its manifest, the manifest's recipe is this one, and the build's last try kept the properties.
    Its bytes are what the build made on the machine that built it; another CPU model may round
    differently and train other weights (a rebuild there is checked for the same properties, slow)."""
    from tandem_rlvr.world.build import PREBUILT_DIR, is_complete, prebuilt_world, recipe

    shipped = prebuilt_world()
    assert shipped is not None, ("no intact shipped world for this recipe: rebuild it and copy the cache "
                                 "folder to src/tandem_rlvr/world/prebuilt/ (see docs)")
    assert [p.name for p in PREBUILT_DIR.iterdir() if p.is_dir() and p.name.startswith("world-")] == [shipped.name]  # no stale world shipped (other worlds' folders have their own prefix)
    manifest = json.loads((shipped / "manifest.json").read_text())
    assert manifest["recipe"] == json.loads(json.dumps(recipe())) and is_complete(world[0].root)
    assert manifest["tries"] and manifest["tries"][-1]["failures"] == [] and manifest["tries"][0]["trained"] == ["junior", "senior"]
    assert all(t["failures"] for t in manifest["tries"][:-1])


def test_a_rebuild_on_one_machine_is_reproducible(tmp_path):
    """Seeded single-threaded training: the same spec trained twice on this machine gives the same bytes."""
    from tandem_rlvr.world.arith_build import JUNIOR_SPEC
    from tandem_rlvr.world.train_workers import train_models

    tok_dir = tmp_path / "tok"
    from tandem_rlvr.data import PROMPT_SUFFIX
    from tandem_rlvr.world.arith_build import tokenizer_corpus
    from tandem_rlvr.world.build import DIGIT_PATTERN, build_tokenizer

    build_tokenizer(tokenizer_corpus()[:400], 512, tok_dir, pattern=DIGIT_PATTERN, extra_tokens=[PROMPT_SUFFIX])
    spec = replace(JUNIOR_SPEC, steps=30, short_steps=10, ramp_every=5, hidden=32, intermediate=64)
    tables = []
    for run in ("a", "b"):
        train_models({"junior": spec}, tok_dir, tmp_path / run, progress=False)
        tables.append((tmp_path / run / "junior" / "model.safetensors").read_bytes())
    assert tables[0] == tables[1]


def _fake_training(monkeypatch, outcomes):
    """Stand-ins for training and measuring: each try 'trains' instantly and measures ``outcomes[try]``."""
    from tandem_rlvr.world import build, probe, train_workers

    seeds = []

    def train_models(specs, tok_dir, out, progress, world):
        seeds.append({k: v.seed for k, v in specs.items()})
        for name in specs:
            (out / name).mkdir(parents=True, exist_ok=True)
            (out / name / "model.safetensors").write_bytes(f"{name}{seeds[-1][name]}".encode())
        return {name: {"parameters": 1, "train_seconds": 0.0} for name in specs}

    def measure(paths, count):
        good = outcomes[len(seeds) - 1]
        acc = {n: (0.1 if good and n >= 7 else 0.9) for n in range(2, 9)}  # bad: the junior as good as the senior
        side = {"greedy_accuracy_by_length": acc, "continue_after_plain_step": 0.9, "continue_after_jargon_step": 0.1,
                "sampled_t0.7": {"jargon_rate": 0.0, "accuracy_jargon": float("nan"), "accuracy_plain": 0.5}}
        senior = {**side, "greedy_accuracy_by_length": {n: 0.9 for n in range(2, 9)},
                  "sampled_t0.7": {"jargon_rate": 0.4, "accuracy_jargon": 0.5, "accuracy_plain": 0.5}}
        return {"junior": side, "senior": senior}

    monkeypatch.setattr(train_workers, "train_models", train_models)
    monkeypatch.setattr(probe, "measure_models", measure)
    return seeds


def test_a_build_retrains_with_the_next_seeds_until_the_properties_hold(tmp_path, monkeypatch):
    from tandem_rlvr.world import build

    seeds = _fake_training(monkeypatch, [False, False, True])  # a junior as good as the senior: no margin
    paths = build.build_world(tmp_path, progress=False, prebuilt=False)
    tries = paths.manifest["tries"]
    assert [t["try"] for t in tries] == [0, 1, 2] and [t["trained"] for t in tries] == [["junior", "senior"], ["senior"], ["senior"]]
    assert seeds[1] == {"senior": seeds[0]["senior"] + TRY_SEED_STEP}  # the failing model only, next seed
    assert tries[2]["seeds"] == {"junior": seeds[0]["junior"], "senior": seeds[0]["senior"] + 2 * TRY_SEED_STEP}
    assert "senior's margin over the junior" in tries[0]["failures"][0] and tries[2]["failures"] == []
    assert (paths.senior_dir / "model.safetensors").read_bytes() == f"senior{seeds[2]['senior']}".encode()
    assert (paths.junior_dir / "model.safetensors").read_bytes() == f"junior{seeds[0]['junior']}".encode()


def test_a_build_whose_tries_all_fail_stops_with_every_try_named(tmp_path, monkeypatch):
    from tandem_rlvr.world import build

    _fake_training(monkeypatch, [False] * MAX_TRIES)
    with pytest.raises(build.WorldBuildError) as e:
        build.build_world(tmp_path, progress=False, prebuilt=False)
    assert f"no try of {MAX_TRIES}" in str(e.value) and f"try {MAX_TRIES - 1}:" in str(e.value)
    assert not (tmp_path / build.world_key()).exists() and not list(tmp_path.glob(".tmp-*"))


def test_a_cache_miss_installs_the_shipped_world(tmp_path, monkeypatch):
    from tandem_rlvr.world import build

    def no_training(*a, **k):
        raise AssertionError("the shipped world matches the recipe: nothing is trained")

    monkeypatch.setattr(build, "_build_into", no_training)
    paths = build.build_world(tmp_path, progress=False)
    assert build.is_complete(paths.root)
    assert paths.root == tmp_path / build.world_key() and not list(tmp_path.glob(".tmp-*"))


def test_models_are_small_and_loadable(built, report):
    from transformers import AutoModelForCausalLM

    for name, d in (("junior", built.junior_dir), ("senior", built.senior_dir)):
        model = AutoModelForCausalLM.from_pretrained(str(d))
        assert sum(p.numel() for p in model.parameters()) == report[name]["parameters"]
    assert 200_000 <= report["junior"]["parameters"] < report["senior"]["parameters"] <= 5_000_000


def test_sft_is_deterministic(tok):
    from tandem_rlvr.world.sft import ModelSpec, train_sft

    spec = ModelSpec(name="t", hidden=32, layers=1, intermediate=64, heads=2, kv_heads=1, steps=4, batch=4, seed=5)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        a, b = train_sft(spec, tok), train_sft(spec, tok)
    finally:
        torch.set_num_threads(threads)
    for (ka, va), (kb, vb) in zip(a.state_dict().items(), b.state_dict().items()):
        assert ka == kb and torch.equal(va, vb)


# --------------------------------------------------------------------------- model behaviour

def test_the_promised_properties_hold(report):
    """Every property a build checks (world.properties.PROPERTIES), on the world measured here."""
    from tandem_rlvr.world.properties import property_failures

    assert property_failures(report) == []


def test_junior_solves_short_plain_problems(report):
    acc = report["junior"]["greedy_accuracy_by_length"]
    assert (acc[2] + acc[3]) / 2 >= PROPERTIES["junior_short_min"], acc


def test_junior_continues_plain_but_not_jargon(report):
    j = report["junior"]
    assert j["continue_after_plain_step"] >= PROPERTIES["junior_short_min"]
    assert j["continue_after_plain_step"] - j["continue_after_jargon_step"] >= PROPERTIES["plain_jargon_gap"], j
    assert j["sampled_t0.7"]["jargon_rate"] == 0.0


def test_senior_beats_junior_on_long_chains(report):
    s, j = report["senior"]["greedy_accuracy_by_length"], report["junior"]["greedy_accuracy_by_length"]
    assert (s[7] + s[8]) / 2 >= (j[7] + j[8]) / 2 + PROPERTIES["senior_long_margin"], (s, j)


def test_senior_uses_both_styles(report):
    sampled = report["senior"]["sampled_t0.7"]
    lo, hi = PROPERTIES["senior_jargon_rate"]
    assert lo <= sampled["jargon_rate"] <= hi, sampled
    floor = PROPERTIES["style_accuracy_min"]
    assert sampled["accuracy_jargon"] > floor and sampled["accuracy_plain"] > floor, sampled
