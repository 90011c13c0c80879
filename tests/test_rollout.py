"""The rollout engine: correctness of KV-cached lockstep decoding and its ownership records."""

import copy

import pytest
import torch

from tandem_rlvr.handoff import make_schedule
from tandem_rlvr.rollout import Sampling, generate
from tandem_rlvr.trainer import sequence_logps
from conftest import bias_token, make_tiny_model

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


def test_owner_matches_simulated_schedule(tokenizer, pair, batch):
    from tandem_rlvr.handoff import simulate

    senior, junior = pair
    sch = make_schedule("word", tokenizer, p=0.5, max_gap=4)
    r = _gen(tokenizer, senior, junior, batch, sch, Sampling(max_new_tokens=25, temperature=1.0), seed=2)
    from tandem_rlvr.rollout import SCHEDULE_SEED_OFFSET

    owner, _ = simulate(sch, r.response_ids_BT, seed=2 + SCHEDULE_SEED_OFFSET)
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


def test_schedule_needing_junior_without_one_raises(tokenizer, pair, batch):
    with pytest.raises(ValueError, match="needs a junior"):
        _gen(tokenizer, pair[0], None, batch, make_schedule("word", tokenizer, p=0.5), Sampling(max_new_tokens=4))
