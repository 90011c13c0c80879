"""The text bridge: step-level tandem rollouts between models whose tokenizers differ."""

import itertools

import pytest
import torch

from helpers.tiny_models import CORPUS, GLUE_NL, bias_token, make_tiny_model
from tandem_rlvr.engines.bridge import (
    BridgeError,
    bridge_generate,
    check_bridge_schedule,
    make_side,
    senior_token_owner,
    tokenizers_differ,
)
from tandem_rlvr.engines.handoff import Schedule
from tandem_rlvr.engines.types import Sampling

PROBLEMS = ["What is 3 plus 4?", "Tom has 12 apples and gives away 5. How many are left?", "hi", "6 times 7?"]


@pytest.fixture(scope="module")
def junior_tokenizer():
    from tandem_rlvr.world.tokenizer import build_tokenizer

    return build_tokenizer(CORPUS, vocab_size=280, pattern=GLUE_NL)


def _step_biased(model, tok, text: str, bias: float):
    """Make ``model`` emit the (first) token of ``text`` often, so that steps end every few tokens."""
    return bias_token(model, tok.encode(text, add_special_tokens=False)[0], bias)


@pytest.fixture(scope="module")
def sides(tokenizer, junior_tokenizer):
    senior = _step_biased(make_tiny_model(len(tokenizer), 0, 48), tokenizer, "\n", 5.0)
    junior = _step_biased(make_tiny_model(len(junior_tokenizer), 1, 32), junior_tokenizer, ".\n\n", 4.0)
    return make_side(senior, tokenizer, [tokenizer.eos_token_id]), make_side(junior, junior_tokenizer, [junior_tokenizer.eos_token_id])


def _prompts(tok):
    return [tok.apply_chat_template([{"role": "user", "content": p}], add_generation_prompt=True, tokenize=False)
            for p in PROBLEMS]


def _run(sides, schedule="alternate", p=0.5, **kw):
    senior, junior = sides
    sampling = kw.pop("sampling", Sampling(max_new_tokens=60, temperature=1.0))
    return bridge_generate(senior, junior, _prompts(senior.tokenizer), _prompts(junior.tokenizer), Schedule(schedule, p),
                           sampling, seed=kw.pop("seed", 3), **kw)


def test_fixture_tokenizers_differ(tokenizer, junior_tokenizer):
    assert tokenizers_differ(tokenizer, junior_tokenizer)
    assert not tokenizers_differ(tokenizer, tokenizer)
    text = "So the answer is 7.\n\nThe"
    assert tokenizer.tokenize(text) != junior_tokenizer.tokenize(text)


@pytest.mark.parametrize("name", ["word", "bernoulli", "chunk", "none"])
def test_token_level_schedules_are_a_clear_error(sides, name):
    with pytest.raises(BridgeError, match="step" if name != "word" else "word.*tokenizers differ"):
        _run(sides, name)
    with pytest.raises(BridgeError):
        check_bridge_schedule(name)


@pytest.mark.parametrize("p", [-0.1, 1.5])
def test_a_handoff_probability_outside_0_1_is_a_clear_error(sides, p):
    with pytest.raises(BridgeError, match=r"handoff p must be in \[0, 1\]"):
        _run(sides, "step", p=p)


def test_greedy_chains_are_scored_at_temperature_one(sides):
    """temperature 0 means greedy; the senior's log-probs of a greedy chain are those at t = 1."""
    out = _run(sides, "alternate", sampling=Sampling(max_new_tokens=24, temperature=0.0))
    at_one = _run(sides, "alternate", sampling=Sampling(max_new_tokens=24, temperature=0.0), score=False)
    from tandem_rlvr.engines.scoring import sequence_logps

    want = sequence_logps(sides[0].model, at_one.rollout, 1.0) * at_one.rollout.response_mask_BT
    torch.testing.assert_close(out.rollout.senior_logps_BT, want)
    assert bool((out.rollout.senior_logps_BT <= 0).all())


def test_spans_cover_the_text_and_alternate(sides):
    out = _run(sides, "alternate")
    assert len(out.texts) == len(PROBLEMS)
    multi = 0
    for text, spans, rounds in zip(out.texts, out.spans, out.rollout.rounds_B.tolist()):
        assert spans[0][0] == 0 and spans[-1][1] == len(text)
        assert all(a[1] == b[0] for a, b in itertools.pairwise(spans))
        assert [s[2] for s in spans] == [1 - i % 2 for i in range(len(spans))], "alternation starts with the senior"
        assert all(text[s:e].endswith("\n\n") for s, e, _ in spans[:-1]), "every handoff is at a step end"
        assert all("\n\n" not in text[s:e - 2] for s, e, _ in spans[:-1]), "a turn is one step"
        assert len(spans) <= rounds
        multi += len(spans) > 2
    assert multi >= 2, "the fixture must exercise several handoffs"


def _char_owner(text, spans):
    own = [0] * len(text)
    for s, e, o in spans:
        own[s:e] = [o] * (e - s)
    return own


