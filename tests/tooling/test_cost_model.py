"""scripts/cost_model.py, the arithmetic of docs/scale-out.md's predicted step time, checked on hand-computed cases."""

import importlib.util
import sys

import pytest

from helpers.paths import ROOT


@pytest.fixture(scope="module")
def cm():
    spec = importlib.util.spec_from_file_location("cost_model", ROOT / "scripts" / "cost_model.py")
    mod = importlib.util.module_from_spec(spec)
    if "cost_model" in sys.modules:  # loaded already (tests/tooling/test_gpu_check.py's gpu_check imports it)
        return sys.modules["cost_model"]
    sys.modules["cost_model"] = mod  # its dataclasses look their module up
    spec.loader.exec_module(mod)
    return mod


def test_qwen3_4b_sizes_by_hand(cm):
    c = {"hidden_size": 2560, "intermediate_size": 9728, "num_hidden_layers": 36, "num_attention_heads": 32,
         "num_key_value_heads": 8, "head_dim": 128, "vocab_size": 151936, "tie_word_embeddings": True}
    # embeddings 151,936 x 2,560 = 388,956,160; a layer: q and o 2 x 2,560 x 4,096 = 20,971,520, k and v
    # 2 x 2,560 x 1,024 = 5,242,880, SwiGLU 3 x 2,560 x 9,728 = 74,711,040, norms 2 x 2,560 + 2 x 128 = 5,376:
    # 100,930,816 x 36 = 3,633,509,376; the final norm 2,560: 4,022,468,096 (Qwen3-4B: 4.0 B)
    assert cm.params_from_config(c) == 4_022_468_096
    shape = cm.shape_from_config(c)
    # K and V, 36 layers x 8 heads x 128 x 2 B = 147,456 B a token; the dual engine holds two stacks
    assert cm.kv_bytes_per_token(shape) == 147_456 and cm.kv_bytes_per_token(shape, stacks=2) == 294_912
    assert cm.sampler_width(shape, dual=True) == 2 * 151_936 + 1 == 303_873
    assert cm.sampler_width(shape, dual=False) == 151_936


def test_rows_that_fit_and_waves_of_the_issue(cm):
    """~22 GB of KV cache, dual engine (294,912 B a token), rows at the cap (200 + 3,000 tokens)."""
    # 3,200 x 294,912 = 943,718,400 B a row; 22e9 / 943,718,400 = 23.31: 23 rows, 64 rows in 3 waves
    assert cm.rows_that_fit(22e9, 294_912, 3200) == 23
    assert cm.waves(64, 23) == 3 and cm.waves(64, 64) == 1 and cm.waves(64, 65) == 1
    # the old worked example: 64 rows x 1,700 tokens x 294,912 B = 32.1 GB does not fit 22 GB
    assert 64 * 1700 * 294_912 > 22e9 and cm.rows_that_fit(22e9, 294_912, 1700) == 43
    # the cache itself: 0.5 x 80 GiB - 16.08 GB of weights - 2 GiB
    w = cm.weight_bytes(cm.QWEN3_4B, stacks=2)
    assert w == 2 * 4.02e9 * 2
    assert cm.kv_cache_bytes(80 * 2**30, 0.5, w, 2 * 2**30) == pytest.approx(0.5 * 85_899_345_920 - 16.08e9 - 2_147_483_648)


def test_the_rollout_simulation_by_hand(cm):
    """Prompt 1, rows of 2, 2 and 1 tokens, 6 tokens of cache: the first two run (3 + 3 reserved), the third
    waits for them. Weights 100 B at 100 B/s (1 s a step), KV 10 B a token at 10 B/s (1 s a token), host 0.5 s."""
    d = cm.Decode(weights=100, kv_per_token=10, sampler=0, bw_weights=100, bw_kv=10, host_s=0.5)
    out = cm.simulate_rollout(1, [2, 2, 1], 6, d)
    # step 1: rows 1, 2 read contexts 1 + 1: 1 + 2 + 0.5 = 3.5; step 2: 2 + 2: 1 + 4 + 0.5 = 5.5 (both end);
    # step 3: row 3 reads 1: 1 + 1 + 0.5 = 2.5
    assert out == {"seconds": pytest.approx(11.5), "steps": 3, "peak_rows": 2}
    # the sampler: 5 B a row a step at the weights' bandwidth: + (2 + 2 + 1) x 5 / 100 = 0.25 s
    d5 = cm.Decode(weights=100, kv_per_token=10, sampler=5, bw_weights=100, bw_kv=10, host_s=0.5)
    assert cm.simulate_rollout(1, [2, 2, 1], 6, d5)["seconds"] == pytest.approx(11.75)
    # everything fits: step 1 reads contexts 1 + 1 + 1 (4.5 s) and the 1-token row ends; step 2 reads 2 + 2 (5.5 s)
    one = cm.simulate_rollout(1, [2, 2, 1], 100, d)
    assert one == {"seconds": pytest.approx(4.5 + 5.5), "steps": 2, "peak_rows": 3}
    with pytest.raises(ValueError, match="does not fit"):
        cm.simulate_rollout(1, [9], 6, d)


