"""One engine specification and one constructor: the training config and the evaluation options each become an
:class:`EngineSpec`, and :func:`build_engine` makes every engine from one (vLLM replaced by stand-ins here; the
real engines start in tests/engines/test_vllm*.py, slow)."""

import sys
from types import ModuleType, SimpleNamespace

import pytest

from tandem_rlvr.config import load_config
from tandem_rlvr.engines import vllm_dual
from tandem_rlvr.engines.bridge import BridgeEngine
from tandem_rlvr.engines.factory import build_engine, vllm_kwargs
from tandem_rlvr.engines.inprocess import InProcessEngine
from tandem_rlvr.engines.spec import EngineSpec
from tandem_rlvr.engines.vllm_backend import VLLMEngine
from tandem_rlvr.engines.vllm_dual import DualVLLMEngine
from tandem_rlvr.errors import BridgeError, EngineError
from tandem_rlvr.training.engine_spec import spec_from_config

VLLM_KEYS = ["rollout.engine=vllm", "model.dtype=float32", "rollout.vllm_memory=0.5", "rollout.vllm_timeout_s=30",
             "rollout.vllm_sleep=kv", "train.seed=7", "model.trust_remote_code=true", "model.max_context=9000",
             "rollout.max_prompt_tokens=100", "rollout.max_new_tokens=20", "algo.arm=trlvr", "handoff.schedule=word"]


def _cfg(*extra, junior="jun"):
    return load_config(None, ["model.senior=sen", f"model.junior={junior}", *extra])


def test_the_spec_of_a_training_run_reads_every_engine_key():
    spec = spec_from_config(_cfg(*VLLM_KEYS), "word", processes=2)
    assert spec == EngineSpec(kind="vllm", schedules=("word",), mode="lockstep", record_junior=True, senior_path="sen",
                              junior_path="jun", dtype="float32", memory=0.5, max_model_len=120, seed=7, timeout_s=30.0,
                              sleep="kv", trust_remote_code=True, long_context=True, processes=2)
    assert spec_from_config(_cfg(*VLLM_KEYS, "rollout.vllm_dtype=bfloat16"), "word").dtype == "bfloat16"
    assert spec_from_config(_cfg(*VLLM_KEYS), "word", max_model_len=700).max_model_len == 700
    paired = spec_from_config(_cfg(*VLLM_KEYS, "model.self_paired=true", junior=""), "step")
    assert (paired.senior_path, paired.junior_path) == ("sen", "sen"), "self-paired: the senior's start weights"
    solo = spec_from_config(_cfg(*VLLM_KEYS), "none")
    assert solo.solo and solo.junior_path == "" and not spec.solo
    revs = ["model.revision=v2", "model.junior_revision=j1"]  # the revisions the trainer loads, the engine reads
    assert (spec_from_config(_cfg(*VLLM_KEYS, *revs), "word").senior_revision,
            spec_from_config(_cfg(*VLLM_KEYS, *revs), "word").junior_revision) == ("v2", "j1")
    paired = spec_from_config(_cfg(*VLLM_KEYS, "model.self_paired=true", "model.revision=v2", junior=""), "step")
    assert (paired.senior_revision, paired.junior_revision) == ("v2", "v2"), "the senior's start weights"
    assert spec_from_config(_cfg(*VLLM_KEYS, *revs), "none").junior_revision == ""
    hf = spec_from_config(_cfg("rollout.mode=catchup"), "word")
    assert (hf.kind, hf.mode, hf.vllm, hf.senior_path) == ("hf", "catchup", False, "")
    bridge = spec_from_config(_cfg(*VLLM_KEYS), "step", bridge=True)
    assert bridge.bridge and not bridge.vllm and bridge.serving().engine == "text bridge"


def test_training_and_evaluation_settings_start_the_same_vllm_engine():
    from tandem_rlvr.cli import build_parser
    from tandem_rlvr.evaluation import eval_cli

    flags = ["eval", "--senior", "sen", "--junior", "jun", "--benchmark", "gsm8k", "--engine", "vllm",
             "--vllm-memory", "0.5", "--seed", "7", "--trust-remote-code", "--max-context", "9000"]
    opts = eval_cli.resolve_options(build_parser().parse_args(flags))
    ev = eval_cli._engine_spec(opts, "sen", "jun", "float32", 120)
    tr = spec_from_config(_cfg(*VLLM_KEYS, "rollout.vllm_sleep=off"), "word")
    assert vllm_kwargs(ev) == vllm_kwargs(tr) == dict(dtype="float32", gpu_memory_utilization=0.5, seed=7,
                                                      max_model_len=120, trust_remote_code=True)
    assert (ev.senior_path, ev.junior_path, ev.long_context, ev.timeout_s) == ("sen", "jun", True, EngineSpec().timeout_s)
    assert not ev.solo and set(ev.schedules) == {"none", "alternate", "word"}, "solo, handoff and the curve"
    assert eval_cli._engine_spec(opts, "sen", "jun", "float32").max_model_len == opts.context


