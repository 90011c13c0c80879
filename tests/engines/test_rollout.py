"""The rollout engine: correctness of KV-cached lockstep decoding and its ownership records."""

import copy

import pytest
import torch

from tandem_rlvr.engines.handoff import make_schedule
from tandem_rlvr.engines.rollout import generate
from tandem_rlvr.engines.types import Sampling
from tandem_rlvr.training.trainer import sequence_logps
from helpers.numeric import assert_close_to_scale
from helpers.tiny_models import bias_token, make_tiny_model

PROBLEMS = ["What is 3 plus 4?", "hi", "Tom has 12 apples and gives away 5 of them. How many are left?"]


@pytest.fixture(scope="module")
def pair(tokenizer):
    return make_tiny_model(len(tokenizer), 0, 48), make_tiny_model(len(tokenizer), 1, 32)


@pytest.fixture(scope="module")
def batch(tokenizer):
    texts = [tokenizer.apply_chat_template([{"role": "user", "content": p}], add_generation_prompt=True, tokenize=False)
             for p in PROBLEMS]
    enc = tokenizer(texts, return_tensors="pt", padding=True)
    assert (enc.attention_mask[:, 0] == 0).any(), "fixture must exercise left padding"
    return enc.input_ids, enc.attention_mask


def _gen(tokenizer, senior, junior, batch, schedule, sampling, **kw):
    return generate(senior, junior, *batch, schedule, sampling, eos_token_ids=[tokenizer.eos_token_id],
                    pad_token_id=tokenizer.pad_token_id, **kw)


def test_greedy_solo_matches_transformers_generate(tokenizer, pair, batch):
    senior, _ = pair
    r = _gen(tokenizer, senior, None, batch, make_schedule("none"), Sampling(max_new_tokens=24, temperature=0))
    ref = senior.generate(input_ids=batch[0], attention_mask=batch[1], max_new_tokens=24, do_sample=False,
                          pad_token_id=tokenizer.pad_token_id, eos_token_id=tokenizer.eos_token_id)
    T = r.response_ids_BT.shape[1]
    assert torch.equal(ref[:, batch[0].shape[1]:][:, :T], r.response_ids_BT)


def test_recorded_logps_equal_teacher_forced_scores(tokenizer, pair, batch):
    """KV-cached, left-padded incremental decoding gives the same log-probs as one full forward."""
    senior, junior = pair
    sampling = Sampling(max_new_tokens=20, temperature=0.8)
    r = _gen(tokenizer, senior, junior, batch, make_schedule("bernoulli", p=0.5), sampling, seed=5)
    m = r.response_mask_BT.bool()
    with torch.no_grad():
        s = sequence_logps(senior, r, 0.8)
        j = sequence_logps(junior, r, 0.8)
    torch.testing.assert_close(r.senior_logps_BT[m], s[m], atol=1e-4, rtol=0)
    torch.testing.assert_close(r.junior_logps_BT[m], j[m], atol=1e-4, rtol=0)
    assert 0.2 < r.senior_token_frac() < 0.8


def test_p1_tandem_equals_solo_token_for_token(tokenizer, pair, batch):
    senior, junior = pair
    sampling = Sampling(max_new_tokens=30, temperature=1.0, top_k=50, top_p=0.95)
    solo = _gen(tokenizer, senior, None, batch, make_schedule("none"), sampling, seed=11)
    tandem = _gen(tokenizer, senior, junior, batch, make_schedule("word", tokenizer, p=1.0), sampling, seed=11)
    assert torch.equal(solo.response_ids_BT, tandem.response_ids_BT)
    assert torch.equal(solo.response_mask_BT, tandem.response_mask_BT)
    assert torch.equal(tandem.owner_BT, tandem.response_mask_BT)
    torch.testing.assert_close(solo.senior_logps_BT, tandem.senior_logps_BT)


def test_self_paired_junior_gives_solo_rollout(tokenizer, pair, batch):
    senior, _ = pair
    twin = copy.deepcopy(senior)
    sampling = Sampling(max_new_tokens=24, temperature=0.7)
    solo = _gen(tokenizer, senior, None, batch, make_schedule("none"), sampling, seed=3)
    tandem = _gen(tokenizer, senior, twin, batch, make_schedule("word", tokenizer, p=0.5), sampling, seed=3)
    assert torch.equal(solo.response_ids_BT, tandem.response_ids_BT)
    assert (tandem.owner_BT[tandem.response_mask_BT.bool()] == 0).any()


