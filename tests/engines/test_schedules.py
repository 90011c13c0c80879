"""The schedule registry (tandem_rlvr.engines.schedules): lookups, what is derived from it, the round trip of every
schedule into the dual vLLM engine's processor (on CPU, vLLM stubbed), and the ``sentence`` schedule's rule."""

from __future__ import annotations

import importlib
import sys
import types
from types import SimpleNamespace

import pytest
import torch

from tandem_rlvr.config import HandoffConfig, load_config
from tandem_rlvr.engines import schedules as registry
from tandem_rlvr.engines.base import PromptBatch
from tandem_rlvr.engines.handoff import (SCHEDULES, CoinStream, Schedule, SequenceSchedule, TokenTable, make_schedule,
                                         simulate)
from tandem_rlvr.engines.schedules import get_schedule, register_schedule, schedule_names
from tandem_rlvr.engines.serving import BRIDGE, IN_PROCESS, VLLM
from tandem_rlvr.engines.types import Sampling
from tandem_rlvr.engines.vllm_dual import DualVLLMEngine
from tandem_rlvr.training.ownership import token_disagreements

PARAMS = {"p": 0.3, "max_gap": 3, "chunk_size": 2}  # not the defaults: a parameter lost on the way shows


def _stream(tokenizer, B=4, T=40, seed=0):
    g = torch.Generator().manual_seed(seed)
    normal = [i for i in range(len(tokenizer)) if i not in tokenizer.all_special_ids]
    return torch.tensor(normal)[torch.randint(0, len(normal), (B, T), generator=g)]


# -- the registry --------------------------------------------------------------------------------------------


def test_an_unknown_name_is_refused_listing_the_known_ones():
    with pytest.raises(ValueError, match="unknown handoff schedule 'wrod'; choose one of none, bernoulli, word, step, "
                                         "alternate, chunk, sentence"):
        get_schedule("wrod")
    with pytest.raises(ValueError, match="unknown handoff schedule 'wrod'"):
        Schedule("wrod")
    with pytest.raises(ValueError, match="unknown handoff parameter"):
        Schedule("word", max_gapp=3)


def test_registration_refuses_duplicates_unknown_flags_and_bad_kinds():
    with pytest.raises(ValueError, match="already registered"):
        register_schedule("word")(lambda f, gap, carry, prm: (gap > 0, None))
    with pytest.raises(ValueError, match="nobody defines: nope"):
        register_schedule("x_flags", flags=("nope",))
    with pytest.raises(ValueError, match="level must be one of"):
        register_schedule("x_level", level="paragraph")
    assert "x_flags" not in schedule_names() and "x_level" not in schedule_names()


def test_every_list_is_derived_from_the_registry():
    names = schedule_names()
    assert names == SCHEDULES == ("none", "bernoulli", "word", "step", "alternate", "chunk", "sentence")
    cfg_choices = HandoffConfig.__dataclass_fields__["schedule"].metadata["bounds"].choices
    assert tuple(cfg_choices) == names
    assert load_config(None, ["model.senior=s", "model.junior=j", "handoff.schedule=sentence"]).handoff.schedule == "sentence"
    assert set(IN_PROCESS.schedules) == set(VLLM.schedules) == set(names)
    assert BRIDGE.schedules == tuple(n for n in names if get_schedule(n).level == "step") == ("step", "alternate")
    assert registry.coin_schedules() == ("bernoulli", "word", "step", "chunk", "sentence")
    assert registry.table_schedules() == ("word", "step", "alternate", "sentence")
    for name in names:  # a schedule that reads token flags cannot be built without a tokenizer
        if get_schedule(name).needs_table:
            with pytest.raises(ValueError, match="needs the tokenizer"):
                make_schedule(name)
        else:
            assert make_schedule(name).table is None


def test_parameters_and_their_config_keys():
    assert [p.name for p in get_schedule("word").params] == ["max_gap"] == [p.name for p in get_schedule("sentence").params]
    assert [p.key for p in get_schedule("chunk").params] == ["handoff.chunk_size"]
    for name in schedule_names():
        for prm in get_schedule(name).params:  # each config key exists, with the same default
            section, key = prm.key.split(".")
            assert section == "handoff" and getattr(HandoffConfig(), key) == prm.default, (name, prm)
    assert registry.config_params(HandoffConfig(max_gap=5)) == {"max_gap": 5, "chunk_size": 16}
    assert Schedule("sentence", max_gap=7, chunk_size=5).params == (("max_gap", 7),)  # its own parameters only
    assert (Schedule("sentence").max_gap, Schedule("sentence").chunk_size) == (32, 16)  # others read as defaults
    with pytest.raises(ValueError, match="has no token ending with"):  # a table with no sentence mark
        make_schedule("sentence", table=TokenTable(*(torch.ones(3, dtype=torch.bool),) * 4))


