"""Evaluation: teacher-forced scores against direct computation, tax and handoff behaviour, the CLI.

Tiny random Qwen2 models on the fixture tokenizer; a few have an ``lm_head`` bias that pushes them
toward chosen tokens (the newline that ends a ``"\\n\\n"`` step, an answer digit, or EOS).
"""

from __future__ import annotations

import copy
import importlib
import json
import math
import sys
import types
import zlib
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch

from helpers.tiny_models import make_tiny_model
from tandem_rlvr.evaluation.evaluate import (
    ModeResult,
    chain_scores,
    drift_kl,
    eval_sampling,
    evaluate_pair,
    junior_legibility,
    pass_metrics,
    tax_metrics,
)
from tandem_rlvr.evaluation.metrics import pass_at_k
from tandem_rlvr.evaluation.validation import validate
from tandem_rlvr.engines.handoff import make_schedule
from tandem_rlvr.engines.rollout import generate


# ---------------------------------------------------------------------------------------------------
from tandem_rlvr.engines.types import Sampling
# Fixtures and helpers
# ---------------------------------------------------------------------------------------------------


@pytest.fixture(autouse=True, scope="module")
def _one_thread():
    """Tiny models run far faster on one intra-op thread (no thread hand-off per small op)."""
    old = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(old)


@dataclass(frozen=True)
class _Example:
    id: str
    problem: str
    answer: str


def _standin_data() -> types.ModuleType:
    """Stand-in for ``tandem_rlvr.data`` (used only while the real one is not there)."""
    mod = types.ModuleType("tandem_rlvr.data")

    class DataError(ValueError):
        pass

    def render_prompt(tokenizer, problem):
        return tokenizer.apply_chat_template([{"role": "user", "content": problem}], tokenize=False,
                                             add_generation_prompt=True)

    def load_examples(source, split=None, *, problem_key="problem", answer_key="answer", id_key=None, limit=None):
        p = Path(source)
        if not p.is_file():
            raise DataError(f"no benchmark file {source!r}")
        rows = [json.loads(line) for line in p.read_text().splitlines() if line.strip()]
        ex = [_Example(str(r[id_key]) if id_key else str(i), r[problem_key], str(r[answer_key])) for i, r in enumerate(rows)]
        return ex[:limit] if limit else ex

    mod.DataError, mod.Example, mod.render_prompt, mod.load_examples = DataError, _Example, render_prompt, load_examples
    return mod


@pytest.fixture(autouse=True, scope="module")
def data_layer():
    """The real data layer when present, else the stand-in above."""
    try:
        mod = importlib.import_module("tandem_rlvr.data")
        if hasattr(mod, "load_examples") and hasattr(mod, "render_prompt"):
            yield mod
            return
    except ImportError:
        pass
    mp = pytest.MonkeyPatch()
    mod = _standin_data()
    mp.setitem(sys.modules, "tandem_rlvr.data", mod)
    yield mod
    mp.undo()


def examples(k: int, answer=lambda i: str(i + 3)) -> list[_Example]:
    return [_Example(str(i), f"What is {i} plus 3?" + " Add them up." * (i % 3), answer(i)) for i in range(k)]


def ids_of(tok, text: str) -> int:
    (i,) = tok(text, add_special_tokens=False)["input_ids"]
    return i


def biased(model, bias: dict[int, float]):
    """``model`` with an untied ``lm_head`` that adds ``bias[token]`` to those logits."""
    old = model.get_output_embeddings()
    head = torch.nn.Linear(old.in_features, old.out_features, bias=True)
    with torch.no_grad():
        head.weight.copy_(old.weight)
        head.bias.zero_()
        for t, b in bias.items():
            head.bias[t] = b
    model.lm_head = head
    return model.eval()


def prompts(tok, texts):
    enc = [tok(t, add_special_tokens=False)["input_ids"] for t in texts]
    P = max(map(len, enc))
    ids = torch.tensor([[tok.pad_token_id] * (P - len(e)) + e for e in enc])
    mask = torch.tensor([[0] * (P - len(e)) + [1] * len(e) for e in enc])
    return ids, mask, enc


def solo_rollout(model, tok, texts, *, n_new=12, seed=0, sampling=None, repeat=1, eos=None):
    ids, mask, enc = prompts(tok, texts)
    ids, mask = ids.repeat_interleave(repeat, 0), mask.repeat_interleave(repeat, 0)
    ro = generate(model, None, ids, mask, make_schedule("none"), sampling or Sampling(n_new, 1.0),
                  eos_token_ids=[tok.eos_token_id] if eos is None else eos, pad_token_id=tok.pad_token_id,
                  seed=seed, record_junior=False)
    return ro, [e for e in enc for _ in range(repeat)]