@pytest.mark.parametrize("name", ["word", "sentence"])
def test_owner_matches_simulated_schedule(tokenizer, pair, batch, name):
    from tandem_rlvr.engines.handoff import simulate

    senior, junior = pair
    sch = make_schedule(name, tokenizer, p=0.5, max_gap=4)
    r = _gen(tokenizer, senior, junior, batch, sch, Sampling(max_new_tokens=25, temperature=1.0), seed=2)
    owner, _ = simulate(sch, r.response_ids_BT, seed=2)  # the rollout's seed: the same coin stream
    m = r.response_mask_BT.bool()
    assert torch.equal(owner[m], r.owner_BT[m])


def test_eos_ends_each_sequence_and_pads_after(tokenizer, batch):
    always = bias_token(make_tiny_model(len(tokenizer), 0, 32), tokenizer.eos_token_id, 100.0)
    r = _gen(tokenizer, always, None, batch, make_schedule("none"), Sampling(max_new_tokens=10, temperature=1.0))
    assert r.response_ids_BT.shape[1] == 1 and r.finished_B.all() and (r.response_mask_BT.sum(-1) == 1).all()

    sometimes = bias_token(make_tiny_model(len(tokenizer), 0, 32), tokenizer.eos_token_id, 4.0)
    big = tuple(x.repeat(8, 1) for x in batch)
    r = _gen(tokenizer, sometimes, None, big, make_schedule("none"), Sampling(max_new_tokens=30, temperature=1.0), seed=4)
    lengths = r.response_mask_BT.sum(-1)
    assert len(set(lengths.tolist())) > 2, "EOS should arrive at different steps per sequence"
    for i in range(r.batch_size):
        n = int(lengths[i])
        row = r.response_ids_BT[i]
        assert r.response_mask_BT[i, :n].all() and not r.response_mask_BT[i, n:].any()
        assert (row[n:] == tokenizer.pad_token_id).all()
        eos_at = (row[:n] == tokenizer.eos_token_id).nonzero()
        if r.finished_B[i]:
            assert eos_at.numel() == 1 and int(eos_at[0]) == n - 1
        else:
            assert eos_at.numel() == 0 and n == r.response_ids_BT.shape[1]


def test_max_rounds_and_budget(tokenizer, pair, batch):
    senior, junior = pair
    sch = make_schedule("bernoulli", p=0.5)
    r = _gen(tokenizer, senior, junior, batch, sch, Sampling(max_new_tokens=40, temperature=1.0), seed=1, max_rounds=3)
    assert (r.rounds_B <= 3).all()
    for i in range(r.batch_size):
        turns = r.turns(tokenizer, i)
        assert len(turns) <= 3
        assert sum(t["tokens"] for t in turns) == int(r.response_mask_BT[i].sum())
    r = _gen(tokenizer, senior, junior, batch, sch, Sampling(max_new_tokens=7, temperature=1.0), seed=1)
    assert r.response_ids_BT.shape[1] <= 7


def test_rounds_count_the_turns_written(tokenizer, batch):
    """``rounds_B`` is 1 + the changes of author among a row's written tokens: a turn that the coin after its
    last token starts (at EOS, at the budget, past max_rounds) is never written and not counted."""
    eos = tokenizer.eos_token_id
    senior = bias_token(make_tiny_model(len(tokenizer), 0, 48), eos, 2.0)  # rows of varied lengths, most ending on EOS
    junior = bias_token(make_tiny_model(len(tokenizer), 1, 32), eos, 2.0)
    sch = make_schedule("bernoulli", p=0.5)
    for max_rounds, budget in ((None, 40), (3, 40), (None, 6)):
        r = _gen(tokenizer, senior, junior, batch, sch, Sampling(max_new_tokens=budget, temperature=1.0), seed=1,
                 max_rounds=max_rounds)
        for b in range(r.batch_size):
            n = int(r.response_mask_BT[b].sum())
            own = r.owner_BT[b, :n]
            assert int(r.rounds_B[b]) == 1 + int((own[1:] != own[:-1]).sum()), (max_rounds, budget, b)


