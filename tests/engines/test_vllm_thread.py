"""Both vLLM engines' engine thread, environment and shutdown, with stand-ins for vLLM (no vLLM needed).

- every call runs on a thread that takes the caller's CUDA device (vLLM sets ``cuda:LOCAL_RANK`` in the
  thread that builds the engine; the current device is per thread);
- both engines run behind ``rollout.vllm_timeout_s`` and report :class:`EngineFault`; a late answer of an
  abandoned call never reaches a later one;
- ``close()`` shuts the engine core down once, on the engine thread, and never waits on a hung one;
- both engine constructors run with the V1 model runner pinned and async scheduling off.
"""

from __future__ import annotations

import sys
import threading
from types import ModuleType, SimpleNamespace

import pytest
import torch

from tandem_rlvr.engines.vllm_backend import VLLMEngine
from tandem_rlvr.engines.vllm_dual import DualVLLMEngine, EngineFault, EngineThread

V = 320  # a multiple of 64 (no padding rows), as Qwen3's 151,936


class StandInLLM:
    """A ``vllm.LLM`` whose ``generate`` records its thread and hangs (until released) or raises on demand, and
    whose engine core records its shutdowns."""

    tandem_vocab = V

    def __init__(self, fault: str | None = None):
        self.fault, self.release, self.returned = fault, threading.Event(), threading.Event()
        self.threads: list[str] = []
        self.shutdowns: list[str] = []
        self.llm_engine = SimpleNamespace(engine_core=SimpleNamespace(
            shutdown=lambda: self.shutdowns.append(threading.current_thread().name)))

    def generate(self, reqs, params, use_tqdm=False):
        self.threads.append(threading.current_thread().name)
        if self.fault == "hang":
            self.release.wait(60)
            self.returned.set()
        if self.fault == "raise":
            raise RuntimeError("CUDA error: an illegal memory access was encountered")
        return [SimpleNamespace(outputs=[SimpleNamespace(token_ids=[5, 0])]) for _ in reqs]

    def reset_prefix_cache(self):
        pass


def _engine(kind: str, llm, timeout_s: float = 30.0):
    kw = dict(eos_token_ids=[0], pad_token_id=1, sampling_params_cls=lambda **k: SimpleNamespace(**k))
    eng = (DualVLLMEngine if kind == "dual" else VLLMEngine)(llm, **kw)
    eng.timeout_s = timeout_s
    if kind == "dual":
        eng.set_solo = lambda solo: None
    return eng


def _generate(eng):
    from tandem_rlvr.engines.base import PromptBatch
    from tandem_rlvr.engines.handoff import make_schedule
    from tandem_rlvr.engines.types import Sampling

    return eng.generate(PromptBatch.left_padded([[3, 4], [5]], 1), make_schedule("none"), Sampling(4, 0.0), seed=0)


@pytest.fixture
def cuda_calls(monkeypatch):
    """CUDA as on rank 1 of a 2-GPU run: the creating thread is on device 1; ``set_device`` calls recorded."""
    calls: list[tuple[int, str]] = []
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 1)
    monkeypatch.setattr(torch.cuda, "set_device", lambda d: calls.append((d, threading.current_thread().name)))
    return calls


def test_the_engine_thread_works_on_the_device_of_the_thread_that_made_it(cuda_calls):
    thread = EngineThread()
    name = thread.call(lambda: threading.current_thread().name, 30, "a call")
    assert name != threading.current_thread().name
    assert cuda_calls == [(1, name)]  # once, on the engine thread, before the call


@pytest.mark.parametrize("kind", ["dual", "solo"])
def test_both_engines_call_vllm_on_a_thread_on_the_callers_device(cuda_calls, kind):
    llm = StandInLLM()
    eng = _engine(kind, llm)
    ro = _generate(eng)
    assert ro.response_ids_BT[:, 0].tolist() == [5, 5]
    assert llm.threads == [llm.threads[0]] and llm.threads[0] != threading.current_thread().name
    assert cuda_calls == [(1, llm.threads[0])]


@pytest.mark.parametrize("kind", ["dual", "solo"])
@pytest.mark.parametrize("fault", ["raise", "hang"])
def test_both_engines_report_a_fault_or_a_hang_as_one_engine_fault(kind, fault):
    llm = StandInLLM(fault)
    eng = _engine(kind, llm, timeout_s=0.5)
    try:
        with pytest.raises(EngineFault, match="illegal memory access" if fault == "raise" else "within 0.5 s") as e:
            _generate(eng)
        assert "\n" not in str(e.value) and "last checkpoint is kept" in str(e.value)
    finally:
        llm.release.set()


