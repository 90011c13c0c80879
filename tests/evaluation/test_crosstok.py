"""Auditing pairs with different tokenizers: bits per byte, bridged step handoff, identical pairs, the CLI matrix."""

from __future__ import annotations

import copy
import json
import math
from dataclasses import dataclass

import pytest
import torch
from helpers.tiny_models import CORPUS, bias_token, make_tiny_model

from tandem_rlvr.engines.bridge import bridge_generate, make_side
from tandem_rlvr.evaluation.crosstok import NA, bridge_handoff, evaluate_any_pair
from tandem_rlvr.evaluation.legibility import LN2, bits_per_byte
from tandem_rlvr.engines.handoff import Schedule
from tandem_rlvr.engines.types import Sampling

GLUE_NL = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+| ?\p{N}"
           r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")


@dataclass(frozen=True)
class Ex:
    id: str
    problem: str
    answer: str


PROBLEMS = [Ex(str(i), p, a) for i, (p, a) in enumerate(
    [("What is 3 plus 4?", "7"), ("Tom has 12 apples and gives away 5. How many are left?", "7"),
     ("6 times 7?", "42"), ("hi", "1")])]


def _reward(text: str, gold: str) -> float:
    return float(gold in text)


@pytest.fixture(scope="module")
def junior_tokenizer():
    from tandem_rlvr.world.tokenizer import build_tokenizer

    return build_tokenizer(CORPUS, vocab_size=280, pattern=GLUE_NL)


@pytest.fixture(scope="module")
def models(tokenizer, junior_tokenizer):
    """(senior, junior): tiny models on two different tokenizers, biased to end steps every few tokens."""
    senior = make_tiny_model(len(tokenizer), 0, 48)
    bias_token(senior, tokenizer.encode("\n", add_special_tokens=False)[0], 3.0)
    junior = make_tiny_model(len(junior_tokenizer), 1, 32)
    bias_token(junior, junior_tokenizer.encode(".\n\n", add_special_tokens=False)[0], 4.0)
    return senior, junior


def _render(tok, problem):
    from tandem_rlvr.data import render_prompt

    return render_prompt(tok, problem)


@torch.inference_mode()
@pytest.mark.parametrize("which", [0, 1])
def test_bits_per_byte_equals_a_direct_computation(models, tokenizer, junior_tokenizer, which):
    model, tok = (models[0], tokenizer) if which == 0 else (models[1], junior_tokenizer)
    texts = ["So 3 + 4 = 7.\n\nThe answer is \\boxed{7} — café.", "", "12 - 5 = 7"]
    prompts = [_render(tok, p.problem) for p in PROBLEMS[:3]]
    got = bits_per_byte(model, tok, prompts, texts, batch=2, chunk_tokens=5)
    for prompt, text, g in zip(prompts, texts, got):
        if not text:
            assert math.isnan(g["bpb"]) and g["bytes"] == 0
            continue
        p = tok(prompt, add_special_tokens=False)["input_ids"]
        t = tok(text, add_special_tokens=False)["input_ids"]
        lp = torch.log_softmax(model(input_ids=torch.tensor([p + t])).logits[0].double(), -1)
        nats = -sum(float(lp[len(p) - 1 + k, t[k]]) for k in range(len(t)))
        assert g["bytes"] == len(text.encode("utf-8")) > len(text) or "é" not in text
        assert g["bpb"] == pytest.approx(nats / LN2 / len(text.encode("utf-8")), rel=1e-4)
    assert got[0]["bpb"] > 0


@torch.inference_mode()
def test_bits_per_byte_truncates_from_the_left(models, junior_tokenizer):
    junior = models[1]
    text = "First we multiply 6 by 7 to get 42.\n\nThen we add 8 to get 50."
    prompt = _render(junior_tokenizer, "6 times 7?")
    p = junior_tokenizer(prompt, add_special_tokens=False)["input_ids"]
    t = junior_tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
    ctx = len(t["input_ids"]) - 3  # the prompt and the first 4 text tokens fall out of the window
    (got,) = bits_per_byte(junior, junior_tokenizer, [prompt], [text], context=ctx)
    assert got["truncated"] and got["unscored_tokens"] == 4 and len(p) > 0
    ids = t["input_ids"][4 - 1:]
    lp = torch.log_softmax(junior(input_ids=torch.tensor([ids])).logits[0].double(), -1)
    nats = -sum(float(lp[k - 1, ids[k]]) for k in range(1, len(ids)))
    n_bytes = len(text[t["offset_mapping"][4][0]:].encode())
    assert got["bpb"] == pytest.approx(nats / LN2 / n_bytes, rel=1e-4)