def test_schedule_needing_junior_without_one_raises(tokenizer, pair, batch):
    with pytest.raises(ValueError, match="needs a junior"):
        _gen(tokenizer, pair[0], None, batch, make_schedule("word", tokenizer, p=0.5), Sampling(max_new_tokens=4))


# --- engine modes and fast path ------------------------------------------------------------------

def _same_rollout(a, b):
    assert torch.equal(a.response_ids_BT, b.response_ids_BT)
    assert torch.equal(a.response_mask_BT, b.response_mask_BT)
    assert torch.equal(a.owner_BT, b.owner_BT)
    assert torch.equal(a.rounds_B, b.rounds_B) and torch.equal(a.finished_B, b.finished_B)
    assert_close_to_scale(a.senior_logps_BT, b.senior_logps_BT)
    assert (a.junior_logps_BT is None) == (b.junior_logps_BT is None)
    if a.junior_logps_BT is not None:
        assert_close_to_scale(a.junior_logps_BT, b.junior_logps_BT)


@pytest.mark.parametrize("name,kw,record,max_rounds", [
    ("word", {"p": 0.5, "max_gap": 4}, True, None),
    ("bernoulli", {"p": 0.3}, True, 6),
    ("chunk", {"p": 0.5, "chunk_size": 5}, True, None),
    ("sentence", {"p": 0.5, "max_gap": 6}, True, 5),
    ("none", {}, True, None),
    ("word", {"p": 1.0}, False, None),
])
def test_catchup_equals_lockstep(tokenizer, batch, name, kw, record, max_rounds):
    """Catch-up (a model reads the tokens it missed in one forward) gives the lockstep rollout."""
    senior = bias_token(make_tiny_model(len(tokenizer), 0, 48), tokenizer.eos_token_id, 3.0)  # ragged EOS
    junior = make_tiny_model(len(tokenizer), 1, 32)
    sch = make_schedule(name, tokenizer, **kw)
    big = tuple(x.repeat(3, 1) for x in batch)
    sampling = Sampling(max_new_tokens=40, temperature=0.9, top_k=40)
    runs = [_gen(tokenizer, senior, junior, big, sch, sampling, seed=7, mode=m, record_junior=record,
                 max_rounds=max_rounds) for m in ("lockstep", "catchup")]
    _same_rollout(*runs)
    assert len(set(runs[0].response_mask_BT.sum(-1).tolist())) > 1, "want sequences of different lengths"


def test_catchup_on_one_row_and_tiny_logit_budget(tokenizer, pair, batch, monkeypatch):
    from tandem_rlvr.engines import rollout

    senior, junior = pair
    one = (batch[0][2:], batch[1][2:])
    sch = make_schedule("word", tokenizer, p=0.5)
    ref = _gen(tokenizer, senior, junior, one, sch, Sampling(max_new_tokens=30), seed=1)
    monkeypatch.setattr(rollout, "LOGITS_BUDGET", 1)  # catch-up windows split into one-token forwards
    _same_rollout(ref, _gen(tokenizer, senior, junior, one, sch, Sampling(max_new_tokens=30), seed=1, mode="catchup"))


def test_unknown_mode_raises(tokenizer, pair, batch):
    with pytest.raises(ValueError, match="rollout mode"):
        _gen(tokenizer, pair[0], None, batch, make_schedule("none"), Sampling(max_new_tokens=2), mode="fast")


@pytest.mark.parametrize("arch", ["qwen2", "llama"])
def test_fast_path_equals_generic_path(tokenizer, batch, arch, monkeypatch):
    """Preallocated caches (grown past their first capacity), 4-D mask slices and GQA-in-SDPA change
    nothing but speed; the models' attention setting is restored afterwards."""
    from tandem_rlvr.engines import fastpath

    senior = make_tiny_model(len(tokenizer), 0, 48, arch=arch)
    junior = make_tiny_model(len(tokenizer), 1, 32, arch=arch)
    assert fastpath.fast_ok(senior) and fastpath.fast_ok(junior)
    sch = make_schedule("word", tokenizer, p=0.5)
    sampling = Sampling(max_new_tokens=300, temperature=1.0)  # > the cache's first capacity (P + 256)
    fast = _gen(tokenizer, senior, junior, batch, sch, sampling, seed=3)
    assert senior.config._attn_implementation == "sdpa" and junior.config._attn_implementation == "sdpa"
    monkeypatch.setattr(fastpath, "FAST_PATH", False)
    assert not fastpath.fast_ok(senior)
    generic = _gen(tokenizer, senior, junior, batch, sch, sampling, seed=3)
    _same_rollout(fast, generic)


