"""The world registry: one record per built-in world, and every place that differs by world reads it."""

import hashlib
import json
import logging

import pytest

import tandem_rlvr.world.registry as R
from tandem_rlvr.world.registry import DEFAULT_WORLD, WORLDS, UnknownWorldError, get_world

RECIPE_API = ("VERSION", "recipe", "model_specs", "tokenizer_corpus", "measure_models", "property_failures",
              "models_to_retrain", "property_values", "PROPERTY_COUNT", "MAX_TRIES", "train_problem", "sft_response")


def test_an_unknown_world_is_one_line_naming_the_known_ones():
    assert get_world("shorthand") is WORLDS["shorthand"] and DEFAULT_WORLD == "arith"
    with pytest.raises(UnknownWorldError, match=r"^world must be one of arith, shorthand, dialects, slips, got 'nowhere'$"):
        get_world("nowhere")
    with pytest.raises(UnknownWorldError, match="demo world must be one of"):
        get_world(None, "demo world")


@pytest.mark.parametrize("name", list(WORLDS))
def test_every_record_names_what_it_promises(name):
    world = get_world(name)
    recipe = world.recipe_module()
    assert [a for a in RECIPE_API if not hasattr(recipe, a)] == []
    examples = world.split_loader()("val")
    assert examples and all(e.answer for e in examples)
    rate = world.style_rate()
    assert rate([]) == 0.0 and 0.0 <= rate([e.problem for e in examples]) <= 1.0
    assert world.model_aliases and all(a.endswith((":senior", ":junior")) for a in world.model_aliases)
    assert world.title and world.description and world.source


def test_names_are_unique_across_worlds():
    sources = R.source_names()
    aliases = [a for w in WORLDS.values() for a in w.model_aliases]
    prefixes = [w.key_prefix for w in WORLDS.values()]
    assert len(set(sources)) == len(sources) and len(set(aliases)) == len(aliases) and len(set(prefixes)) == len(prefixes)


def test_the_arith_world_is_loaded_by_its_name_and_its_old_one_warns_once(caplog, monkeypatch):
    from tandem_rlvr.data import load_examples

    monkeypatch.setattr(R, "_WARNED", set())
    with caplog.at_level(logging.WARNING, logger="tandem_rlvr.world.registry"):
        new = load_examples("arith/val")
        assert not caplog.records, "the new name warns nothing"
        old = load_examples("world/val")
        again = load_examples("world/test", limit=3)
    assert old == new and again == load_examples("arith/test", limit=3)
    warned = [r.getMessage() for r in caplog.records]
    assert len(warned) == 1 and "'world/<split>' is the old name" in warned[0] and "'arith/<split>'" in warned[0]


def test_model_aliases_build_their_own_world(monkeypatch):
    import tandem_rlvr.world.build as build
    from tandem_rlvr import models
    from tandem_rlvr.world.build import WorldPaths

    built = []

    def fake_build(*, world):
        built.append(world)
        root = build.Path("/cache") / world
        return WorldPaths(root, root / "tokenizer", root / "senior", root / "junior")

    monkeypatch.setattr(build, "build_world", fake_build)
    assert models.resolve_name("world:senior") == "/cache/arith/senior"
    assert models.resolve_name("arith:junior") == "/cache/arith/junior"
    assert models.resolve_name("shorthand:senior") == "/cache/shorthand/senior"
    assert models.resolve_name("dialects:junior") == "/cache/dialects/junior"
    assert models.resolve_name("slips:senior") == "/cache/slips/senior"
    assert built == ["arith", "arith", "shorthand", "dialects", "slips"]
    for name in ("Qwen/Qwen3-0.6B", "world:teacher", "nowhere:senior", "./world:senior", "senior"):
        assert models.resolve_name(name) == name
    assert set(models.WORLD_MODELS) == {"world:senior", "world:junior", "arith:senior", "arith:junior",
                                        "shorthand:senior", "shorthand:junior", "dialects:senior", "dialects:junior",
                                        "slips:senior", "slips:junior"}