def test_a_late_answer_of_an_abandoned_call_never_reaches_a_later_call():
    thread, release = EngineThread(), threading.Event()
    with pytest.raises(EngineFault, match="within 0.2 s"):
        thread.call(lambda: release.wait(60) and "stale", 0.2, "a rollout")
    release.set()
    with pytest.raises(EngineFault, match="still busy with a rollout"):
        thread.call(lambda: "fresh", 30, "the weight push")


@pytest.mark.parametrize("kind", ["dual", "solo"])
def test_close_shuts_the_engine_core_down_once_on_the_engine_thread(kind):
    llm = StandInLLM()
    eng = _engine(kind, llm)
    _generate(eng)
    eng.close()
    eng.close()
    assert llm.shutdowns == llm.threads  # once, on the thread that made every call
    with pytest.raises(EngineFault, match="closed"):
        _generate(eng)


@pytest.mark.parametrize("kind", ["dual", "solo"])
def test_close_after_a_hang_returns_and_never_queues_behind_the_hung_call(kind):
    llm = StandInLLM("hang")
    eng = _engine(kind, llm, timeout_s=0.2)
    with pytest.raises(EngineFault, match="within 0.2 s"):
        _generate(eng)
    closer = threading.Thread(target=eng.close, daemon=True)
    closer.start()
    closer.join(30)  # a hang detector, not a speed bound: the hung call waits for the release, 60 s
    assert not closer.is_alive()
    llm.release.set()
    assert llm.returned.wait(30)
    eng.close()
    # the engine thread is free again: a shutdown queued behind the hung call would run now
    assert not threading.Event().wait(0.5) and llm.shutdowns == []


# -- what both engines are built with ---------------------------------------------------------------------
@pytest.fixture
def fake_vllm(monkeypatch, tmp_path):
    """A ``vllm`` module whose ``LLM`` records the environment and arguments it is built with."""
    built: list[dict] = []
    vllm, envs = ModuleType("vllm"), ModuleType("vllm.envs")

    def LLM(**kw):
        import os

        built.append({"V2": os.environ.get("VLLM_USE_V2_MODEL_RUNNER"),
                      "inproc": os.environ.get("VLLM_ENABLE_V1_MULTIPROCESSING"), **kw})
        return SimpleNamespace()

    vllm.LLM, vllm.envs = LLM, envs
    envs.disable_envs_cache = lambda: None
    monkeypatch.setitem(sys.modules, "vllm", vllm)
    monkeypatch.setitem(sys.modules, "vllm.envs", envs)
    for var in ("VLLM_USE_V2_MODEL_RUNNER", "VLLM_ENABLE_V1_MULTIPROCESSING"):
        monkeypatch.setenv(var, "1")  # restored (unset) after the test: the pin must come from the constructor
        monkeypatch.delenv(var)
    return built


def test_both_engine_constructors_pin_the_v1_runner_and_turn_async_scheduling_off(fake_vllm, monkeypatch, tmp_path):
    from transformers import Qwen2Config

    from tandem_rlvr.engines import vllm_backend, vllm_dual

    vllm_backend.make_llm(str(tmp_path))  # the solo engine of the GRPO and KL-Reg arms
    assert fake_vllm[-1]["V2"] == "0" and fake_vllm[-1]["async_scheduling"] is False
    monkeypatch.delenv("VLLM_USE_V2_MODEL_RUNNER")
    Qwen2Config(vocab_size=V, hidden_size=32, num_hidden_layers=1, num_attention_heads=1,
                architectures=["Qwen2ForCausalLM"]).save_pretrained(str(tmp_path))
    dual_model = ModuleType("tandem_rlvr.engines.vllm_dual_model")
    dual_model.ARCH, dual_model.TandemLogitsProcessor, dual_model.register = "TandemForCausalLM", object, lambda: None
    monkeypatch.setitem(sys.modules, "tandem_rlvr.engines.vllm_dual_model", dual_model)
    monkeypatch.setattr(vllm_dual, "check_vllm_internals", lambda: None)
    vllm_dual.make_dual_llm(str(tmp_path), str(tmp_path))
    built = fake_vllm[-1]
    assert built["V2"] == "0" and built["async_scheduling"] is False and built["inproc"] == "0"
    assert built["hf_overrides"]["vocab_size"] == 2 * V + 1