def test_sliding_window_model_takes_generic_path(tokenizer, batch):
    from transformers import Qwen2Config, Qwen2ForCausalLM

    from tandem_rlvr.engines import fastpath

    torch.manual_seed(0)
    cfg = Qwen2Config(vocab_size=len(tokenizer), hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, use_sliding_window=True, sliding_window=8,
                      max_window_layers=0, pad_token_id=0)
    model = Qwen2ForCausalLM(cfg).eval()
    assert not fastpath.fast_ok(model)
    r = _gen(tokenizer, model, None, batch, make_schedule("none"), Sampling(max_new_tokens=20, temperature=0))
    ref = model.generate(input_ids=batch[0], attention_mask=batch[1], max_new_tokens=20, do_sample=False,
                         pad_token_id=tokenizer.pad_token_id, eos_token_id=tokenizer.eos_token_id)
    assert torch.equal(ref[:, batch[0].shape[1]:][:, :r.response_ids_BT.shape[1]], r.response_ids_BT)


def test_gqa_attention_is_exact_and_restores(tokenizer, batch):
    from tandem_rlvr.engines.rollout import gqa_attention

    model = make_tiny_model(len(tokenizer), 0, 48)
    with torch.no_grad():
        ref = model(input_ids=batch[0], attention_mask=batch[1]).logits
        with gqa_attention(model, model):
            assert model.config._attn_implementation != "sdpa"
            with gqa_attention(model):  # re-entrant
                got = model(input_ids=batch[0], attention_mask=batch[1]).logits
            assert model.config._attn_implementation != "sdpa"
    assert model.config._attn_implementation == "sdpa"
    assert torch.equal(ref, got)


def test_a_model_that_names_its_attention_itself_keeps_sdpa(tokenizer, batch):
    """Falcon compares ``config._attn_implementation`` to ``"sdpa"`` in its own code instead of looking the
    function up: renamed for the GQA fast path it would take its eager branch and add SDPA's boolean mask to the
    scores (future and padding positions visible). It keeps plain SDPA, and the rollout's recorded log-probs
    equal a teacher-forced forward of transformers' model, fast path on."""
    from transformers import FalconConfig, FalconForCausalLM

    from tandem_rlvr.engines.rollout import gqa_attention

    torch.manual_seed(0)
    falcon = FalconForCausalLM(FalconConfig(vocab_size=len(tokenizer), hidden_size=32, num_hidden_layers=2,
                                            num_attention_heads=4, pad_token_id=tokenizer.pad_token_id)).eval()
    with gqa_attention(falcon):
        assert falcon.config._attn_implementation == "sdpa"
    r = _gen(tokenizer, falcon, None, batch, make_schedule("none"), Sampling(max_new_tokens=8, temperature=1.0), seed=0)
    scored = sequence_logps(falcon, r, 1.0)
    m = r.response_mask_BT.bool()
    assert_close_to_scale(r.senior_logps_BT[m], scored[m])
    with torch.no_grad():  # one unpadded row through transformers' own forward, no engine code at all
        row = 1 if r.prompt_mask_BP[1].all() else 0
        n = int(r.response_mask_BT[row].sum())
        full = torch.cat([r.prompt_ids_BP[row][r.prompt_mask_BP[row].bool()], r.response_ids_BT[row, :n]])[None]
        logits = falcon(input_ids=full).logits[0, -n - 1:-1].log_softmax(-1)
        plain = logits.gather(-1, r.response_ids_BT[row, :n, None]).squeeze(-1)
    assert_close_to_scale(r.senior_logps_BT[row, :n], plain)