def test_response_lengths_and_the_interpolated_ranges(cm):
    # 2 of 4 rows at the cap, the other 2 at 1,000 + 1,000 x (0.25, 0.75)
    assert cm.response_lengths(4, 3000, 0.5, 1000, 2000) == [3000, 3000, 1250, 1750]
    assert cm.at((0.85, 0.70), 0.0) == 0.85 and cm.at((0.85, 0.70), 1.0) == 0.70
    assert cm.at((0.85, 0.70), 0.5) == pytest.approx(0.775)
    assert cm.at(((300, 2700), (1000, 3000)), 0.5) == (650, 2850)


def test_decode_bytes_by_hand(cm):
    # prompts 10, responses 2 and 4: 4 decode steps x 100 B of weights; contexts 2 x 10 + 1 = 21 and
    # 4 x 10 + 6 = 46 tokens x 3 B
    assert cm.decode_bytes([10, 10], [2, 4], 100, 3) == 4 * 100 + 67 * 3


def test_the_prediction_is_an_interval_and_the_dual_engine_costs_more(cm):
    res = cm.interval(cm.GPUS["a100-80gb"], points=(0.0, 1.0))
    for arm in ("trlvr", "grpo"):
        lo, hi = res[arm]["step_s"]
        assert 0 < lo < hi and res[arm]["with_val_s"][0] > lo
    assert res["trlvr"]["step_s"][0] > res["grpo"]["step_s"][0]
    hi = res["trlvr"]["steps"][1]["rollout"]
    # at the pessimistic end 80% of the rows reach the cap: the dual engine's cache holds fewer rows than 64
    assert hi["fit_at_cap"] < 64 and hi["waves_at_cap"] >= 2 and hi["steps"] > 3000


def test_trainer_memory_by_hand(cm):
    # static: 4.02e9 x (4 B x (float32 weights, gradients, 2 AdamW states) + 2 B bf16 junior) = 72.36 GB (a review
    # caught the old 2 B for everything: 40.2 GB, half the real figure); micro-batch 1 of 100 tokens, 50 of them
    # response: activations with checkpointing 100 x (2 x 2,560 x 36 + 34 x 2,560 + 4 x 9,728); logits 51 x 151,936 x 10 B
    est = cm.trainer_memory(4.02e9, hidden=2560, intermediate=9728, layers=36, vocab=151936, micro=1, row_tokens=100,
                            response_tokens=50, checkpointing=True, vllm_bytes=5e9)
    acts = 100 * (2 * 2560 * 36 + 34 * 2560 + 4 * 9728)
    assert est["static"] == pytest.approx(72.36e9)
    assert est["update"] == pytest.approx(72.36e9 + acts + 51 * 151936 * 10)
    assert est["rollout"] == pytest.approx(72.36e9 + 5e9)
    bf16 = cm.trainer_memory(4.02e9, hidden=2560, intermediate=9728, layers=36, vocab=151936, micro=1, row_tokens=100,
                             response_tokens=50, checkpointing=True, weight_bytes=2, junior=False)
    assert bf16["static"] == pytest.approx(4.02e9 * 8)
    full = cm.trainer_memory(4.02e9, hidden=2560, intermediate=9728, layers=36, vocab=151936, micro=1, row_tokens=100,
                             response_tokens=50, checkpointing=False)
    assert full["activations"] == pytest.approx(100 * 36 * (34 * 2560 + 4 * 9728))
