"""Handoff schedules: boundaries, rates, reproducibility, alternation."""

import pytest
import torch

from tandem_rlvr.engines.handoff import (
    SCHEDULES,
    CoinStream,
    Schedule,
    SequenceSchedule,
    TokenTable,
    make_schedule,
    simulate,
    token_table,
)


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
    assert table.ends_nl_V[nl] and table.starts_nl_V[nl] and not table.nl2_V[nl]
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
    expected, author, turn_nl = [], 1, False
    for piece in pieces:
        expected.append(author)
        end = "ĊĊ" in piece or (turn_nl and piece.startswith("Ċ"))
        author = 1 - author if end else author
        turn_nl = piece.endswith("Ċ") and not end
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


# --- step ends: inside the current step only (hand-built token table) ------------------------------
# ids: 0 "a", 1 "b\n" (ends with a newline), 2 "\nc" (starts with one), 3 ".\n\n" (holds "\n\n"), 4 "x." (ends a
# sentence if whitespace follows; the sentence schedule's flags: 3 holds ". ", 2 starts with whitespace)
HAND = TokenTable(boundary_V=torch.tensor([True, True, True, True, True]),
                  ends_nl_V=torch.tensor([False, True, False, True, False]),
                  nl2_V=torch.tensor([False, False, False, True, False]),
                  starts_nl_V=torch.tensor([False, False, True, False, False]),
                  sentence_end_V=torch.tensor([False, False, False, True, False]),
                  starts_space_V=torch.tensor([False, False, True, False, False]),
                  ends_stop_V=torch.tensor([False, False, False, False, True]))


def test_a_split_newline_pair_ends_a_step_within_one_turn():
    owner, rounds = simulate(Schedule("alternate", table=HAND), torch.tensor([[0, 1, 2, 0, 0]]))
    assert owner[0].tolist() == [1, 1, 1, 0, 0], "'b\\n' then '\\nc' by the same author ends the step"
    assert rounds.item() == 2


def test_the_newline_ending_a_step_does_not_carry_into_the_next_turn():
    # ".\n\n" ends the senior's step (and itself ends with a newline); the junior's first token "\nc"
    # starts with one: the junior's turn must not end after that one token.
    owner, rounds = simulate(Schedule("alternate", table=HAND), torch.tensor([[0, 3, 2, 0, 0]]))
    assert owner[0].tolist() == [1, 1, 0, 0, 0]
    assert rounds.item() == 2


def test_sequence_view_follows_the_batch_view(tokenizer, table):
    """The per-sequence schedule (vLLM, bridge) and the batched one (in-process) are the same rules."""
    toks = _stream(tokenizer, B=6, T=80, seed=5)
    for name in SCHEDULES:
        sch = make_schedule(name, table=table, p=0.5, max_gap=4, chunk_size=3)
        owner, rounds = simulate(sch, toks, seed=9)
        coins = CoinStream(toks.shape[0], sch.p, 9)
        for b in range(toks.shape[0]):
            seq = SequenceSchedule(sch, coins, b)
            got = []
            for tok in toks[b].tolist():
                got.append(int(seq.author))
                seq.feed(tok)
            assert got == owner[b].tolist() and seq.rounds == int(rounds[b]), (name, b)


def test_turn_limits_for_turn_level_engines(table):
    coins = CoinStream(1, 0.5, 0)
    chunk = SequenceSchedule(make_schedule("chunk", chunk_size=5), coins, 0)
    assert chunk.max_turn_tokens() == 5 and chunk.stop_strings() == []
    chunk.feed(7), chunk.feed(7)
    assert chunk.max_turn_tokens() == 3
    assert SequenceSchedule(make_schedule("bernoulli"), coins, 0).max_turn_tokens() == 1
    step = SequenceSchedule(make_schedule("step", table=table), coins, 0)
    assert step.max_turn_tokens() is None and step.stop_strings() == ["\n\n"]
    word = SequenceSchedule(make_schedule("word", table=table), coins, 0)
    assert set(word.boundary_ids()) == set(table.boundary_V.nonzero().flatten().tolist())


def _batch_record(sch, toks, seed):
    """Per token of the batch view: the author, the decision record (author where one was just made, else -1),
    whether a coin fell after the token, and the rounds after it."""
    coins = sch.coins(toks.shape[0], seed)
    state = sch.start(coins)
    rec = []
    for t in range(toks.shape[1]):
        author, fresh = state.author_B.long(), state.fresh_B
        state = sch.advance(state, toks[:, t], coins)
        rec.append((author, torch.where(fresh, author, -1), state.fresh_B, state.rounds_B))
    return coins, rec