def test_lora_adapter_off_junior(tokenizer, batch):
    """Self-paired LoRA: the junior is the base weights (adapter off) and the adapter stays on for the senior."""
    peft = pytest.importorskip("peft")
    from tandem_rlvr.engines import fastpath
    from tandem_rlvr.models import AdapterOff

    base = make_tiny_model(len(tokenizer), 0, 48)
    twin = copy.deepcopy(base)
    lora = peft.get_peft_model(base, peft.LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"],
                                                     lora_dropout=0.0, task_type="CAUSAL_LM")).eval()
    with torch.no_grad():
        for n, p in lora.named_parameters():
            if "lora_B" in n:
                p.normal_(0, 0.5)  # a trained-looking adapter (B starts at 0)
        before = lora(input_ids=batch[0], attention_mask=batch[1]).logits
    junior = AdapterOff(lora)
    assert fastpath.adapter_off_call(junior) is not None
    sch = make_schedule("word", tokenizer, p=0.5)
    sampling = Sampling(max_new_tokens=24, temperature=0.8)
    r = _gen(tokenizer, lora, junior, batch, sch, sampling, seed=2)
    ref = _gen(tokenizer, lora, twin, batch, sch, sampling, seed=2)  # the base weights as a separate model
    assert torch.equal(r.response_ids_BT, ref.response_ids_BT) and torch.equal(r.owner_BT, ref.owner_BT)
    assert_close_to_scale(r.junior_logps_BT, ref.junior_logps_BT)
    with torch.no_grad():
        assert torch.equal(lora(input_ids=batch[0], attention_mask=batch[1]).logits, before)
    with torch.no_grad():
        s = sequence_logps(lora, r, 0.8)
    m = r.response_mask_BT.bool()
    torch.testing.assert_close(r.senior_logps_BT[m], s[m], atol=1e-4, rtol=0)


def test_kv_cache_is_preallocated_not_concatenated(tokenizer, pair, batch, monkeypatch):
    """Memory does not grow with handoffs: one buffer per layer and model, written in place."""
    from tandem_rlvr.engines import fastpath

    made = []
    orig = fastpath._BufferLayer.__init__

    def spy(self, *a, **k):
        orig(self, *a, **k)
        made.append(self)

    monkeypatch.setattr(fastpath._BufferLayer, "__init__", spy)
    senior, junior = pair
    r = _gen(tokenizer, senior, junior, batch, make_schedule("bernoulli", p=0.5), Sampling(max_new_tokens=30), seed=0)
    assert r.rounds_B.float().mean() > 5  # many handoffs
    layers = senior.config.num_hidden_layers + junior.config.num_hidden_layers
    assert len(made) == layers
    P = batch[0].shape[1]
    assert all(layer._k.shape[-2] == P + 30 and layer.n == P + r.response_ids_BT.shape[1] - 1 for layer in made)


@pytest.mark.parametrize("mode", ["lockstep", "catchup"])
def test_a_token_ends_its_row_only_where_it_is_its_authors_eos(tokenizer, batch, mode):
    """A base senior and an instruct junior of one vocabulary end on different ids. Both models here write token X
    at every step; X is the junior's EOS, not the senior's: a row ends at the first X the junior writes, never at
    one the senior writes (before, only the senior's EOS ended a row: the junior's end of turn was written over)."""
    X = 7
    senior = bias_token(make_tiny_model(len(tokenizer), 0, 48), X, 50.0)
    junior = bias_token(make_tiny_model(len(tokenizer), 1, 32), X, 50.0)
    greedy = Sampling(max_new_tokens=12, temperature=0)
    sch = make_schedule("bernoulli", p=0.5)
    r = _gen(tokenizer, senior, junior, batch, sch, greedy, seed=3, mode=mode, junior_eos_token_ids=[X])
    for b in range(r.batch_size):
        n = int(r.response_mask_BT[b].sum())
        owners = r.owner_BT[b, :n].tolist()
        assert r.response_ids_BT[b, :n].tolist() == [X] * n
        assert 0 not in owners[:-1], "a junior-written X before the end did not end the row"
        assert owners[-1] == 0 and bool(r.finished_B[b]), "the row ran past the junior's EOS"
    solo = _gen(tokenizer, senior, junior, batch, make_schedule("none"), greedy, mode=mode, junior_eos_token_ids=[X])
    assert bool((solo.response_mask_BT.sum(-1) == 12).all()) and not bool(solo.finished_B.any())  # X is not his
    same = _gen(tokenizer, senior, junior, batch, sch, greedy, seed=3, mode=mode)
    assert bool((same.response_mask_BT.sum(-1) == 12).all())  # default: the senior's EOS for both