def test_bridged_step_handoff_is_the_training_bridge(models, tokenizer, junior_tokenizer):
    senior = make_side(models[0], tokenizer, [tokenizer.eos_token_id])
    junior = make_side(models[1], junior_tokenizer, [junior_tokenizer.eos_token_id])
    sp = [_render(tokenizer, p.problem) for p in PROBLEMS]
    jp = [_render(junior_tokenizer, p.problem) for p in PROBLEMS]
    sampling = Sampling(max_new_tokens=1000, temperature=1.0)  # (no budget binds: the bridge counts differently)
    multi, compared = 0, 0
    for seed in range(12):  # the first two seeds whose chains all end before the budget
        ours = bridge_handoff(senior, junior, sp, jp, sampling, seed=seed, max_rounds=6)
        if not set(ours["stops"]) <= {"eos", "max_rounds"}:
            continue
        ref = bridge_generate(senior, junior, sp, jp, Schedule("alternate"), sampling, seed=seed, max_rounds=6, score=False)
        assert ours["texts"] == ref.texts and ours["spans"] == ref.spans
        assert torch.equal(ours["rollout"].owner_BT, ref.rollout.owner_BT)
        assert ours["rollout"].rounds_B.tolist() == ref.rollout.rounds_B.tolist()
        multi += sum(len(s) > 2 for s in ours["spans"])
        compared += 1
        if compared == 2:
            break
    assert compared == 2 and multi >= 2, "the fixture must exercise several handoffs"


def test_bridged_budget_counts_senior_tokens(models, tokenizer, junior_tokenizer):
    senior = make_side(models[0], tokenizer, [tokenizer.eos_token_id])
    junior = make_side(models[1], junior_tokenizer, [junior_tokenizer.eos_token_id])
    sp = [_render(tokenizer, p.problem) for p in PROBLEMS]
    jp = [_render(junior_tokenizer, p.problem) for p in PROBLEMS]
    for budget in (3, 9, 17):
        out = bridge_handoff(senior, junior, sp, jp, Sampling(max_new_tokens=budget, temperature=1.0), seed=1)
        for text, stop, spans in zip(out["texts"], out["stops"], out["spans"]):
            n = len(tokenizer(text, add_special_tokens=False)["input_ids"])
            assert n <= budget and stop in ("eos", "budget", "empty_turn", "max_rounds")
            assert not spans or spans[-1][1] == len(text)
        assert "budget" in out["stops"]


def test_whitespace_turn_ends_the_chain_with_a_reason(tokenizer, junior_tokenizer, models):
    """A junior that only writes blank lines ends the chains it gets a turn in, counted as empty_turn."""
    quick = make_tiny_model(len(tokenizer), 0, 48)
    bias_token(quick, tokenizer.encode("\n", add_special_tokens=False)[0], 6.0)
    senior = make_side(quick, tokenizer, [tokenizer.eos_token_id])
    blank = make_tiny_model(len(junior_tokenizer), 5, 32)
    bias_token(blank, junior_tokenizer.encode("\n\n", add_special_tokens=False)[0], 50.0)
    junior = make_side(blank, junior_tokenizer, [junior_tokenizer.eos_token_id])
    sp = [_render(tokenizer, p.problem) for p in PROBLEMS]
    jp = [_render(junior_tokenizer, p.problem) for p in PROBLEMS]
    out = bridge_handoff(senior, junior, sp, jp, Sampling(max_new_tokens=300, temperature=1.0), seed=0)
    for stop, spans, text in zip(out["stops"], out["spans"], out["texts"]):
        if stop == "empty_turn":
            assert spans and not text[spans[-1][0]:].strip()
    assert out["stops"].count("empty_turn") >= 2


def _pair_kw(**kw):
    return dict(n=2, sampling=Sampling(max_new_tokens=24, temperature=1.0), seed=0, reward_fn=_reward,
                batch_size=4, curve_ps=(1.0, 0.5), progress=False, score_batch=3, **kw)


