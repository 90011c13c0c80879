"""The rollout-engine interface: what each engine serves, how it refuses the rest, and the in-process
engine's two modes reached from a config."""

import ast
import json
from types import SimpleNamespace

import pytest
import torch
from helpers.paths import ROOT
from helpers.run_files import write_config
from helpers.trainers import base_models  # noqa: F401 (fixture)
from helpers.trainers import tiny_trainer as _trainer, trainer_config as _cfg

from tandem_rlvr.engines.bridge import BridgeEngine
from tandem_rlvr.cli import main
from tandem_rlvr.config import ConfigError, load_config
from tandem_rlvr.engines.base import Engine, PromptBatch
from tandem_rlvr.engines.inprocess import InProcessEngine
from tandem_rlvr.engines.serving import BRIDGE, IN_PROCESS, VLLM, VLLM_SOLO
from tandem_rlvr.errors import BridgeError, EngineError
from tandem_rlvr.engines.handoff import SCHEDULES, make_schedule
from tandem_rlvr.engines.types import Sampling
from tandem_rlvr.engines.vllm_backend import VLLMEngine
from tandem_rlvr.engines.vllm_dual import DualVLLMEngine

SRC = ROOT / "src" / "tandem_rlvr"


def _engines(tokenizer, models):
    s, j = models
    kw = dict(eos_token_ids=[tokenizer.eos_token_id], pad_token_id=tokenizer.pad_token_id)
    local = InProcessEngine(s, j, **kw)
    params = dict(sampling_params_cls=lambda **k: SimpleNamespace(**k))
    vllm = DualVLLMEngine(SimpleNamespace(tandem_vocab=len(tokenizer)), **params, **kw)
    solo = VLLMEngine(object(), **params, **kw)
    return {"in-process": local, "vllm": vllm, "vllm solo": solo, "text bridge": BridgeEngine(s, tokenizer, j, tokenizer)}


def test_each_engine_declares_what_it_serves(tokenizer, base_models):  # noqa: F811
    engines = _engines(tokenizer, base_models)
    assert set(IN_PROCESS.schedules) == set(SCHEDULES)
    assert set(VLLM.schedules) == set(SCHEDULES) and set(BRIDGE.schedules) == {"step", "alternate"}
    assert set(VLLM_SOLO.schedules) == {"none"}
    for name in SCHEDULES:
        sch = make_schedule(name, tokenizer)
        for label, engine in engines.items():
            assert engine.serves(sch) == (name in engine.serving.schedules), (label, name)


@pytest.mark.parametrize("label,name", [("text bridge", "word"), ("text bridge", "none"), ("text bridge", "chunk"),
                                        ("text bridge", "bernoulli"), ("vllm solo", "word"), ("vllm solo", "step")])
def test_unserved_schedules_are_refused_naming_engine_and_schedule(tokenizer, base_models, label, name):  # noqa: F811
    engine = _engines(tokenizer, base_models)[label]
    prompts = PromptBatch.left_padded([[5, 6, 7]], tokenizer.pad_token_id, problems=["1+1?"])
    err = BridgeError if label == "text bridge" else EngineError
    with pytest.raises(err, match=f"schedule {name!r} is not served by the {label} engine"):
        engine.generate(prompts, make_schedule(name, tokenizer), Sampling(4))


def test_the_in_process_engine_serves_every_schedule_in_both_modes(tokenizer, base_models):  # noqa: F811
    s, j = base_models
    enc = tokenizer(["What is 1 plus 1?", "Hi"], return_tensors="pt", padding=True)
    prompts = PromptBatch(enc.input_ids, enc.attention_mask)
    kw = dict(eos_token_ids=[tokenizer.eos_token_id], pad_token_id=tokenizer.pad_token_id, record_junior=True)
    for name in SCHEDULES:
        sch = make_schedule(name, tokenizer, p=0.5)
        ref = InProcessEngine(s, j, mode="lockstep", **kw).generate(prompts, sch, Sampling(12), seed=3)
        got = InProcessEngine(s, j, mode="catchup", **kw).generate(prompts, sch, Sampling(12), seed=3)
        assert torch.equal(ref.response_ids_BT, got.response_ids_BT) and torch.equal(ref.owner_BT, got.owner_BT), name
        assert ref.response_mask_BT.sum() > 0