@pytest.fixture
def fake_vllm(monkeypatch):
    """``vllm`` as far as the engine classes read it (sampling parameters), and the dual engine's start recorded."""
    mod = ModuleType("vllm")
    mod.SamplingParams = lambda **k: SimpleNamespace(**k)
    monkeypatch.setitem(sys.modules, "vllm", mod)
    made = []

    def dual_llm(senior, junior, *, make, **kw):
        made.append(("dual", senior, junior, kw))
        return SimpleNamespace(tandem_vocab=64)

    monkeypatch.setattr(vllm_dual, "make_dual_llm", dual_llm)
    monkeypatch.setenv("VLLM_ALLOW_LONG_MAX_MODEL_LEN", "0")
    return made, lambda path, **kw: made.append(("solo", path, kw)) or SimpleNamespace()


def test_build_engine_makes_each_kind_from_its_spec(fake_vllm, tmp_path, monkeypatch):
    import os

    from helpers.hub_cache import cache_hub_model

    cache = cache_hub_model(tmp_path / "hub", monkeypatch, "org/sen", {"main": "a" * 40, "v2": "b" * 40}, {"config.json": "{}"})
    sen = str(cache / "models--org--sen" / "snapshots" / ("b" * 40))  # what vLLM reads: the snapshot at the revision
    jun = tmp_path / "jun"
    jun.mkdir()
    made, make = fake_vllm
    kw = dict(eos_token_ids=[2, 3], pad_token_id=0, make=make)
    local = build_engine(EngineSpec(mode="catchup", record_junior=True, schedules=("word",)), "S", "J", **kw)
    assert isinstance(local, InProcessEngine) and (local.senior, local.junior, local.mode) == ("S", "J", "catchup")
    assert local.record_junior and local.eos == [2, 3]
    bridge = build_engine(EngineSpec(bridge=True, schedules=("step",)), "S", "J", tokenizer="t", junior_tokenizer="u", **kw)
    assert isinstance(bridge, BridgeEngine) and (bridge.tok, bridge.jtok) == ("t", "u")
    assert not made and os.environ["VLLM_ALLOW_LONG_MAX_MODEL_LEN"] == "0", "no vLLM engine for hf or the bridge"

    vllm = dict(kind="vllm", senior_path="org/sen", senior_revision="v2", junior_path=str(jun), timeout_s=30.0,
                max_model_len=120, memory=0.5, seed=7)
    dual = build_engine(EngineSpec(schedules=("word",), processes=2, long_context=True, **vllm), "S", "J", **kw)
    assert isinstance(dual, DualVLLMEngine) and dual.timeout_s == 30.0 and dual.V == 64
    assert made.pop() == ("dual", sen, str(jun), dict(dtype="bfloat16", gpu_memory_utilization=0.5, seed=7,
                                                     max_model_len=120, trust_remote_code=False,
                                                     distributed_executor_backend="external_launcher"))
    assert os.environ["VLLM_ALLOW_LONG_MAX_MODEL_LEN"] == "1", "long_context: vLLM allows the stated context"
    solo = build_engine(EngineSpec(schedules=("none",), **vllm), "S", None, **kw)
    assert isinstance(solo, VLLMEngine) and solo.timeout_s == 30.0
    assert made == [("solo", sen, dict(dtype="bfloat16", gpu_memory_utilization=0.5, seed=7, max_model_len=120,
                                         trust_remote_code=False))]


def test_build_engine_refuses_an_unserved_schedule_before_building():
    with pytest.raises(BridgeError, match="schedule 'word' is not served by the text bridge engine"):
        build_engine(EngineSpec(bridge=True, schedules=("step", "word")), None, None, eos_token_ids=[2], pad_token_id=0)


@pytest.mark.parametrize("bad,match", [
    (dict(kind="sglang"), "kind='sglang' must be one of hf, vllm"),
    (dict(mode="fast"), "mode='fast' must be one of lockstep, catchup"),
    (dict(schedules=("wrod",)), "schedules=.*must be one or more of"),
    (dict(schedules=()), "schedules=.*must be one or more of"),
    (dict(sleep="deep"), "sleep='deep'"),
    (dict(memory=0), "memory=0 must be in"),
    (dict(timeout_s=0), "timeout_s=0 must be positive"),
    (dict(max_model_len=0), "max_model_len=0"),
    (dict(processes=0), "processes=0"),
    (dict(kind="vllm", schedules=("word",), senior_path="sen"), "needs senior_path and junior_path"),
    (dict(kind="vllm"), "needs senior_path$"),
])
def test_a_spec_refuses_a_bad_value_naming_the_field(bad, match):
    with pytest.raises(EngineError, match=match):
        EngineSpec(**bad)