def test_cross_pair_metrics_and_chains(models, tokenizer, junior_tokenizer):
    rows = []
    m, chains = evaluate_any_pair(models[0], models[1], tokenizer, junior_tokenizer, PROBLEMS, sink=rows.append,
                                  **_pair_kw())
    assert m["vocabulary"] == "different"
    for k in ("junior_ce", "junior_top1", "kl_senior_junior", "kl_senior_junior_exact", "junior_ce_by_decile"):
        assert m[k] == NA
    assert set(m["curve"]) == {"1.0", "0.5"} and m["curve"]["1.0"] == m["solo_pass@1"]
    assert m["junior_bpb"] > 0 and math.isfinite(m["communication_tax"])
    assert sum(m["handoff_stops"].values()) == m["n_chains"] == 8
    solo = [r for r in rows if r["mode"] == "solo"]
    hand = [r for r in rows if r["mode"] == "handoff"]
    curve = [r for r in rows if r["mode"] == "curve-p0.5"]
    assert len(solo) == len(hand) == len(curve) == 8 and len(rows) == 24
    key = lambda r: (r["mode"], r["problem_id"], r["sample"])  # noqa: E731
    assert sorted(chains, key=key) == sorted(rows, key=key)
    assert all("junior_bpb" in r for r in solo)
    assert m["junior_bpb"] == pytest.approx(sum(r["junior_bpb"] for r in solo if r["junior_bpb"] is not None)
                                            / sum(r["junior_bpb"] is not None for r in solo))
    for r in hand:
        assert r["stop"] in ("eos", "budget", "max_rounds", "empty_turn")
        assert "".join(t["text"] for t in r["turns"]) == r["text"]
        assert all(a[1] == b[0] for a, b in zip(r["spans"], r["spans"][1:]))


def test_identical_models_tax_zero_and_equal_bpb_both_ways(tokenizer):
    from tandem_rlvr.evaluation.evaluate import evaluate_pair

    a = make_tiny_model(len(tokenizer), 3, 32)
    b = make_tiny_model(len(tokenizer), 3, 32)
    ab, _ = evaluate_any_pair(a, b, tokenizer, tokenizer, PROBLEMS, **_pair_kw())
    ba, _ = evaluate_any_pair(b, a, tokenizer, tokenizer, PROBLEMS, **_pair_kw())
    assert ab["vocabulary"] == "shared"
    assert ab["communication_tax"] == 0.0 == ba["communication_tax"]
    assert ab["junior_bpb"] == ba["junior_bpb"] and ab["junior_bpb"] > 0
    assert ab["kl_senior_junior_exact"] == pytest.approx(0.0, abs=1e-6)
    c = make_tiny_model(len(tokenizer), 4, 48)
    plain, plain_chains = evaluate_pair(c, a, tokenizer, PROBLEMS, **_pair_kw())
    ca, ca_chains = evaluate_any_pair(c, a, tokenizer, tokenizer, PROBLEMS, **_pair_kw())
    assert {k: v for k, v in ca.items() if k in plain} == plain, "same-tokenizer numbers unchanged"
    assert [{k: v for k, v in r.items() if k != "junior_bpb"} for r in ca_chains] == plain_chains
    assert ca["junior_bpb"] != ab["junior_bpb"]


@pytest.fixture(scope="module")
def other_family_dir(tmp_path_factory, junior_tokenizer):
    """A saved tiny model on a different tokenizer that has no chat template (plain prompt)."""
    d = tmp_path_factory.mktemp("other_family")
    m = make_tiny_model(len(junior_tokenizer), 2, 32, arch="llama")
    m.generation_config.eos_token_id = junior_tokenizer.eos_token_id
    m.save_pretrained(str(d))
    tok = copy.deepcopy(junior_tokenizer)
    tok.chat_template = None
    tok.save_pretrained(str(d))
    return d