def test_deterministic_authors_drive_the_ownership_check():
    assert [n for n in schedule_names() if get_schedule(n).deterministic] == ["none", "alternate"]
    k = torch.arange(5)
    assert get_schedule("alternate").fixed_author(k).tolist() == [1, 0, 1, 0, 1]
    assert get_schedule("none").fixed_author(k).tolist() == [1] * 5 and get_schedule("word").fixed_author(k) is None
    mask = torch.ones(1, 3, dtype=torch.long)
    for name, turn, ok in (("alternate", [1, 0, 1], True), ("alternate", [1, 1, 0], False), ("none", [1, 1, 1], True),
                           ("none", [1, 0, 0], False), ("sentence", [0, 1, 1], True)):
        ro = SimpleNamespace(turn_author_BT=torch.tensor([turn]), response_mask_BT=mask, owner_BT=torch.tensor([turn]),
                             schedule=name)
        assert (token_disagreements(ro) == 0) == ok, (name, turn)


def test_a_schedule_registered_alone_runs_everywhere(tokenizer, monkeypatch):
    """One decorated rule is all a schedule needs: built by name, both views agree, the vLLM args round trip."""
    monkeypatch.setattr(registry, "_REGISTRY", dict(registry._REGISTRY))  # the registration ends with the test

    @register_schedule("every3", turn_tokens=lambda gap, prm: 3 - gap)
    def every3(f, gap, carry, prm):
        return gap >= 3, None

    sch = make_schedule("every3", p=0.5)
    toks = _stream(tokenizer, B=3, T=12)
    owner, rounds = simulate(sch, toks, seed=2)
    coins = CoinStream(3, 0.5, 2)
    for b in range(3):
        seq, got = SequenceSchedule(sch, coins, b), []
        for t, tok in enumerate(toks[b].tolist()):
            got.append(int(seq.author))
            assert seq.feed(tok) == ((t + 1) % 3 == 0)
        assert got == owner[b].tolist() and seq.rounds == int(rounds[b])
    assert Schedule.from_dict(sch.to_dict()) == sch and "every3" in registry.coin_schedules()


# -- the round trip into vLLM --------------------------------------------------------------------------------


@pytest.mark.parametrize("name", SCHEDULES)
def test_to_dict_and_from_dict_round_trip_every_schedule(tokenizer, name):
    sch = make_schedule(name, tokenizer, **PARAMS)
    args = sch.to_dict()
    assert set(args) == {"schedule", "p", *(p.name for p in get_schedule(name).params)}
    back = Schedule.from_dict({**args, "n": 4, "b": 0, "seed": 1}, sch.table)
    assert back == sch and back.to_dict() == args
    toks = _stream(tokenizer)
    assert all(torch.equal(x, y) for x, y in zip(simulate(back, toks, seed=5), simulate(sch, toks, seed=5)))
    if get_schedule(name).params:
        with pytest.raises(ValueError, match="arguments lack"):
            Schedule.from_dict({"schedule": name, "p": 0.5})


@pytest.fixture
def processor_cls(monkeypatch):
    """The dual engine's logits processor, importable without vLLM (its base class stubbed)."""
    try:
        import vllm.v1.sample.logits_processor  # noqa: F401
    except ImportError:
        fake = types.ModuleType("vllm.v1.sample.logits_processor")
        fake.LogitsProcessor = object
        monkeypatch.setitem(sys.modules, "vllm.v1.sample.logits_processor", fake)
    monkeypatch.delitem(sys.modules, "tandem_rlvr.engines.vllm_dual_model", raising=False)
    yield importlib.import_module("tandem_rlvr.engines.vllm_dual_model").TandemLogitsProcessor
    sys.modules.pop("tandem_rlvr.engines.vllm_dual_model", None)


def _request_args(tokenizer, sch, n, seed):
    """The ``extra_args`` the dual engine sends for each row (its own request builder, vLLM's LLM faked)."""
    sent = []
    llm = SimpleNamespace(tandem_vocab=len(tokenizer), generate=lambda reqs, params, use_tqdm=False: (
        sent.extend(params) or [SimpleNamespace(outputs=[SimpleNamespace(token_ids=[])]) for _ in reqs]))
    eng = DualVLLMEngine(llm, eos_token_ids=[tokenizer.eos_token_id], pad_token_id=tokenizer.pad_token_id,
                         sampling_params_cls=lambda **k: SimpleNamespace(**k))
    eng.set_solo = lambda solo: None
    eng.generate_many([(PromptBatch(torch.tensor([[1, 2]] * n), torch.ones(n, 2, dtype=torch.long)), seed)], sch,
                      Sampling(4), max_rounds=None)
    assert len(sent) == n
    return sent


@pytest.mark.parametrize("name", SCHEDULES)
def test_the_vllm_processor_masks_as_the_schedule_decides(tokenizer, tokenizer_dir, processor_cls, name):
    """Each schedule, sent as the dual engine's request arguments and rebuilt by its logits processor, lets exactly
    the author the in-process schedule picks write every token of a fixed stream."""
    sch = make_schedule(name, tokenizer, **PARAMS)
    toks = _stream(tokenizer, B=3, T=30, seed=4)
    owner, _ = simulate(sch, toks, seed=6)
    V = len(tokenizer)
    cfg = SimpleNamespace(model_config=SimpleNamespace(hf_config=SimpleNamespace(tandem_vocab=V), tokenizer=str(tokenizer_dir)))
    proc = processor_cls(cfg, torch.device("cpu"), False)
    outs = [[] for _ in range(3)]
    added = [(b, params, [1, 2], outs[b]) for b, params in enumerate(_request_args(tokenizer, sch, 3, seed=6))]
    proc.update_state(SimpleNamespace(removed=[], added=added, moved=[]))
    for t in range(toks.shape[1]):
        logits = proc.apply(torch.zeros(3, 2 * V + 1))
        for b in range(3):
            senior = bool(owner[b, t])
            assert torch.isfinite(logits[b, :V]).all() == senior and torch.isfinite(logits[b, V:2 * V]).all() != senior
            outs[b].append(int(toks[b, t]) + (0 if senior else V))  # the token vLLM sampled, in its author's half


