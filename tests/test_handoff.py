"""Handoff schedules: boundaries, rates, reproducibility, alternation."""

import pytest
import torch

from tandem_rlvr.handoff import SCHEDULES, make_schedule, simulate, token_table


@pytest.fixture(scope="module")
def table(tokenizer):
    return token_table(tokenizer)


def _stream(tokenizer, B=64, T=200, seed=0):
    g = torch.Generator().manual_seed(seed)
    normal = [i for i in range(len(tokenizer)) if i not in tokenizer.all_special_ids]
    pick = torch.randint(0, len(normal), (B, T), generator=g)
    return torch.tensor(normal)[pick]


def test_token_table_marks_word_starts(tokenizer, table):
    ids = tokenizer(" hello world\n\nx")["input_ids"]
    toks = tokenizer.convert_ids_to_tokens(ids)
    for i, t in zip(ids, toks):
        assert bool(table.boundary_V[i]) == t.startswith("Ġ"), t
    nl = tokenizer.convert_tokens_to_ids("Ċ")
    assert table.ends_nl_V[nl] and table.starts_nl_V[nl] and not table.ends_nl2_V[nl]
    for special in tokenizer.all_special_ids:
        assert not table.boundary_V[special]


@pytest.mark.parametrize("K", [3, 32])
def test_word_handoffs_only_after_boundaries_or_K_tokens(tokenizer, table, K):
    sch = make_schedule("word", table=table, p=0.5, max_gap=K)
    toks = _stream(tokenizer)
    owner, _ = simulate(sch, toks, seed=1)
    B, T = toks.shape
    switches = 0
    for b in range(B):
        gap = 0
        for t in range(1, T):
            gap += 1
            redraw_allowed = bool(table.boundary_V[toks[b, t - 1]]) or gap >= K
            if owner[b, t] != owner[b, t - 1]:
                switches += 1
                assert redraw_allowed, (b, t)
            if redraw_allowed:
                gap = 0
    assert switches > 100


@pytest.mark.parametrize("name,p", [("bernoulli", 0.5), ("word", 0.5), ("word", 0.25), ("chunk", 0.75)])
def test_senior_fraction_converges_to_p(tokenizer, table, name, p):
    sch = make_schedule(name, table=table, p=p, max_gap=8, chunk_size=4)
    toks = _stream(tokenizer, B=256, T=200, seed=2)
    owner, _ = simulate(sch, toks, seed=3)
    assert abs(owner.float().mean().item() - p) < 0.03


def test_schedules_reproducible_under_seed(tokenizer, table):
    toks = _stream(tokenizer, B=8, T=100)
    for name in SCHEDULES:
        sch = make_schedule(name, table=table, p=0.5)
        a, _ = simulate(sch, toks, seed=7)
        b, _ = simulate(sch, toks, seed=7)
        assert torch.equal(a, b), name
    word = make_schedule("word", table=table, p=0.5)
    assert not torch.equal(simulate(word, toks, seed=7)[0], simulate(word, toks, seed=8)[0])


def test_alternate_senior_first_and_flips_at_step_ends(tokenizer, table):
    text = "one step\n\ntwo step\n\nthree\n\nfour"
    ids = torch.tensor([tokenizer(text)["input_ids"]])
    owner, rounds = simulate(make_schedule("alternate", table=table), ids)
    pieces = tokenizer.convert_ids_to_tokens(ids[0].tolist())
    expected, author, prev_nl = [], 1, False
    for piece in pieces:
        expected.append(author)
        if piece.endswith("ĊĊ") or (prev_nl and piece.startswith("Ċ")):
            author = 1 - author
        prev_nl = piece.endswith("Ċ")
    assert owner[0].tolist() == expected
    assert owner[0, 0] == 1 and rounds.item() == 4


def test_none_and_p1_are_all_senior(tokenizer, table):
    toks = _stream(tokenizer, B=4, T=50)
    for sch in (make_schedule("none"), make_schedule("word", table=table, p=1.0), make_schedule("bernoulli", p=1.0)):
        owner, rounds = simulate(sch, toks)
        assert owner.all() and (rounds == 1).all()
        assert not sch.uses_junior
    assert make_schedule("word", table=table, p=0.5).uses_junior


def test_bad_schedule_arguments():
    with pytest.raises(ValueError, match="unknown handoff schedule 'wrod'"):
        make_schedule("wrod")
    with pytest.raises(ValueError, match=r"handoff.p must be in \[0, 1\]"):
        make_schedule("bernoulli", p=1.5)
    with pytest.raises(ValueError, match="needs the tokenizer"):
        make_schedule("word")