def test_the_demo_command_offers_the_registered_worlds(monkeypatch):
    from tandem_rlvr.cli import build_parser

    extra = R.World(name="extra", source="extra", splits="x:y", recipe="x", style="x:y", description="a test world",
                    title="t", key_prefix="extra", model_prefixes=("extra",))
    monkeypatch.setattr(R, "WORLDS", {**WORLDS, "extra": extra})
    parser = build_parser()
    assert parser.parse_args(["demo", "--world", "extra"]).world == "extra"
    demo = next(a for a in parser._subparsers._group_actions[0].choices["demo"]._actions if a.dest == "world")
    assert "extra: a test world" in demo.help and demo.default == "arith"


def _batches_digest(world: str, spec, n: int = 12) -> str:
    from transformers import AutoTokenizer

    from tandem_rlvr.world.build import prebuilt_world
    from tandem_rlvr.world.sft import BatchMaker

    maker, h = BatchMaker(AutoTokenizer.from_pretrained(str(prebuilt_world(world) / "tokenizer")), spec, world), hashlib.sha256()
    for _ in range(n):
        b = maker.next()
        h.update(json.dumps([b["input_ids"].tolist(), b["labels"].tolist()]).encode())
    return h.hexdigest()[:16]


# Token ids of the first warm-start batches, recorded before the registry (when sft.py chose each world's
# styles by name): integers from a seeded Python RNG and a fixed tokenizer, the same on every machine.
BATCHES = {("arith", "senior"): "56baf6da49d7a408", ("arith", "junior"): "e5555d21068c92a0",
           ("shorthand", "senior"): "85425c242a9a2c31"}


@pytest.mark.parametrize("world, role", list(BATCHES))
def test_the_warm_starts_train_on_the_batches_they_trained_on_before(world, role):
    spec = get_world(world).recipe_module().model_specs()[role]
    assert _batches_digest(world, spec) == BATCHES[(world, role)]


@pytest.mark.parametrize("name", list(WORLDS))
def test_a_build_follows_its_worlds_recipe(name, tmp_path, monkeypatch):
    """``build_world(world=name)`` takes the tokenizer corpus, the model specs, the gate and the cache key from
    the world's recipe module (training and measuring faked)."""
    from tandem_rlvr.world import build, train_workers

    world, trained = get_world(name), []
    recipe = world.recipe_module()

    def train_models(specs, tok_dir, out, progress, world):
        trained.append((world, {k: v.to_dict() for k, v in specs.items()}))
        for spec_name in specs:
            (out / spec_name).mkdir(parents=True, exist_ok=True)
            (out / spec_name / "model.safetensors").write_bytes(spec_name.encode())
        return {spec_name: {"parameters": 1} for spec_name in specs}

    monkeypatch.setattr(train_workers, "train_models", train_models)
    monkeypatch.setattr(recipe, "measure_models", lambda paths, count: {"count": count})
    monkeypatch.setattr(recipe, "property_failures", lambda measured: [])
    monkeypatch.setattr(recipe, "property_values", lambda measured: {"count": measured["count"]})
    corpus = recipe.tokenizer_corpus()
    monkeypatch.setattr(recipe, "tokenizer_corpus", lambda seed: corpus[:300])  # a smaller tokenizer: faster
    paths = build.build_world(tmp_path, progress=False, prebuilt=False, world=name)
    specs = recipe.model_specs()
    assert trained == [(name, {k: specs[k].to_dict() for k in ("junior", "senior")})]
    assert paths.root.name == build.world_key(world=name) and paths.root.name.startswith(f"{world.key_prefix}-v")
    assert paths.manifest["recipe"] == json.loads(json.dumps(recipe.recipe(1234)))
    assert paths.manifest["tries"][0]["properties"] == {"count": recipe.PROPERTY_COUNT}