def test_rollout_mode_is_checked_and_documented():
    with pytest.raises(ConfigError, match="rollout.mode.*lockstep or catchup"):
        load_config(None, ["model.senior=s", "model.junior=j", "rollout.mode=fast"])
    from tandem_rlvr.config import describe

    assert "rollout.mode (default 'lockstep')" in describe()


@pytest.mark.parametrize("arm,schedule", [("trlvr", "word"), ("trlvr", "step"), ("grpo", "word")])
def test_lockstep_and_catchup_give_the_same_rollouts_from_a_config(tmp_path, tokenizer, base_models, arm,  # noqa: F811
                                                                   schedule):
    runs = []
    for mode in ("lockstep", "catchup"):
        cfg = _cfg(tmp_path / mode, arm, f"rollout.mode={mode}", f"handoff.schedule={schedule}")
        tr = _trainer(cfg, tokenizer, base_models)
        assert isinstance(tr.engine, InProcessEngine) and tr.engine.mode == mode
        runs.append(tr.rollout(0)[0])
    ref, got = runs
    for key in ("response_ids_BT", "response_mask_BT", "owner_BT", "rounds_B", "finished_B"):
        assert torch.equal(getattr(ref, key), getattr(got, key)), key
    torch.testing.assert_close(ref.senior_logps_BT, got.senior_logps_BT, rtol=1e-4, atol=1e-4)
    if arm == "trlvr":
        torch.testing.assert_close(ref.junior_logps_BT, got.junior_logps_BT, rtol=1e-4, atol=1e-4)
        owned = ref.owner_BT[ref.response_mask_BT.bool()].float().mean()
        assert 0 < owned < 1, "the fixture must hand off"


def test_cli_train_in_catchup_mode_writes_every_output(tmp_path, model_dirs):
    cfg = write_config(tmp_path, model_dirs, "trlvr", steps=2, save_every=1)
    assert main(["train", str(cfg), "rollout.mode=catchup", "algo.senior_frac_band=[0.0,1.0]"]) == 0
    run = tmp_path / "run"
    assert json.loads((run / "metrics.jsonl").read_text().splitlines()[-1])["step"] == 2
    assert "mode: catchup" in (run / "config.yaml").read_text()
    assert (run / "checkpoints" / "step-1" / "model.safetensors").exists()
    assert (run / "final" / "model.safetensors").exists() and (run / "final" / "config.json").exists()


def _is_engine(node) -> bool:
    """``engine`` or ``<anything>.engine``: how the trainer, the run builder and the evaluation hold their engine."""
    return (isinstance(node, ast.Name) and node.id == "engine") or (isinstance(node, ast.Attribute)
                                                                      and node.attr == "engine")


def engine_members_used() -> dict[str, set[str]]:
    """``member -> modules`` for every member of an engine read outside ``engines/``: ``engine.x``, ``job.engine.x``,
    ``getattr(engine, "x", ...)`` / ``hasattr(...)``."""
    used: dict[str, set[str]] = {}
    for path in sorted(SRC.rglob("*.py")):
        if path.parent.name == "engines":
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            name = None
            if isinstance(node, ast.Attribute) and _is_engine(node.value):
                name = node.attr
            elif (isinstance(node, ast.Call) and getattr(node.func, "id", None) in ("getattr", "hasattr")
                  and len(node.args) >= 2 and _is_engine(node.args[0]) and isinstance(node.args[1], ast.Constant)):
                name = node.args[1].value
            if name is not None:
                used.setdefault(name, set()).add(path.stem)
    return used


def test_the_interface_lists_every_member_its_callers_use():
    members = {n for n in vars(Engine) if not n.startswith("_")} | set(Engine.__annotations__)
    used = engine_members_used()
    assert {"generate_many", "sync_senior", "sleep", "close", "own_weights", "check"} <= set(used), used  # the scan works
    missing = {name: sorted(mods) for name, mods in used.items() if name not in members}
    assert not missing, f"engine members used but not in the Engine protocol (tandem_rlvr.engines.base): {missing}"


def test_every_engine_class_implements_the_interface(tokenizer, base_models):  # noqa: F811
    declared = set()
    for path in (SRC / "engines").glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ClassDef) and any(getattr(b, "id", None) == "EngineBase" for b in node.bases):
                declared.add(node.name)
    engines = _engines(tokenizer, base_models)
    assert declared == {type(e).__name__ for e in engines.values()}, "every engine class is checked here"
    for label, engine in engines.items():
        assert isinstance(engine, Engine), label