def test_owner_is_mapped_onto_the_senior_tokens(sides, tokenizer):
    """Owner 1 exactly on senior tokens made only of senior-written characters (checked by decoding prefixes)."""
    out = _run(sides, "alternate", seed=7)
    r = out.rollout
    for b, (text, spans) in enumerate(zip(out.texts, out.spans)):
        n = int(r.response_mask_BT[b].sum())
        ids, own = r.response_ids_BT[b, :n].tolist(), r.owner_BT[b, :n].tolist()
        if r.finished_B[b]:
            assert ids[-1] == tokenizer.eos_token_id
            ids, own = ids[:-1], own[:-1]
        assert tokenizer.decode(ids) == text, "the senior's tokens spell the co-written text"
        chars = _char_owner(text, spans)
        for i in range(len(ids)):
            lo, hi = len(tokenizer.decode(ids[:i])), len(tokenizer.decode(ids[:i + 1]))
            if hi > lo:  # (a piece of a split character adds no text on its own)
                assert own[i] == int(all(chars[lo:hi]))
    frac = r.senior_token_frac()
    assert 0.1 < frac < 0.9
    assert r.junior_logps_BT is None
    assert torch.equal(r.owner_BT * (1 - r.response_mask_BT), torch.zeros_like(r.owner_BT))


def test_each_author_reads_the_history_in_its_own_tokens(sides, junior_tokenizer):
    """Every junior prefill is its own prompt plus its own encoding of the text written so far."""
    _, junior = sides
    seen = []

    def record(_module, args, kwargs):
        ids, mask = kwargs["input_ids"], kwargs["attention_mask"]
        if ids.shape[1] > 1:  # a prefill: one per row and turn
            seen.extend(junior_tokenizer.decode(row[m[-row.shape[0]:].bool()]) for row, m in zip(ids, mask))

    handle = junior.model.register_forward_pre_hook(record, with_kwargs=True)
    try:
        out = _run(sides, "alternate", seed=11)
    finally:
        handle.remove()
    prompts = _prompts(junior_tokenizer)
    expected = sorted(prompts[b] + text[:s] for b, (text, spans) in enumerate(zip(out.texts, out.spans))
                      for s, _, o in spans if o == 0)
    # A junior turn that wrote nothing leaves no span; every recorded prefill must still be a valid history.
    assert set(expected) <= set(seen)
    for prefix in seen:
        b = next(i for i, p in enumerate(prompts) if prefix.startswith(p) and out.texts[i].startswith(prefix[len(p):]))
        assert out.texts[b].startswith(prefix[len(prompts[b]):])
    assert len(expected) >= 3


def test_senior_logps_match_the_trainer(sides):
    from tandem_rlvr.config import load_config
    from tandem_rlvr.training.trainer import arm_plan, loss_mask, sequence_logps

    senior, _ = sides
    out = _run(sides, "step", p=0.5, seed=5, sampling=Sampling(max_new_tokens=40, temperature=0.6))
    r = out.rollout
    with torch.no_grad():
        ref = sequence_logps(senior.model, r, 0.6)
    m = r.response_mask_BT.bool()
    torch.testing.assert_close(r.senior_logps_BT[m], ref[m], atol=1e-4, rtol=0)
    cfg = load_config(base={"model": {"senior": "s", "self_paired": True}, "handoff": {"schedule": "step"}})
    mask = loss_mask(r, arm_plan(cfg))
    assert torch.equal(mask, (r.response_mask_BT * r.owner_BT).float())


@pytest.mark.parametrize("p,owner", [(1.0, 1), (0.0, 0)])
def test_step_schedule_extremes_keep_one_author(sides, p, owner):
    out = _run(sides, "step", p=p)
    r = out.rollout
    assert r.rounds_B.tolist() == [1] * len(PROBLEMS)
    assert all(len(s) == 1 and s[0][2] == owner for s in out.spans if s)
    m = r.response_mask_BT.bool()
    if owner:
        assert bool((r.owner_BT[m] == 1).all())
    else:
        assert int(r.owner_BT.sum()) == 0


def test_max_rounds_and_budget_end_a_chain(sides):
    out = _run(sides, "alternate", max_rounds=2, sampling=Sampling(max_new_tokens=30, temperature=1.0))
    assert int(out.rollout.rounds_B.max()) <= 2
    assert all(len(s) <= 2 for s in out.spans)
    short = _run(sides, "alternate", sampling=Sampling(max_new_tokens=1, temperature=1.0))
    assert all(len(t) <= 8 for t in short.texts) and short.rollout.rounds_B.tolist() == [1] * len(PROBLEMS)


def test_seeded_runs_repeat(sides):
    a, b = _run(sides, "step", seed=2), _run(sides, "step", seed=2)
    assert a.texts == b.texts and a.spans == b.spans
    assert torch.equal(a.rollout.owner_BT, b.rollout.owner_BT)


def test_straddling_tokens_belong_to_the_junior():
    text = "ab\n\ncd"
    spans = [[0, 4, 0], [4, 6, 1]]
    assert senior_token_owner(text, spans, [(0, 2), (2, 4), (4, 6)]) == [0, 0, 1]
    assert senior_token_owner(text, spans, [(0, 3), (3, 5), (5, 6)]) == [0, 0, 1]
    assert senior_token_owner(text, spans, [(0, 4), (4, 5), (5, 5), (5, 6)]) == [0, 1, 1, 1]
