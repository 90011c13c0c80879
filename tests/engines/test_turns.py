"""The turn driver (tandem_rlvr.engines.turns): two models with different tokenizers write turn by turn through text.

Invariants on real (tiny) models: each turn is its author's and the owner spans say so, the schedule's coins
decide every turn, the budget holds, EOS ends a chain; exact numbers where a model is made to emit one token.
"""

from __future__ import annotations

import pytest
import torch

from helpers.tiny_models import CORPUS, GLUE_NL, bias_token, make_tiny_model
from tandem_rlvr.engines.handoff import STEP_END, CoinStream, SequenceSchedule, make_schedule
from tandem_rlvr.engines.turns import (TurnRules, chains_to_rollout, encode_texts, truncate_to_context, make_side, run_turns,
                                       senior_used, start_chains)
from tandem_rlvr.engines.types import Sampling

PROBLEMS = ["What is 3 plus 4?", "Tom has 12 apples and gives away 5. How many are left?", "hi", "6 times 7?"]
STOPS = {"eos", "budget", "max_rounds", "empty_turn"}


@pytest.fixture(scope="module")
def junior_tokenizer():
    from tandem_rlvr.world.tokenizer import build_tokenizer

    return build_tokenizer(CORPUS, vocab_size=280, pattern=GLUE_NL)


def _side(tok, seed, hidden, biases=()):
    model = make_tiny_model(len(tok), seed, hidden)
    for text, bias in biases:  # make the model emit the first token of ``text`` often
        bias_token(model, tok.encode(text, add_special_tokens=False)[0] if isinstance(text, str) else text, bias)
    return make_side(model, tok, [tok.eos_token_id])


@pytest.fixture(scope="module")
def sides(tokenizer, junior_tokenizer):
    """A senior and a junior with different tokenizers that end steps and sentences every few tokens."""
    return (_side(tokenizer, 0, 48, (("\n", 4.0), (".", 2.0))),
            _side(junior_tokenizer, 1, 32, ((".\n\n", 3.0), (" ", 2.0))))


def _prompt_ids(sides):
    return tuple(encode_texts(s.tokenizer, [s.tokenizer.apply_chat_template([{"role": "user", "content": p}],
                                                                            add_generation_prompt=True, tokenize=False)
                                            for p in PROBLEMS]) for s in sides)


def _play(sides, name, *, p=0.5, budget=40, seed=3, rules=TurnRules(), **params):
    schedule = make_schedule(name, sides[0].tokenizer, p=p, **params)
    chains = start_chains(schedule, schedule.coins(len(PROBLEMS), seed), budget)
    run_turns(sides, _prompt_ids(sides), chains, Sampling(max_new_tokens=budget, temperature=1.0),
              torch.Generator().manual_seed(seed), rules)
    return schedule, chains


def _turn_text(side, ids, step_level):
    """What a turn adds to the text, written out here: its tokens without EOS, cut after the first step end."""
    ids = ids[:-1] if ids and ids[-1] in side.eos_ids else ids
    text = side.tokenizer.decode(ids, skip_special_tokens=True, clean_up_tokenization_spaces=False)
    return text[:text.index(STEP_END) + len(STEP_END)] if step_level and STEP_END in text else text


@pytest.mark.parametrize("name,params", [("alternate", {}), ("step", {}), ("word", {"max_gap": 5}),
                                         ("sentence", {"max_gap": 6})])
def test_each_turn_is_its_authors_and_the_owner_spans_say_so(sides, name, params):
    schedule, chains = _play(sides, name, rules=TurnRules(max_rounds=6), **params)
    step_level = schedule.level == "step"
    assert sum(len(c.turns) for c in chains) > len(chains), "want several turns"
    for c in chains:
        assert c.stop in STOPS and c.turns
        first = True if name == "alternate" else bool(c.sched.coins.draw(c.sched.b, 0))
        assert c.turns[0][0] == first  # the schedule's first author wrote the first turn
        texts = [_turn_text(sides[0 if author else 1], ids, step_level) for author, ids in c.turns]
        assert c.text == "".join(texts)
        owner_of_char = [int(author) for (author, _), t in zip(c.turns, texts) for _ in t]
        assert [o for s, e, o in c.spans for _ in range(s, e)] == owner_of_char
        assert all(a[2] != b[2] and a[1] == b[0] for a, b in zip(c.spans, c.spans[1:]))  # merged, contiguous
        for author, ids in c.turns:  # each author's own tokens, within its budget
            assert all(0 <= i < len(sides[0 if author else 1].tokenizer) for i in ids)
        assert sum(len(ids) for _, ids in c.turns) <= c.budget and c.remaining == c.budget - sum(
            len(ids) for _, ids in c.turns)
        eos_turns = [k for k, (author, ids) in enumerate(c.turns) if ids and ids[-1] in sides[0 if author else 1].eos_ids]
        assert eos_turns == ([len(c.turns) - 1] if c.stop == "eos" else []) and c.finished == (c.stop == "eos")