def test_cli_matrix_of_juniors_with_different_tokenizers(model_dirs, other_family_dir, tmp_path):
    from tandem_rlvr.cli import build_parser, main
    from tandem_rlvr.evaluation.eval_cli import resolve_options

    s_dir, j_dir = model_dirs
    bench = tmp_path / "b.jsonl"
    bench.write_text("".join(json.dumps({"problem": f"What is {i} plus 3?", "answer": str(i + 3)}) + "\n" for i in range(2)))
    out = tmp_path / "out"
    argv = ["eval", "--senior", f"s={s_dir}", "--junior", f"same={j_dir}", "--junior", f"other={other_family_dir}",
            "--benchmark", str(bench), "--out", str(out), "--n", "2", "--max-new-tokens", "12", "--batch-size", "4",
            "--reward", "boxed_exact", "--curve-ps", "1.0,0.5", "--no-progress"]
    opts = resolve_options(build_parser().parse_args(argv))
    assert opts.juniors == {"same": str(j_dir), "other": str(other_family_dir)} and opts.junior == str(j_dir)
    assert main(argv) == 0
    obj = json.loads((out / "eval.json").read_text())
    assert set(obj["pairs"]) == {"s+same", "s+other"}
    same, other = obj["pairs"]["s+same"]["macro"], obj["pairs"]["s+other"]["macro"]
    assert same["vocabulary"] == "shared" and isinstance(same["kl_senior_junior_exact"], float)
    assert other["vocabulary"] == "different"
    for key in ("kl_senior_junior", "kl_senior_junior_exact", "junior_ce", "junior_top1"):
        assert other[key] == NA and obj["pairs"]["s+other"]["per_benchmark"]["b"][key] == NA
    assert same["solo_pass@1"] == other["solo_pass@1"], "the solo chains do not depend on the junior"
    assert obj["pairs"]["s+other"]["templates"] == {"senior": "chat", "junior": "plain"}
    cells = obj["matrix"]["cells"]["s"]
    assert cells["other"]["kl_senior_junior_exact"] == NA and cells["same"]["junior_bpb"] > 0
    assert cells["other"]["communication_tax"] == other["communication_tax"]
    md = (out / "eval.md").read_text()
    assert "n/a (different tokenizers)" in md and "junior other" in md and "plain template" in md
    assert "| s+other | n/a (different tokenizers) |  |  |" in md, "the decile row says n/a"
    assert set(other["curve"]) == {"1.0", "0.5"}
    assert "matrix.png" in md and (out / "matrix.png").stat().st_size > 1000
    rows = [json.loads(x) for x in (out / "chains" / "s_other" / "b.jsonl").read_text().splitlines()]
    assert {r["mode"] for r in rows} == {"solo", "handoff", "curve-p0.5"}
    assert all(r["junior"] == "other" for r in rows)
    assert all("junior_bpb" in r for r in rows if r["mode"] == "solo")
    assert all(r["spans"][0][0] == 0 and r["spans"][-1][1] == len(r["text"]) for r in rows if r["mode"] == "handoff" and r["text"])


def _word_sides(models, tokenizer, junior_tokenizer):
    return (make_side(models[0], tokenizer, [tokenizer.eos_token_id]),
            make_side(models[1], junior_tokenizer, [junior_tokenizer.eos_token_id]))


@pytest.mark.parametrize("p", [1.0, 0.0])
def test_word_bridge_extremes_keep_one_author(models, tokenizer, junior_tokenizer, p):
    from tandem_rlvr.evaluation.crosstok import word_bridge

    sides = _word_sides(models, tokenizer, junior_tokenizer)
    sp = [_render(tokenizer, x.problem) for x in PROBLEMS]
    jp = [_render(junior_tokenizer, x.problem) for x in PROBLEMS]
    out = word_bridge(*sides, sp, jp, Sampling(max_new_tokens=30, temperature=1.0), p=p, seed=2)
    assert out["rollout"].rounds_B.tolist() == [1] * len(PROBLEMS)
    assert all(len(s) <= 1 and all(o == int(p) for _, _, o in s) for s in out["spans"])


def test_word_bridge_hands_off_whole_words(models, tokenizer, junior_tokenizer):
    from tandem_rlvr.evaluation.crosstok import word_bridge

    sides = _word_sides(models, tokenizer, junior_tokenizer)
    sp = [_render(tokenizer, x.problem) for x in PROBLEMS]
    jp = [_render(junior_tokenizer, x.problem) for x in PROBLEMS]
    out = word_bridge(*sides, sp, jp, Sampling(max_new_tokens=80, temperature=1.0), p=0.5, seed=4)
    switches = 0
    for text, spans, rounds in zip(out["texts"], out["spans"], out["rollout"].rounds_B.tolist()):
        assert not spans or (spans[0][0] == 0 and spans[-1][1] == len(text))
        assert all(a[2] != b[2] and a[1] == b[0] for a, b in zip(spans, spans[1:])) and len(spans) <= rounds
        switches += max(0, len(spans) - 1)
    assert switches >= 4, f"the fixture must exercise several word handoffs, got {switches}"
    again = word_bridge(*sides, sp, jp, Sampling(max_new_tokens=80, temperature=1.0), p=0.5, seed=4)
    assert again["texts"] == out["texts"] and again["spans"] == out["spans"]