# -- the sentence schedule -----------------------------------------------------------------------------------


def test_sentence_coins_fall_after_each_sentence_end(tokenizer):
    text = "It is 4. The end! Yes?\nNo. 3.5 x."
    ids = tokenizer(text)["input_ids"]
    pieces = tokenizer.convert_ids_to_tokens(ids)
    assert pieces == ["I", "t", "Ġis", "Ġ4", ".", "Ġ", "The", "Ġ", "e", "n", "d", "!", "Ġ", "Y", "es", "?", "Ċ", "N",
                      "o", ".", "Ġ3", ".", "5", "Ġ", "x", "."]
    sch = make_schedule("sentence", tokenizer, p=0.5)
    state, coins, decided = sch.start(sch.coins(1, 0)), sch.coins(1, 0), []
    for t, tok in enumerate(ids):
        state = sch.advance(state, torch.tensor([tok]), coins)
        decided += [t] if bool(state.fresh_B[0]) else []
    # after the whitespace that follows "4.", "end!", "Yes?" and "No."; not inside "3.5", not after the final "x."
    assert decided == [5, 12, 16, 20]
    short = make_schedule("sentence", tokenizer, p=0.5, max_gap=4)  # the fallback: 4 tokens without a sentence end
    state, coins, decided = short.start(short.coins(1, 0)), short.coins(1, 0), []
    for t, tok in enumerate(ids):
        state = short.advance(state, torch.tensor([tok]), coins)
        decided += [t] if bool(state.fresh_B[0]) else []
    assert decided == [3, 5, 9, 12, 16, 20, 24]


# ids: 0 "a", 1 "x." (ends with a mark), 2 " b" (starts with whitespace), 3 "!\n" (a mark followed by whitespace)
SENT = TokenTable(boundary_V=torch.tensor([False, False, True, False]), ends_nl_V=torch.tensor([False, False, False, True]),
                  nl2_V=torch.zeros(4, dtype=torch.bool), starts_nl_V=torch.zeros(4, dtype=torch.bool),
                  sentence_end_V=torch.tensor([False, False, False, True]),
                  starts_space_V=torch.tensor([False, False, True, False]),
                  ends_stop_V=torch.tensor([False, True, False, False]))


@pytest.mark.parametrize("row,max_gap,expected", [
    ([1, 2, 0, 0], 32, [0, 2]),  # "x." then " b": the coin after " b"
    ([1, 0, 2, 0], 32, [0]),  # "x." "a" " b": the mark is not followed by whitespace
    ([3, 0, 0, 0], 32, [0, 1]),  # "!\n" holds a sentence end
    ([0, 1, 2, 0], 2, [0, 2]),  # max_gap falls right after "x.": the " b" of the next turn starts no new coin
    ([0, 0, 0, 1, 2, 0], 32, [0, 5]),
])
def test_sentence_rule_on_a_hand_built_table(row, max_gap, expected):
    sch = Schedule("sentence", p=0.5, max_gap=max_gap, table=SENT)
    coins = sch.coins(1, 3)
    state, decided = sch.start(coins), [0]
    for t, tok in enumerate(row[:-1]):
        state = sch.advance(state, torch.tensor([tok]), coins)
        decided += [t + 1] if bool(state.fresh_B[0]) else []
    assert decided == expected
    seq, got = SequenceSchedule(sch, coins, 0), [0]  # the per-sequence view (vLLM, turn driver) agrees
    for t, tok in enumerate(row[:-1]):
        got += [t + 1] if seq.feed(tok) else []
    assert got == expected


@pytest.mark.parametrize("raw,text,flags", [
    (".ĊĊ", ".\n\n", {"sentence_end", "ends_nl", "nl2"}),
    ("!Ġ", "! ", {"sentence_end"}),
    ("?", "?", {"ends_stop"}),
    ("x.", "x.", {"ends_stop"}),
    ("3.5", "3.5", set()),  # a mark not followed by whitespace ends no sentence
    ("Ġ3", " 3", {"boundary", "starts_space"}),
    ("▁The", "The", {"boundary", "starts_space"}),  # SentencePiece: the decoded piece may lose its space
    ("Ċ", "\n", {"starts_space", "ends_nl", "starts_nl"}),
])
def test_the_sentence_flags_of_a_token(raw, text, flags):
    assert {name for name, fn in registry.TOKEN_FLAGS.items() if fn(raw, text)} == flags, (raw, text)