@pytest.mark.parametrize("hand", [False, True])
def test_sequence_view_records_the_batch_views_decisions(tokenizer, table, hand):
    """decision(), feed()'s answer and over() of the per-sequence view equal the batch view's record
    (HandoffState.fresh_B), also on a hand-built table whose streams start with a newline token."""
    if hand:
        tab, toks = HAND, torch.tensor([[2, 1, 2, 0, 3, 2, 1, 2, 0, 0], [3, 2, 0, 1, 2, 2, 3, 0, 1, 2]])
    else:
        tab, toks = table, _stream(tokenizer, B=5, T=60, seed=2)
    for name in SCHEDULES:
        sch = make_schedule(name, table=tab, p=0.5, max_gap=3, chunk_size=2)
        coins, rec = _batch_record(sch, toks, seed=4)
        for b in range(toks.shape[0]):
            seq = SequenceSchedule(sch, coins, b)
            for t, tok in enumerate(toks[b].tolist()):
                author, decision, due, rounds = (x[b].item() for x in rec[t])
                assert (int(seq.author), seq.decision()) == (author, decision), (name, b, t)
                assert seq.feed(tok) == bool(due) and seq.rounds == rounds, (name, b, t)
                assert seq.over(1) == (rounds > 1) and not seq.over(None)


def test_sequence_view_start_and_turn_limits(table):
    coins = CoinStream(2, 0.5, 0)
    first = bool(coins.draw(1, 0))
    word = make_schedule("word", table=table, max_gap=5)
    seq = SequenceSchedule(word, coins, 1)
    assert seq.author == first and seq.decision() == int(first) and seq.rounds == 1 and not seq.over(1)
    forced = SequenceSchedule(word, coins, 1, first_author=not first)
    assert forced.author is (not first) and forced.decision() == int(not first)
    no_word = next(i for i in range(table.vocab_size) if not table.boundary_V[i])
    assert seq.max_turn_tokens() == 5
    assert not seq.feed(no_word) and seq.decision() == -1 and seq.max_turn_tokens() == 4
    with pytest.raises(ValueError, match="needs a token table"):
        SequenceSchedule(Schedule("word"), coins, 0).feed(1)
    assert SequenceSchedule(make_schedule("none"), coins, 0).max_turn_tokens() is None


@pytest.mark.parametrize("name", ["step", "alternate"])
def test_end_step_draws_the_next_step_coin(table, name):
    """The text bridge's step ends: coin k at the k-th step end (alternate: a flip), a new round on a change."""
    coins = CoinStream(3, 0.5, 7)
    sch = make_schedule(name, table=table, p=0.5)
    for b in range(3):
        seq = SequenceSchedule(sch, coins, b)
        author, rounds = seq.author, 1
        for k in range(1, 9):
            assert seq.end_step() is True
            expect = (not author) if name == "alternate" else coins.draw(b, k)
            rounds += int(expect != author)
            author = expect
            assert (seq.author, seq.rounds, seq.steps, seq.decision()) == (author, rounds, k, int(author))
    with pytest.raises(ValueError, match="step-level"):
        SequenceSchedule(make_schedule("word", table=table), coins, 0).end_step()


def _expected_decisions(name, row, table, K, N):
    """Positions t whose token a decision precedes, written out here from METHOD §2 (not from handoff.py)."""
    pos, gap, turn_nl, stop = [0], 0, False, False
    for t, tok in enumerate(row[:-1]):
        gap += 1
        boundary, ends_nl, nl2, starts_nl = table.rows[tok]
        sentence_end, starts_space, ends_stop = (table.lists[f][tok] for f in ("sentence_end", "starts_space", "ends_stop"))
        due = {"bernoulli": True, "chunk": gap >= N, "word": boundary or gap >= K,
               "step": nl2 or (turn_nl and starts_nl), "alternate": nl2 or (turn_nl and starts_nl),
               "sentence": sentence_end or (stop and starts_space) or gap >= K}.get(name, False)
        turn_nl = ends_nl and not due
        stop = ends_stop and not due
        if due:
            pos.append(t + 1)
            gap = 0
    return pos