def _word_turns(side, tokenizer, p: float, max_gap: int, first_author: bool, n_tokens: int = 30):
    """One turn of ``side`` per problem under the ``word`` schedule (coins of P(senior) = ``p``)."""
    from tandem_rlvr.engines.handoff import CoinStream, SequenceSchedule
    from tandem_rlvr.engines.turns import decode_turn

    sched = Schedule("word", p=p, max_gap=max_gap)
    coins = CoinStream(len(PROBLEMS), p, 0)
    scheds = [SequenceSchedule(sched, coins, b, first_author=first_author) for b in range(len(PROBLEMS))]
    seqs = [tokenizer(_render(tokenizer, x.problem), add_special_tokens=False)["input_ids"] for x in PROBLEMS]
    sampling = Sampling(max_new_tokens=n_tokens, temperature=1.0)
    return decode_turn(side, seqs, [n_tokens] * len(PROBLEMS), sampling, torch.Generator().manual_seed(9), scheds), scheds


@pytest.mark.parametrize("max_gap", [32, 3])
def test_a_word_turn_ends_after_the_token_where_the_coin_hands_over(models, tokenizer, junior_tokenizer, max_gap):
    """The coin falls after a word-start token (kept by its writer) or after K = ``max_gap`` tokens without one:
    a coin that always hands over ends the turn right there; one that never does lets it run to its cap."""
    side = _word_sides(models, tokenizer, junior_tokenizer)[0]
    starts = side.table.boundary_V
    free, kept = _word_turns(side, tokenizer, 1.0, max_gap, True)
    cut, moved = _word_turns(side, tokenizer, 0.0, max_gap, True)
    checked = 0
    for f, c, s_free, s_cut in zip(free, cut, kept, moved):
        assert not f.ended and s_free.author and s_free.rounds == 1
        first = next((i for i, t in enumerate(f.ids) if bool(starts[t]) or i + 1 >= max_gap), None)
        if first is None or tokenizer.eos_token_id in f.ids[:first + 1]:
            assert c.ids == f.ids
            continue
        assert c.ended and c.ids == f.ids[:first + 1], (f.ids, c.ids)
        assert not s_cut.author and s_cut.rounds == 2
        checked += 1
    assert checked >= 2, "the fixture must exercise coins"


def test_word_bridge_follows_the_same_tokenizer_rule(models, tokenizer):
    """Identical tokenizers routed through the cross-tokenizer path: the owners of the emitted tokens are
    those the lockstep rule (:func:`tandem_rlvr.engines.handoff.simulate`) gives that token stream with the
    same seed: same coins, same owners, coin after the word-start token, K cap, no turn limit."""
    from tandem_rlvr.engines.handoff import make_schedule, simulate
    from tandem_rlvr.evaluation.crosstok import word_bridge

    senior = make_side(models[0], tokenizer, [tokenizer.eos_token_id])
    junior = make_side(make_tiny_model(len(tokenizer), 2, 32), tokenizer, [tokenizer.eos_token_id])  # another model, same tokenizer
    prompts = [_render(tokenizer, x.problem) for x in PROBLEMS]
    switches = 0
    for seed, max_gap in ((4, 32), (5, 32), (6, 4)):
        out = word_bridge(senior, junior, prompts, prompts, Sampling(max_new_tokens=60, temperature=1.0), p=0.5,
                          seed=seed, max_gap=max_gap)
        rows = [[t for _, ids in c.turns for t in ids] for c in out["chains"]]
        owners = [[int(a) for a, ids in c.turns for _ in ids] for c in out["chains"]]
        T = max(len(r) for r in rows)
        ids_BT = torch.tensor([r + [tokenizer.pad_token_id] * (T - len(r)) for r in rows])
        want, _ = simulate(make_schedule("word", tokenizer, p=0.5, max_gap=max_gap), ids_BT, seed=seed)
        for b, own in enumerate(owners):
            assert own == want[b, :len(own)].tolist(), (seed, b)
            switches += sum(x != y for x, y in zip(own, own[1:]))
    assert switches >= 6, f"the fixture must exercise several word handoffs, got {switches}"


