"""One tokenizer, output layers of different sizes (Qwen2.5-0.5B: 151,936 rows, Qwen2.5-7B: 152,064): the audit runs
the pair as one vocabulary over the rows both have, with every per-token metric, instead of through the text bridge."""

from __future__ import annotations

import contextlib
import json
from dataclasses import dataclass

import pytest
import torch
from helpers.tiny_models import make_tiny_model

from tandem_rlvr.engines.types import Sampling
from tandem_rlvr.evaluation.crosstok import evaluate_any_pair, same_vocabulary, shared_output_rows

EXTRA = 7  # padding rows past the tokenizer's ids


@dataclass(frozen=True)
class Ex:
    id: str
    problem: str
    answer: str


PROBLEMS = [Ex("0", "What is 3 plus 4?", "7"), Ex("1", "6 times 7?", "42"), Ex("2", "hi", "1")]


def _reward(text: str, gold: str) -> float:
    return float(gold in text)


def _padded_and_cut(vocab: int, seed: int, hidden: int):
    """A model with ``EXTRA`` padding rows, and the same model with exactly ``vocab`` rows (its first rows)."""
    padded = make_tiny_model(vocab + EXTRA, seed, hidden)
    with torch.no_grad():  # the padding rows score high: a cut that kept them would show in every metric
        padded.get_output_embeddings().weight[vocab:] *= 4.0
    exact = make_tiny_model(vocab, seed, hidden)
    state = {k: (v[:vocab] if v.shape[:1] == (vocab + EXTRA,) else v) for k, v in padded.state_dict().items()}
    exact.load_state_dict(state)
    return padded, exact


def _kw():
    return dict(n=2, sampling=Sampling(max_new_tokens=16, temperature=1.0), seed=0, reward_fn=_reward, batch_size=4,
                curve_ps=(1.0, 0.5), progress=False, score_batch=3)


def test_the_cut_is_a_view_of_the_first_rows_and_is_undone(tokenizer):
    V = len(tokenizer)
    small = make_tiny_model(V, 1, 32)
    big, _ = _padded_and_cut(V, 2, 32)
    head, tied = big.get_output_embeddings(), big.get_input_embeddings()
    weight = head.weight
    assert weight is tied.weight and not same_vocabulary(small, big, tokenizer, tokenizer)
    x = torch.tensor([[1, 5, 9, 3]])
    with torch.no_grad():
        full = big(input_ids=x).logits
    with shared_output_rows(small, big, tokenizer, tokenizer) as cut, torch.no_grad():
        assert cut == f"senior {V} rows, junior {V + EXTRA}: the junior's output layer cut to the first {V} (the tokenizer has {V} ids)"
        assert same_vocabulary(small, big, tokenizer, tokenizer)
        assert head.weight.data_ptr() == weight.data_ptr() and head.out_features == V  # no copy
        got = big(input_ids=x).logits
        assert got.shape[-1] == V
        torch.testing.assert_close(got, full[..., :V])
        assert big.get_input_embeddings().weight.shape[0] == V + EXTRA  # inputs keep every row
    assert head.weight is weight is tied.weight and head.out_features == V + EXTRA  # the tie is back


def test_nothing_is_cut_for_other_tokenizers_or_equal_rows(tokenizer):
    from tandem_rlvr.world.tokenizer import build_tokenizer
    from helpers.tiny_models import CORPUS

    other = build_tokenizer(CORPUS, vocab_size=280)
    a, b = make_tiny_model(len(tokenizer), 1, 32), make_tiny_model(len(tokenizer) + EXTRA, 2, 32)
    with shared_output_rows(a, b, tokenizer, other) as cut:
        assert cut is None and b.get_output_embeddings().out_features == len(tokenizer) + EXTRA
    with shared_output_rows(a, make_tiny_model(len(tokenizer), 3, 32), tokenizer, tokenizer) as cut:
        assert cut is None


@pytest.mark.parametrize("larger", ["senior", "junior"])
def test_a_pair_with_padding_rows_is_audited_as_the_pair_cut_to_the_shared_rows(tokenizer, larger):
    V = len(tokenizer)
    padded, exact = _padded_and_cut(V, 5, 48 if larger == "senior" else 32)
    other = make_tiny_model(V, 6, 32 if larger == "senior" else 48)
    pair = (lambda m: (m, other)) if larger == "senior" else (lambda m: (other, m))
    got, got_chains = evaluate_any_pair(*pair(padded), tokenizer, tokenizer, PROBLEMS, **_kw())
    want, want_chains = evaluate_any_pair(*pair(exact), tokenizer, tokenizer, PROBLEMS, **_kw())
    assert got["vocabulary"] == "shared" and isinstance(got["kl_senior_junior_exact"], float)
    assert got["output_rows"].startswith(f"senior {V + EXTRA if larger == 'senior' else V} rows")
    assert "output_rows" not in want
    assert [c["text"] for c in got_chains] == [c["text"] for c in want_chains]
    for key in ("solo_pass@1", "handoff_pass@1", "junior_ce", "junior_top1", "kl_senior_junior_exact", "junior_bpb"):
        assert got[key] == pytest.approx(want[key], rel=1e-5, abs=1e-6), key
    assert padded.get_output_embeddings().out_features == V + EXTRA  # restored


def test_eval_command_audits_the_pair_as_one_vocabulary(model_dirs, tokenizer, tmp_path):
    from tandem_rlvr.cli import main

    s_dir, _ = model_dirs
    j_dir = tmp_path / "padded_junior"
    junior = make_tiny_model(len(tokenizer) + EXTRA, 1, 32)
    junior.generation_config.eos_token_id = tokenizer.eos_token_id
    junior.save_pretrained(str(j_dir))
    tokenizer.save_pretrained(str(j_dir))
    bench = tmp_path / "b.jsonl"
    bench.write_text("".join(json.dumps({"problem": f"What is {i} plus 3?", "answer": str(i + 3)}) + "\n" for i in range(2)))
    out = tmp_path / "out"
    argv = ["eval", "--senior", f"s={s_dir}", "--junior", str(j_dir), "--benchmark", str(bench), "--out", str(out),
            "--n", "2", "--max-new-tokens", "12", "--batch-size", "4", "--reward", "boxed_exact", "--no-progress"]
    assert main(argv) == 0
    macro = json.loads((out / "eval.json").read_text())["macro"]
    assert macro["vocabulary"] == "shared" and isinstance(macro["junior_ce"], float)
    assert macro["output_rows"].startswith(f"senior {len(tokenizer)} rows, junior {len(tokenizer) + EXTRA}")


def test_vllm_engine_refuses_output_layers_of_two_sizes(model_dirs, tokenizer, tmp_path):
    from tandem_rlvr.config import ConfigError
    from tandem_rlvr.evaluation import eval_cli
    from tandem_rlvr.evaluation.options import EvalOptions

    s_dir, _ = model_dirs
    junior = make_tiny_model(len(tokenizer) + EXTRA, 1, 32)
    opts = EvalOptions(seniors={"s": str(s_dir)}, juniors={"j": "j"}, engine="vllm", out=str(tmp_path / "o"))
    with contextlib.ExitStack() as rows, pytest.raises(ConfigError, match="--engine vllm needs output layers of one size"):
        eval_cli._load_senior(opts, "s", str(s_dir), tokenizer, junior, tokenizer, "j", "j", None, rows)
    assert junior.get_output_embeddings().out_features == len(tokenizer) + EXTRA  # the junior's layer is back
