"""Float comparisons that hold on any CPU: tolerances scaled to the magnitude of the values compared.

Two computations of the same function that sum in another order (a merged LoRA weight, a batched
forward instead of a per-row one, AVX2 instead of AVX-512 kernels) differ by a few float32 ulps of the
*largest* term they sum, not by a fixed absolute amount; so the tolerance here is ``rel`` times the
largest magnitude compared (docs/testing.md, "Float comparisons").
"""

from __future__ import annotations

import torch

FP32_EPS = torch.finfo(torch.float32).eps


def scale_of(*tensors: torch.Tensor) -> float:
    """The largest finite magnitude among ``tensors`` (1.0 when they are all zero or empty)."""
    m = 0.0
    for t in tensors:
        t = t.detach().float()
        t = t[torch.isfinite(t)]
        if t.numel():
            m = max(m, float(t.abs().max()))
    return m or 1.0


def assert_close_to_scale(actual: torch.Tensor, expected: torch.Tensor, *, ulps: float = 256.0, msg=None) -> None:
    """``actual`` equals ``expected`` up to ``ulps`` float32 epsilons of the largest value compared.

    256 ulps (about 3e-5 relative to the largest value) covers any reordering of the sums of these
    small models and is orders of magnitude below what a real bug moves (a wrong scale, a dropped term)."""
    tol = ulps * FP32_EPS * scale_of(actual, expected)
    torch.testing.assert_close(actual, expected, rtol=ulps * FP32_EPS, atol=tol, msg=msg)