def parity_reward(text: str, gold: str) -> float:
    """Depends on every character of the text (so a changed chain can change the score)."""
    return float(zlib.crc32(text.encode()) % 2)


class _NoSplit:
    """A model wrapper without ``get_decoder``: forces the full-logit fallback of the scorer."""

    def __init__(self, m):
        self.m = m

    def __call__(self, **kw):
        return self.m(**kw)

    def parameters(self):
        return self.m.parameters()

    def get_output_embeddings(self):
        return self.m.get_output_embeddings()


# ---------------------------------------------------------------------------------------------------
# Teacher-forced scores
# ---------------------------------------------------------------------------------------------------


def _direct(senior, junior, enc, ro):
    """Per chain: mean CE, top-1, MC KL, exact KL and per-token CE, one prefix forward per token."""
    out = []
    for b, prompt in enumerate(enc):
        n = int(ro.response_mask_BT[b].sum())
        resp = ro.response_ids_BT[b, :n].tolist()
        ce, top1, mc, ex = [], [], [], []
        for t in range(n):
            x = torch.tensor([prompt + resp[:t]])
            lj = torch.log_softmax(junior(input_ids=x).logits[0, -1].float(), -1)
            ls = torch.log_softmax(senior(input_ids=x).logits[0, -1].float(), -1)
            ce.append(-float(lj[resp[t]]))
            top1.append(float(int(lj.argmax()) == resp[t]))
            mc.append(float(ls[resp[t]] - lj[resp[t]]))
            ex.append(float((ls.exp() * (ls - lj)).sum()))
        out.append({"ce": sum(ce) / n, "top1": sum(top1) / n, "mc": sum(mc) / n, "exact": sum(ex) / n, "ce_tok": ce})
    return out