@pytest.mark.parametrize("name,params", [("word", {"max_gap": 5}), ("sentence", {"max_gap": 6}), ("bernoulli", {})])
def test_token_level_turns_end_where_the_coins_hand_over(sides, name, params):
    """Replaying each author's tokens (in its own vocabulary) through a fresh schedule with the same coins gives
    that author at every token, and a turn that did not stop the chain ends exactly where the author changed."""
    schedule, chains = _play(sides, name, **params)
    coins = CoinStream(len(chains), schedule.p, 3)
    for b, c in enumerate(chains):
        replay = SequenceSchedule(schedule, coins, b)
        for k, (author, ids) in enumerate(c.turns):
            table = sides[0 if author else 1].table
            for j, tok in enumerate(ids):
                assert replay.author == author, (name, b, k, j)
                replay.feed(tok, table)
            if k < len(c.turns) - 1:
                assert replay.author != author and c.turns[k + 1][0] == replay.author  # the coin handed over
        assert replay.rounds == c.sched.rounds
        # the rollout's rounds: the turns written, not one the coin after an EOS or at the budget would start
        assert c.rounds == 1 + sum(a[0] != b[0] for a, b in zip(c.turns, c.turns[1:]))


@pytest.mark.parametrize("name", ["step", "alternate"])
def test_step_level_turns_end_at_step_ends_and_rounds_count_author_changes(sides, name):
    """Every turn but a chain's last ends its step; a step-end coin may keep the author (step) or never does
    (alternate); the schedule's rounds are 1 + the changes of author, + 1 where the next turn would pass
    max_rounds (the chain's, the rollout's, are the turns written: without that one)."""
    kept = stopped = 0
    for max_rounds in (2, 3):
        _, chains = _play(sides, name, rules=TurnRules(max_rounds=max_rounds), budget=60)
        for c in chains:
            changes = sum(a[0] != b[0] for a, b in zip(c.turns, c.turns[1:]))
            kept += len(c.turns) - 1 - changes
            stopped += c.stop == "max_rounds"
            assert c.sched.rounds == 1 + changes + int(c.stop == "max_rounds")
            assert c.rounds == 1 + changes  # what the rollout reports: the turns written
            assert c.sched.rounds <= max_rounds + 1 and (c.stop == "max_rounds") == (c.sched.rounds > max_rounds)
            assert all(_turn_text(sides[0 if a else 1], ids, True).endswith(STEP_END) for a, ids in c.turns[:-1])
    assert (kept > 0) == (name == "step") and (stopped > 0 or name == "step")


def test_a_senior_budget_counts_the_seniors_tokens_of_the_whole_text(sides):
    _, chains = _play(sides, "alternate", budget=25, rules=TurnRules(senior_budget=True))
    enc = sides[0].tokenizer([c.text for c in chains], add_special_tokens=False)["input_ids"]
    for c, ids in zip(chains, enc):
        assert len(ids) <= c.budget
        if c.stop == "budget":  # cut at its last fitting token, or used exactly up
            assert c.remaining <= 0 or len(ids) == c.budget or not c.turns[-1][1]
    assert any(c.stop == "budget" for c in chains)
    assert senior_used(chains, [0], sides[0].tokenizer) == [len(enc[0])]


@pytest.mark.parametrize("senior_first", [True, False])
def test_an_eos_first_token_ends_the_chain_owned_by_whoever_wrote_it(tokenizer, senior_first):
    """Both models emit EOS first: every chain is one turn of one token, and the rollout holds the senior's EOS
    owned by that turn's author (p = 1: the senior first, p = 0: the junior)."""
    side = _side(tokenizer, 0, 32, ((tokenizer.eos_token_id, 50.0),))
    sides = (side, side)
    schedule, chains = _play(sides, "word", p=1.0 if senior_first else 0.0)
    for c in chains:
        assert c.turns == [(senior_first, [tokenizer.eos_token_id])] and c.stop == "eos" and c.text == ""
    ro = chains_to_rollout(side, chains, _prompt_ids(sides)[0], "word", None)
    assert ro.response_ids_BT.tolist() == [[tokenizer.eos_token_id]] * len(PROBLEMS)
    assert ro.owner_BT.tolist() == [[int(senior_first)]] * len(PROBLEMS) and bool(ro.finished_B.all())
    assert ro.decisions_B.tolist() == [1] * len(PROBLEMS)
    assert ro.senior_decisions_B.tolist() == [int(senior_first)] * len(PROBLEMS)


def test_a_turn_that_never_ends_stops_at_the_budget(tokenizer):
    letter = tokenizer.convert_tokens_to_ids("e")
    side = _side(tokenizer, 0, 32, ((letter, 50.0),))
    _, chains = _play((side, side), "step", budget=7)
    for c in chains:
        assert c.turns == [(c.turns[0][0], [letter] * 7)] and c.stop == "budget" and c.remaining == 0
        assert c.text == "e" * 7 and c.spans == [[0, 7, int(c.turns[0][0])]]


def test_fit_context_truncates_from_the_left_and_keeps_half_for_the_turn():
    seqs = [list(range(10)), [1, 2]]
    assert truncate_to_context(seqs, [4, 4], None) == (seqs, [4, 4], 0)
    assert truncate_to_context(seqs, [4, 4], 8) == ([[6, 7, 8, 9], [1, 2]], [4, 4], 1)
    assert truncate_to_context(seqs, [10, 3], 8) == ([[6, 7, 8, 9], [1, 2]], [4, 3], 1)  # a turn keeps at most half
    assert truncate_to_context([[1, 2, 3]], [1], 2) == ([[3]], [1], 1)
