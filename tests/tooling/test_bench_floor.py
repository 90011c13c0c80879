"""benchmarks/p7_cpu_loop.py's arithmetic floor counts the CPU flash attention (issue 37): torch 2.13's
``FlopCounterMode`` counts only the CUDA attention kernels, so without P7's formulas the floor of a step
would leave out its attention. Checked on a hand-computed count: ``2 · 2·B·H·Lq·Lk·D`` forward (the score
and value products) and five such products backward (the scores recomputed, then dV, dP, dQ, dK), whatever
the machine."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from torch.utils.flop_counter import FlopCounterMode

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def p7():
    sys.path.insert(0, str(ROOT / "benchmarks"))  # p7 imports its sibling `common`
    spec = importlib.util.spec_from_file_location("tandem_bench_p7", ROOT / "benchmarks" / "p7_cpu_loop.py")
    mod = importlib.util.module_from_spec(spec)
    try:
        spec.loader.exec_module(mod)
        yield mod
    finally:
        sys.path.remove(str(ROOT / "benchmarks"))
        sys.modules.pop("common", None)


def test_cpu_attention_counted_forward_and_backward(p7):
    B, H, Hkv, Lq, Lk, D = 2, 4, 2, 5, 7, 8
    q = torch.randn(B, H, Lq, D, requires_grad=True)
    k, v = torch.randn(B, Hkv, Lk, D), torch.randn(B, Hkv, Lk, D)
    p7._count_cpu_attention()
    p7._count_cpu_attention()  # a second call registers nothing twice
    with FlopCounterMode(display=False) as fwd:
        out = F.scaled_dot_product_attention(q, k, v, enable_gqa=True)
    forward = 2 * (2 * B * H * Lq * Lk * D)  # q·kᵀ and p·v, one multiply-add = 2 FLOPs
    if fwd.get_total_flops() == 0:
        pytest.fail("CPU attention not counted (the kernel took another path than the flash one?)")
    assert fwd.get_total_flops() == forward
    with FlopCounterMode(display=False) as bwd:
        out.sum().backward()
    assert bwd.get_total_flops() == 5 * forward // 2  # scores again, dV, dP, dQ, dK: five products of q·kᵀ's size


def test_matmul_rate_is_a_rate(p7):
    rate = p7._matmul_rate(reps=2e6)
    assert 0.01 < rate < 1e5  # GFLOP/s of one thread: positive and finite on any machine