def test_both_vocabularies_read_one_settings_object_and_write_one_record_and_metric_shape(models, tokenizer,
                                                                                         junior_tokenizer):
    """A pair with two tokenizers and a pair with one take the same EvalSettings and assemble their records and
    metrics with the same helpers: the same fields (the bridge adds its stop reason and spans; scores it cannot
    compute are n/a), the settings' sample count and curve."""
    from tandem_rlvr.evaluation.evaluate import EvalSettings

    s = EvalSettings(n=2, sampling=Sampling(max_new_tokens=12, temperature=1.0), batch_size=4, curve_ps=(0.5,),
                     progress=False, score_batch=3)
    cross, cross_chains = evaluate_any_pair(models[0], models[1], tokenizer, junior_tokenizer, PROBLEMS, s,
                                            reward_fn=_reward)
    same, same_chains = evaluate_any_pair(models[0], copy.deepcopy(models[0]), tokenizer, tokenizer, PROBLEMS, s,
                                          reward_fn=_reward)
    scores = {"junior_ce", "junior_top1", "kl_mc", "kl_exact"}
    fields = lambda chains, extra: {r["mode"]: set(r) - scores - extra for r in chains}  # noqa: E731
    assert fields(cross_chains, {"stop", "spans"}) == fields(same_chains, set())
    assert all({"stop", "spans"} <= set(r) for r in cross_chains if r["mode"] != "solo")
    assert set(same) <= set(cross) and cross["vocabulary"] == "different"
    for m in (cross, same):
        assert (m["n_samples"], m["n_chains"], set(m["curve"])) == (2, 2 * len(PROBLEMS), {"0.5"})
    assert cross["solo_pass@1"] == same["solo_pass@1"], "the senior's solo chains do not depend on the junior"


def test_a_rope_scaled_model_reads_the_same_context_in_evaluation_and_training():
    """The bridged evaluation reads a model's limit through :func:`tandem_rlvr.context.model_context`,
    as preflight and validation do: a yarn x4 config reads 8192 positions in both, not its raw 4096."""
    from types import SimpleNamespace

    from tandem_rlvr.context import model_context
    from tandem_rlvr.evaluation.crosstok import read_limit

    cfg = SimpleNamespace(max_position_embeddings=4096,
                          rope_parameters={"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 2048})
    model = SimpleNamespace(config=cfg)
    assert read_limit("senior", model) == model_context("senior", "m", cfg).limit == 8192
    assert read_limit("senior", model, 5000) == 5000  # --context caps it
    assert read_limit("junior", SimpleNamespace(config=None), 300) == 300


def test_a_junior_of_another_vocabulary_with_a_shorter_context_reads_the_chains_truncated(junior_tokenizer, tmp_path,
                                                                                           model_dirs):
    """docs/evaluation.md: a cross-tokenizer junior whose context is shorter than the chains reads them truncated
    from the left (bits per byte of the rest; its handoff turns likewise), so the up-front context check that
    refuses such a junior of the senior's vocabulary does not refuse this one."""
    from tandem_rlvr.cli import main
    from tandem_rlvr.data import render_prompt

    s_dir, _ = model_dirs
    problems = [f"What is {i} plus 3?" for i in range(2)]
    plain = copy.deepcopy(junior_tokenizer)
    plain.chat_template = None
    longest = max(len(plain(render_prompt(plain, p), add_special_tokens=False)["input_ids"]) for p in problems)
    short = tmp_path / "short_other"
    m = make_tiny_model(len(junior_tokenizer), 2, 32, arch="llama")
    m.config.max_position_embeddings = longest + 4  # the chains reach --max-new-tokens 24 past the prompt
    m.generation_config.eos_token_id = junior_tokenizer.eos_token_id
    m.save_pretrained(str(short))
    plain.save_pretrained(str(short))
    bench = tmp_path / "b.jsonl"
    bench.write_text("".join(json.dumps({"problem": p, "answer": "4"}) + "\n" for p in problems))
    out = tmp_path / "out"
    assert main(["eval", "--senior", f"s={s_dir}", "--junior", str(short), "--benchmark", str(bench), "--out", str(out),
                 "--n", "2", "--max-new-tokens", "24", "--reward", "boxed_exact", "--no-curve", "--no-progress",
                 "--temperature", "1.0", "--top-k", "0", "--top-p", "1.0"]) == 0
    macro = json.loads((out / "eval.json").read_text())["macro"]
    assert macro["vocabulary"] == "different" and macro["junior_bpb_truncated_chains"] > 0