@torch.inference_mode()
def test_scores_equal_direct_per_token_computation(tokenizer):
    senior = make_tiny_model(len(tokenizer), seed=0, hidden=48)
    junior = make_tiny_model(len(tokenizer), seed=1)
    texts = ["What is 3 plus 4?", "Tom has 12 apples and gives away 5. How many?", "7"]
    ro, enc = solo_rollout(senior, tokenizer, texts, n_new=11, seed=3)
    direct = _direct(senior, junior, enc, ro)
    # chunk_tokens=5 and score_batch=2 split the work across chunks and row batches
    fast = chain_scores(senior, junior, ro, chunk_tokens=5, score_batch=2)
    slow = chain_scores(_NoSplit(senior), _NoSplit(junior), ro, chunk_tokens=7, score_batch=3)
    for sc in (fast, slow):
        for key, dk in (("junior_ce", "ce"), ("junior_top1", "top1"), ("kl_mc", "mc"), ("kl_exact", "exact")):
            got = sc[key].tolist()
            want = [d[dk] for d in direct]
            assert got == pytest.approx(want, abs=1e-5), key
        assert sc["n_tokens"].tolist() == [int(m.sum()) for m in ro.response_mask_BT]
    # deciles of chain 0: token t of L goes to floor(10 t / L); each bin's mean of the direct CEs
    ce0 = direct[0]["ce_tok"]
    L = len(ce0)
    for d in range(10):
        vals = [c for t, c in enumerate(ce0) if (10 * t) // L == d]
        got = float(fast["junior_ce_deciles"][0, d])
        assert (got == pytest.approx(sum(vals) / len(vals), abs=1e-5)) if vals else got != got
    # the single-purpose wrappers give the same numbers
    leg = junior_legibility(junior, ro)
    assert leg["junior_ce"].tolist() == pytest.approx(fast["junior_ce"].tolist(), abs=1e-6)
    assert "kl_mc" not in leg
    assert drift_kl(senior, junior, ro)["kl_exact"].tolist() == pytest.approx(fast["kl_exact"].tolist(), abs=1e-6)


@torch.inference_mode()
def test_kl_of_a_model_with_itself_is_zero(tokenizer):
    m = make_tiny_model(len(tokenizer), seed=4)
    ro, _ = solo_rollout(m, tokenizer, ["What is 3 plus 4?", "So"], n_new=9, repeat=2)
    kl = drift_kl(m, copy.deepcopy(m), ro)
    assert kl["kl_exact"].abs().max() < 1e-6
    assert kl["kl_mc"].abs().max() < 1e-6


@torch.inference_mode()
def test_monte_carlo_kl_close_to_exact(tokenizer):
    """MC (log p_s - log p_j of tokens sampled from the senior at temperature 1, no top-k/p) is an
    unbiased estimate of the exact per-token KL: over 512 chains x 12 tokens the two means must agree
    within 4 standard errors of their per-chain difference (and within 10 % relative)."""
    eos = tokenizer.eos_token_id
    senior = make_tiny_model(len(tokenizer), seed=5)
    junior = make_tiny_model(len(tokenizer), seed=6)
    biased(senior, {eos: -30.0})  # no early stop: every chain has the same length
    biased(junior, {})
    for m in (senior, junior):  # 10x the head: peakier than a fresh init, so the KL is far from 0
        m.lm_head.weight.data.mul_(10.0)
    ro, _ = solo_rollout(senior, tokenizer, ["What is 3 plus 4?", "Tom has 12 apples."], n_new=12, repeat=256,
                         sampling=Sampling(12, temperature=1.0, top_p=1.0, top_k=0))
    kl = drift_kl(senior, junior, ro, chunk_tokens=2048, score_batch=128)
    diff = kl["kl_mc"] - kl["kl_exact"]
    se = float(diff.std() / diff.numel() ** 0.5)
    exact, mc = float(kl["kl_exact"].mean()), float(kl["kl_mc"].mean())
    assert exact > 0.3
    assert abs(mc - exact) < 4 * se, (mc, exact, se)
    assert abs(mc - exact) < 0.1 * exact


# ---------------------------------------------------------------------------------------------------
# Handoff behaviour
# ---------------------------------------------------------------------------------------------------


def test_word_tandem_at_p1_is_the_solo_run(tokenizer):
    """The curve's p = 1 point reuses the solo chains; this is the engine property that justifies it."""
    m, j = make_tiny_model(len(tokenizer), seed=0), make_tiny_model(len(tokenizer), seed=1)
    ids, mask, _ = prompts(tokenizer, ["What is 3 plus 4?", "Tom has 12 apples."] * 3)
    kw = dict(eos_token_ids=[tokenizer.eos_token_id], pad_token_id=tokenizer.pad_token_id, seed=11, record_junior=False)
    a = generate(m, j, ids, mask, make_schedule("none"), eval_sampling(16), **kw)
    b = generate(m, j, ids, mask, make_schedule("word", tokenizer, p=1.0), eval_sampling(16), **kw)
    assert torch.equal(a.response_ids_BT, b.response_ids_BT)


def _check_alternation(chain: dict) -> None:
    turns = chain["turns"]
    assert turns[0]["owner"] == "senior"
    assert all(a["owner"] != b["owner"] for a, b in zip(turns, turns[1:]))
    assert sum(t["tokens"] for t in turns) == chain["n_tokens"]
    text = ""
    for t in turns[:-1]:  # every handoff happens right after a "\n\n" step end
        text += t["text"]
        assert text.endswith("\n\n"), turns


def test_self_paired_senior_has_zero_tax_and_chains_alternate(tokenizer):
    """Junior = a copy of the senior: every handoff chain is the solo chain (common random numbers),
    so the tax is exactly 0 (tolerance 1e-9) although the text-dependent reward varies; a different
    junior changes the chains, so the check has power."""
    nl = ids_of(tokenizer, "\n")
    senior = biased(make_tiny_model(len(tokenizer), seed=0, hidden=48), {nl: 1.5})
    kw = dict(n=8, sampling=eval_sampling(32), seed=1, reward_fn=parity_reward, curve_ps=(1.0, 0.5), batch_size=16,
              progress=False)
    m, chains = evaluate_pair(senior, copy.deepcopy(senior), tokenizer, examples(6), **kw)
    assert m["n_problems"] == 6 and m["n_samples"] == 8 and m["n_chains"] == 48
    assert 0.2 < m["solo_pass@1"] < 0.8
    assert abs(m["communication_tax"]) < 1e-9
    assert m["handoff_pass@1"] == m["solo_pass@1"] and m["handoff_pass@8"] == m["solo_pass@8"]
    assert m["curve"]["0.5"] == m["solo_pass@1"] and m["curve"]["1.0"] == m["solo_pass@1"]
    assert m["handoff_rounds"] > 2.0 and 0.2 < m["handoff_senior_frac"] < 0.8
    by = {(c["mode"], c["problem_id"], c["sample"]): c for c in chains}
    hand = [c for c in chains if c["mode"] == "handoff"]
    assert len(hand) == 48 and {c["mode"] for c in chains} == {"solo", "handoff", "curve-p0.5"}
    assert all(c["text"] == by[("solo", c["problem_id"], c["sample"])]["text"] for c in hand)
    for c in hand:
        _check_alternation(c)
    assert max(len(c["turns"]) for c in hand) >= 4
    assert m["junior_ce"] > 0 and abs(m["kl_senior_junior_exact"]) < 1e-6
    # power: a different junior rewrites the chains after the first step
    other = biased(make_tiny_model(len(tokenizer), seed=7, hidden=48), {nl: 1.5})
    m2, chains2 = evaluate_pair(senior, other, tokenizer, examples(6), **(kw | {"curve_ps": None}))
    changed = [c for c in chains2 if c["mode"] == "handoff" and c["text"] != by[("solo", c["problem_id"], c["sample"])]["text"]]
    assert len(changed) > 24 and "curve" not in m2
    for c in chains2:
        if c["mode"] == "handoff":
            _check_alternation(c)


def test_max_rounds_caps_handoff_turns(tokenizer):
    nl = ids_of(tokenizer, "\n")
    senior = biased(make_tiny_model(len(tokenizer), seed=0, hidden=48), {nl: 1.5})
    junior = biased(make_tiny_model(len(tokenizer), seed=1), {nl: 1.5})
    m, chains = evaluate_pair(senior, junior, tokenizer, examples(3), n=4, sampling=eval_sampling(40), seed=2,
                              reward_fn=parity_reward, curve_ps=None, batch_size=12, max_rounds=3, progress=False)
    hand = [c for c in chains if c["mode"] == "handoff"]
    assert all(len(c["turns"]) <= 3 and c["rounds"] <= 3 for c in hand)
    assert any(len(c["turns"]) == 3 for c in hand)
    for c in hand:
        _check_alternation(c)


def test_junior_that_always_emits_eos_fails_the_team(tokenizer):
    """The reward needs >= 2 steps and the answer; the senior alone writes them, but in step handoff
    the junior ends the chain (EOS) right after the senior's first step, so the team always fails."""
    nl, seven, eos = ids_of(tokenizer, "\n"), ids_of(tokenizer, "7"), tokenizer.eos_token_id
    senior = biased(make_tiny_model(len(tokenizer), seed=0, hidden=48), {nl: 3.5, seven: 3.5, eos: -30.0})
    junior = biased(make_tiny_model(len(tokenizer), seed=1), {eos: 50.0})

    def two_steps_and_answer(text: str, gold: str) -> float:
        return float(text.count("\n\n") >= 2 and gold in text)

    m, chains = evaluate_pair(senior, junior, tokenizer, examples(4, answer=lambda i: "7"), n=8,
                              sampling=eval_sampling(32), seed=0, reward_fn=two_steps_and_answer,
                              curve_ps=None, batch_size=32, progress=False)
    # alone the senior passes ~94% (a chain that spends the 32-token budget before its second step fails):
    # 0.875-0.97 over seeds 0-3; >= 75% leaves room for another CPU's sampled tokens
    assert m["solo_pass@1"] >= 0.75
    assert m["handoff_pass@1"] == 0.0 and m["handoff_pass@8"] == 0.0
    assert m["communication_tax"] >= 75.0
    hand = [c for c in chains if c["mode"] == "handoff"]
    assert sum(c["finished"] for c in hand) >= 0.9 * len(hand)
    for c in hand:
        assert c["reward"] == 0.0
        if not c["finished"]:  # the senior's first step used the whole budget: no handoff happened
            assert [t["owner"] for t in c["turns"]] == ["senior"] and c["n_tokens"] == 32
            continue
        s, j = c["turns"]
        assert c["rounds"] == 2 and s["owner"] == "senior"
        assert s["text"].endswith("\n\n") and "\n\n" not in s["text"][:-2]
        assert j == {"owner": "junior", "text": "", "tokens": 1}  # the EOS alone


def test_evaluation_is_deterministic(tokenizer):
    s, j = make_tiny_model(len(tokenizer), seed=0, hidden=48), make_tiny_model(len(tokenizer), seed=1)
    kw = dict(n=2, sampling=eval_sampling(10), seed=5, reward_fn=parity_reward, curve_ps=(0.5,), batch_size=3, progress=False)
    a, ca = evaluate_pair(s, j, tokenizer, examples(3), **kw)
    b, cb = evaluate_pair(s, j, tokenizer, examples(3), **kw)
    assert a == b and [c["text"] for c in ca] == [c["text"] for c in cb]
    c, _ = evaluate_pair(s, j, tokenizer, examples(3), **(kw | {"seed": 6}))
    assert c != a


# ---------------------------------------------------------------------------------------------------
# validate() for the trainer, and the command line
# ---------------------------------------------------------------------------------------------------


def _write_bench(path: Path, k: int) -> Path:
    rows = [{"problem": f"What is {i} plus 3?", "answer": str(i + 3), "uid": f"q{i}"} for i in range(k)]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_validate_solo_only(tokenizer, tmp_path):
    from tandem_rlvr.config import Config

    cfg = Config()
    cfg.val.data, cfg.val.n, cfg.val.limit, cfg.val.max_new_tokens = str(_write_bench(tmp_path / "v.jsonl", 5)), 2, 3, 6
    cfg.train.seed = 3
    senior = make_tiny_model(len(tokenizer), seed=0).train()
    out = validate(senior, tokenizer, cfg, step=10, reward_fn=parity_reward)
    assert set(out) >= {"val/pass@1", "val/pass@2", "val/pass@1_se", "val/len", "val/n_problems"}
    assert "val/pass@4" not in out and out["val/n_problems"] == 3 and out["val/len"] <= 6
    assert 0 < out["val/pass@1"] < 1 and out["val/pass@1"] <= out["val/pass@2"], "the reward must give signal"
    assert senior.training  # mode restored
    assert validate(senior, tokenizer, cfg, step=20, reward_fn=parity_reward) == out  # same seed at every step
    cfg.train.seed = 4
    assert validate(senior, tokenizer, cfg, step=10, reward_fn=parity_reward) != out  # the check has power


def test_validation_shared_by_two_processes_gives_the_one_process_metrics(tokenizer, tmp_path):
    """Each process samples every other batch (the same batches and seeds as one process); the combined chains
    give one process's metrics."""
    from tandem_rlvr.config import Config

    cfg = Config()
    cfg.val.data, cfg.val.n, cfg.val.limit, cfg.val.max_new_tokens = str(_write_bench(tmp_path / "v.jsonl", 5)), 4, 5, 6
    cfg.rollout.batch_size = 3  # 20 chains in 7 batches: problems straddle batches and processes
    senior = make_tiny_model(len(tokenizer), seed=0)
    whole = validate(senior, tokenizer, cfg, step=1, reward_fn=parity_reward)
    shares = {}

    class Handed(Exception):
        pass

    def keep(chains):
        shares[1] = chains
        raise Handed

    with pytest.raises(Handed):
        validate(senior, tokenizer, cfg, step=1, reward_fn=parity_reward, shard=(1, 2), gather=keep)
    got = validate(senior, tokenizer, cfg, step=1, reward_fn=parity_reward, shard=(0, 2),
                   gather=lambda chains: chains + shares[1])
    assert 0 < len(shares[1]) < 20
    assert got.keys() == whole.keys() and all(got[k] == pytest.approx(whole[k], abs=1e-12) for k in whole)
    with pytest.raises(ValueError, match="problem ids unique"):
        validate(senior, tokenizer, cfg, step=1, reward_fn=parity_reward, shard=(0, 2), gather=lambda c: c + c)


@pytest.fixture(scope="module")
def world_models():
    """The shipped warm-started world models (senior, junior): they solve a good share of world problems."""
    from tandem_rlvr.world.build import prebuilt_world

    root = prebuilt_world()
    assert root is not None, "the shipped world (src/tandem_rlvr/world/prebuilt) is missing or does not verify"
    return root / "senior", root / "junior"


def _world_bench(path: Path, start: int, k: int) -> tuple[Path, dict]:
    """World test problems ``start .. start + k`` as a local benchmark file; returns it and {uid: gold}."""
    from tandem_rlvr.data import load_examples

    ex = load_examples("arith/test")[start:start + k]
    path.write_text("".join(json.dumps({"problem": e.problem, "answer": e.answer, "uid": e.id}) + "\n" for e in ex))
    return path, {e.id: e.answer for e in ex}


def _chain_means(rows: list[dict]) -> dict:
    """Mean reward per mode over chain rows: pass@1 recomputed from the written chains."""
    modes: dict = {}
    for r in rows:
        modes.setdefault(r["mode"], []).append(r["reward"])
    return {m: sum(v) / len(v) for m, v in modes.items()}


def test_cli_eval_writes_all_outputs(world_models, tmp_path, capsys):
    """World senior (and the junior as a self-paired senior) on world problems: non-zero accuracies, so the
    tax's value and sign, the curve, the chains' rewards and the rerun equality are checked on real numbers."""
    from tandem_rlvr.cli import main
    from tandem_rlvr.rewards import math_reward

    s_dir, j_dir = world_models
    (b1, gold1), (b2, _) = _world_bench(tmp_path / "arith.jsonl", 0, 4), _world_bench(tmp_path / "small.jsonl", 4, 2)
    out = tmp_path / "out"
    argv = ["eval", "--senior", f"base={s_dir}", "--senior", f"other={j_dir}", "--junior", str(j_dir),
            "--benchmark", str(b1), "--benchmark", str(b2), "--out", str(out), "--n", "2", "--max-new-tokens", "112",
            "--batch-size", "8", "--reward", "math", "--reward-workers", "1", "--curve-ps", "1.0,0.5", "--no-progress",
            "--limit", "4", "--id-key", "uid"]
    assert main(argv) == 0
    obj = json.loads((out / "eval.json").read_text())
    assert set(obj["seniors"]) == {"base", "other"}
    for res in obj["seniors"].values():
        assert set(res["per_benchmark"]) == {"arith", "small"}
        for m in [*res["per_benchmark"].values(), res["macro"]]:
            for key in ("solo_pass@1", "solo_pass@2", "handoff_pass@1", "handoff_pass@2", "communication_tax",
                        "junior_ce", "junior_top1", "kl_senior_junior", "kl_senior_junior_exact", "curve",
                        "n_problems", "n_samples", "junior_ce_by_decile"):
                assert key in m, key
            assert set(m["curve"]) == {"1.0", "0.5"} and "solo_pass@4" not in m
            # the tax is solo minus handoff, in points (positive: the handoff costs accuracy)
            assert m["communication_tax"] == pytest.approx(100 * (m["solo_pass@1"] - m["handoff_pass@1"]), abs=1e-9)
            assert m["curve"]["1.0"] == m["solo_pass@1"]  # word tandem at p = 1 is the solo run
        assert res["per_benchmark"]["arith"]["n_problems"] == 4 and res["macro"]["n_problems"] == 6
    base, other = obj["seniors"]["base"]["per_benchmark"]["arith"], obj["seniors"]["other"]["per_benchmark"]["arith"]
    assert 0 < base["solo_pass@1"] < 1 and 0 < base["handoff_pass@1"] < 1, "the world models must score"
    assert base["communication_tax"] > 0, "the stronger senior handing off to the weaker junior loses accuracy here"
    assert base["curve"]["0.5"] not in (0.0, 1.0)
    assert base["kl_senior_junior_exact"] > 0.1 and base["junior_ce"] > other["junior_ce"]
    # the junior paired with itself: every handoff chain is its solo chain, no tax, no drift
    assert 0 < other["solo_pass@1"] and other["communication_tax"] == 0.0
    assert abs(obj["seniors"]["other"]["macro"]["kl_senior_junior_exact"]) < 1e-6
    assert obj["settings"]["temperature"] == 0.7 and obj["settings"]["top_k"] == 20 and obj["settings"]["top_p"] == 0.8
    md = (out / "eval.md").read_text()
    assert "| senior |" in md and "tax (pts)" in md and "p=0.5" in md and "handoff_curve.png" in md
    assert (out / "handoff_curve.png").stat().st_size > 1000 and (out / "junior_ce_deciles.png").stat().st_size > 1000
    rows = [json.loads(line) for line in (out / "chains" / "base" / "arith.jsonl").read_text().splitlines()]
    assert len(rows) == 4 * 2 * 3  # problems x samples x (solo, handoff, curve-p0.5)
    assert {r["mode"] for r in rows} == {"solo", "handoff", "curve-p0.5"}
    for r in rows:
        assert {"senior", "benchmark", "problem_id", "mode", "text", "turns", "reward"} <= set(r)
        assert r["senior"] == "base" and r["benchmark"] == "arith"
        assert r["reward"] == math_reward(r["text"], gold1[r["problem_id"]])  # graded against the right gold
        if r["mode"] != "curve-p0.5":  # word-level tandem draws the first author by a coin
            assert r["turns"][0]["owner"] == "senior"
    # the reported numbers are the chains' rewards
    means = _chain_means(rows)
    assert means["solo"] == pytest.approx(base["solo_pass@1"]) and means["handoff"] == pytest.approx(base["handoff_pass@1"])
    assert means["curve-p0.5"] == pytest.approx(base["curve"]["0.5"])
    assert not list(out.rglob("*.tmp"))
    assert "tax (pts)" in capsys.readouterr().out
    page = (out / "eval.html").read_text()  # self-contained: the tables, the plots inline, every chain
    assert "<table>" in page and "data:image/png;base64," in page and "src='http" not in page
    data = json.loads(page.split("<script type='application/json' id='chain-data'>")[1].split("</script>")[0])
    assert sorted(r["id"] for r in data["runs"]) == ["base/arith", "base/small", "other/arith", "other/small"]
    arith = next(r for r in data["runs"] if r["id"] == "base/arith")
    assert sum(len(c) for p in arith["problems"] for c in p["chains"].values()) == len(rows)
    assert all(p["q"] for p in arith["problems"])  # the problem texts are shown
    # a rerun reuses the finished parts and rewrites identical numbers
    before, chains_mtime = obj["seniors"], (out / "chains" / "base" / "arith.jsonl").stat().st_mtime_ns
    assert main(argv) == 0
    assert json.loads((out / "eval.json").read_text())["seniors"] == before
    assert (out / "chains" / "base" / "arith.jsonl").stat().st_mtime_ns == chains_mtime  # not recomputed
    # --overwrite recomputes, and a seeded rerun gives the same (non-zero) numbers
    assert main(argv + ["--overwrite"]) == 0
    assert (out / "chains" / "base" / "arith.jsonl").stat().st_mtime_ns != chains_mtime
    again = json.loads((out / "eval.json").read_text())["seniors"]
    strip = lambda r: {b: {k: v for k, v in m.items() if k not in ("time_s", "reward_stats")} for b, m in r["per_benchmark"].items()}
    assert all(strip(again[s]) == strip(before[s]) for s in before)
    assert again["base"]["per_benchmark"]["arith"]["communication_tax"] == base["communication_tax"] != 0


def test_cli_eval_from_config_file(world_models, tmp_path):
    from tandem_rlvr.cli import main

    s_dir, j_dir = world_models
    bench, gold = _world_bench(tmp_path / "arith.jsonl", 0, 3)
    cfg = tmp_path / "eval.yaml"
    cfg.write_text(f"senior: {s_dir}\njunior: {j_dir}\nbenchmark: [{bench}]\nn: 2\nmax_new_tokens: 112\n"
                   f"reward: math\nreward_workers: 1\nno_curve: true\nprogress: false\nid_key: uid\n"
                   f"out: {tmp_path / 'cfg_out'}\n")
    assert main(["eval", "--config", str(cfg), "--n", "1"]) == 0  # the flag wins over the file
    obj = json.loads((tmp_path / "cfg_out" / "eval.json").read_text())
    m = obj["per_benchmark"]["arith"]
    assert obj["senior"] == Path(s_dir).name and m["n_samples"] == 1 and "curve" not in m
    rows = [json.loads(line) for line in (tmp_path / "cfg_out" / "chains").rglob("*.jsonl").__next__().read_text().splitlines()]
    assert sorted(r["problem_id"] for r in rows if r["mode"] == "solo") == sorted(gold)
    assert 0 < m["solo_pass@1"] == pytest.approx(_chain_means(rows)["solo"])
    assert obj["macro"]["solo_pass@1"] == m["solo_pass@1"]
    cfg.write_text(cfg.read_text() + "bogus_key: 1\n")
    assert main(["eval", "--config", str(cfg)]) == 2


def test_report_tables_and_missing_values(tmp_path):
    from tandem_rlvr.evaluation.report import benchmark_table, curve_table, fmt, seniors_table, write_eval_report

    assert fmt(None) == "–" and fmt(float("nan"), "pct") == "–"
    assert fmt(0.4567, "pct", 0.01) == "45.7 ± 1.0" and fmt(-1.25, "pts") == "-1.2" and fmt(3, "int") == "3"
    a = {"n_problems": 2, "solo_pass@1": 0.5, "communication_tax": 10.0, "curve": {"1.0": 0.5, "0.5": 0.25}}
    res = {"per_benchmark": {"a": a, "b": {**a, "solo_pass@1": float("nan")}}, "macro": a}
    table = benchmark_table(res)
    assert table.splitlines()[0] == "| benchmark | problems | solo p@1 (%) | tax (pts) |"
    assert "| b | 2 | – | +10.0 |" in table and "**macro**" in table
    assert "| x | 50.0 | 25.0 |" in curve_table({"x": res})
    assert "| x | 2 | 50.0 | +10.0 |" in seniors_table({"x": res})
    paths = write_eval_report(tmp_path, {"x": res})
    assert [p.name for p in paths] == ["eval.md", "handoff_curve.png"]


def test_eval_options_reuse_the_training_options_they_share():
    """An option both configs have is documented once: EvalOptions takes the training field's doc (and its
    default, except where METHOD.md §5 sets the evaluation's own: sampling at 0.7 / 0.8 / 20)."""
    import dataclasses

    from tandem_rlvr.config import DataConfig, ModelConfig, RolloutConfig
    from tandem_rlvr.evaluation.options import EvalOptions

    ev = {f.name: f for f in dataclasses.fields(EvalOptions)}
    own = {"temperature": 0.7, "top_p": 0.8, "top_k": 20}
    shared = {RolloutConfig: ("max_new_tokens", "temperature", "top_p", "top_k", "mode", "vllm_memory"),
              DataConfig: ("problem_key", "answer_key", "reward_timeout_s", "reward_workers"),
              ModelConfig: ("trust_remote_code",)}
    opts = EvalOptions()
    for section, names in shared.items():
        train = {f.name: f for f in dataclasses.fields(section)}
        for name in names:
            assert ev[name].metadata["doc"] == train[name].metadata["doc"], name
            assert getattr(opts, name) == own.get(name, getattr(section(), name)), name


# ---------------------------------------------------------------------------------------------------
# pass@k and tax of an evaluation, by hand
# ---------------------------------------------------------------------------------------------------


def _mean(xs):
    return sum(xs) / len(xs)


def test_tax_is_signed_percentage_points_of_solo_minus_handoff():
    solo = ModeResult(rewards=[[1.0, 1.0, 0.0, 1.0], [0.0, 1.0, 0.0, 0.0], [1.0, 1.0, 1.0, 1.0]])
    hand = ModeResult(rewards=[[0.0, 1.0, 0.0, 0.0], [0.0, 0.0, 0.0, 0.0], [1.0, 0.0, 0.0, 1.0]])
    d = [0.75 - 0.25, 0.25 - 0.0, 1.0 - 0.5]
    se = math.sqrt(sum((x - _mean(d)) ** 2 for x in d) / 2 / 3)
    t = tax_metrics(solo, hand)
    assert t["communication_tax"] == pytest.approx(100 * _mean(d))  # 33.3 points
    assert t["communication_tax_se"] == pytest.approx(100 * se)
    back = tax_metrics(hand, solo)  # a handoff that helps is a negative tax
    assert back["communication_tax"] == pytest.approx(-100 * _mean(d))
    assert back["communication_tax_se"] == pytest.approx(100 * se)


def test_pass_metrics_of_a_mode():
    res = ModeResult(rewards=[[1.0, 0.0, 0.0, 0.0], [1.0, 1.0, 0.0, 1.0]], n_tokens=[3, 5, 7, 9, 11, 13, 2, 4],
                      finished=[True, False, True, True, False, True, True, True])
    m = pass_metrics("solo", res, (1, 2, 8))
    assert set(m) == {"solo_pass@1", "solo_pass@2", "solo_pass@1_se", "solo_len", "solo_finished"}
    assert m["solo_pass@1"] == pytest.approx((0.25 + 0.75) / 2)
    assert m["solo_pass@2"] == pytest.approx((pass_at_k(4, 1, 2) + pass_at_k(4, 3, 2)) / 2)
    assert pass_at_k(4, 1, 2) == pytest.approx(0.5) and pass_at_k(4, 3, 2) == pytest.approx(1.0)
    assert m["solo_pass@1_se"] == pytest.approx(math.sqrt(((0.25 - 0.5) ** 2 + (0.75 - 0.5) ** 2) / 1 / 2))
    assert m["solo_len"] == pytest.approx(_mean([3, 5, 7, 9, 11, 13, 2, 4]))
    assert m["solo_finished"] == pytest.approx(6 / 8)