@pytest.mark.parametrize("hand", [False, True])
def test_where_each_schedule_decides_and_who_it_picks(tokenizer, table, hand):
    """The batch view's decisions (fresh_B) fall exactly where the rules of METHOD §2 put them; each decision
    of a coin schedule takes that row's coin for that position; alternate starts with the senior and flips."""
    if hand:
        tab, toks = HAND, torch.tensor([[2, 1, 2, 0, 3, 2, 1, 2, 0, 0, 1, 2], [3, 2, 0, 1, 2, 2, 3, 0, 1, 2, 0, 0]])
    else:
        tab, toks = table, _stream(tokenizer, B=16, T=50, seed=3)
    for name in SCHEDULES:
        sch = make_schedule(name, table=tab, p=0.5, max_gap=3, chunk_size=4)
        coins, rec = _batch_record(sch, toks, seed=6)
        for b in range(toks.shape[0]):
            got = [t for t in range(toks.shape[1]) if rec[t][1][b].item() >= 0]
            assert got == _expected_decisions(name, toks[b].tolist(), tab, 3, 4), (name, b)
            picks = [rec[t][1][b].item() for t in got]
            if name == "alternate" or name == "none":
                assert picks == [int(name == "none" or k % 2 == 0) for k in range(len(got))], (name, b)
            else:
                assert picks == [int(coins.draw(b, t)) for t in got], (name, b)


def test_make_schedule_pads_the_table_and_refuses_a_wordless_vocabulary(tokenizer):
    sch = make_schedule("word", tokenizer, vocab_size=len(tokenizer) + 5)
    assert sch.table.vocab_size == len(tokenizer) + 5 and not bool(sch.table.boundary_V[len(tokenizer):].any())
    wordless = TokenTable(*(torch.zeros(4, dtype=torch.bool) for _ in range(4)))
    with pytest.raises(ValueError, match="no word-start tokens"):
        make_schedule("word", table=wordless)
    assert make_schedule("step", table=wordless).name == "step"


# --- simulated owners, round limits, schedule defaults ----------------------------------------------


def test_simulated_owner_is_a_long_mask():
    owner, rounds = simulate(make_schedule("bernoulli", p=0.5), torch.zeros(3, 40, dtype=torch.long), seed=2)
    assert owner.dtype == torch.long and set(owner.unique().tolist()) == {0, 1}
    seen = 1 + (owner[:, 1:] != owner[:, :-1]).sum(1)  # turns visible in the stream; one more may start after it
    assert ((rounds == seen) | (rounds == seen + 1)).all()


def test_rounds_limits_and_schedule_defaults():
    from tandem_rlvr.engines.handoff import CoinStream, Schedule, make_schedule, over_rounds

    assert (over_rounds(3, 2), over_rounds(2, 2), over_rounds(1, None), over_rounds(0, None)) == (True, False, False, False)
    assert bool(over_rounds(torch.tensor([0, 1, 5]), None).any()) is False
    sch = make_schedule("chunk")
    assert (sch.max_gap, sch.chunk_size) == (32, 16)  # the paper's K = 32
    assert make_schedule("chunk", max_gap=1, chunk_size=1).chunk_size == 1
    for key, bad in (("max_gap", 0), ("chunk_size", 0), ("max_gap", 2.5)):  # checked whichever schedule reads it
        with pytest.raises(ValueError, match=f"handoff.{key} must be a whole number >= 1"):
            make_schedule("chunk", **{key: bad})
    state = Schedule("bernoulli").start(CoinStream(3, 0.5, 0))
    assert state.gap_B.dtype == torch.long and state.rounds_B.dtype == torch.long and state.t == 0


def test_sequence_feed_reads_the_given_vocabulary_table():
    """Where the authors' vocabularies differ the turn driver passes the writer's table to ``feed``: its flags
    decide, not the schedule's own table (token 1 starts a word in the writer's table only)."""
    own = TokenTable(boundary_V=torch.tensor([False, False, True]))
    writer = TokenTable(boundary_V=torch.tensor([False, True, False]))
    seq = SequenceSchedule(make_schedule("word", table=own, max_gap=32), CoinStream(1, 0.5, 0), 0)
    assert not seq.feed(1)  # the schedule's own table: no word start
    assert seq.feed(1, table=writer)  # the writer's table: a word start, so a coin falls


def test_schedule_attributes_before_init_are_attribute_errors():
    """copy and pickle look attributes up on an instance whose fields are not set yet: every lookup is an
    AttributeError (``params`` is guarded, so a parameter lookup cannot recurse into itself)."""
    blank = object.__new__(Schedule)
    for key in ("params", "name", "p", "table", "_private", "max_gap"):
        with pytest.raises(AttributeError):
            getattr(blank, key)
