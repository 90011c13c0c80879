"""Derived seeds: one hash for every seed the library derives from the run's seed.

A derived seed is a weighted sum of integer parts modulo the Mersenne prime 2**31 - 1 (a valid seed
for torch, vLLM and :mod:`random`). The default weights mix (seed, tag or step, row); the vLLM engines'
per-row seeds use :data:`ROW_WEIGHTS` (seed * 7919 + row). The values are pinned in tests/test_seeds.py:
changing a weight changes every sampled rollout of a seeded run.
"""

from __future__ import annotations

__all__ = ["ROW_WEIGHTS", "SEED_MODULUS", "SEED_WEIGHTS", "derive_seed"]

SEED_MODULUS = 2**31 - 1
SEED_WEIGHTS = (1_000_003, 7919, 104_729)  # primes: (run seed, tag hash or step, row)
ROW_WEIGHTS = (7919, 1)  # the vLLM request of row b: seed * 7919 + b


def derive_seed(*parts: int, weights: tuple[int, ...] = SEED_WEIGHTS) -> int:
    """``sum(part * weight) % (2**31 - 1)`` over ``parts`` and the first ``len(parts)`` ``weights``."""
    if len(parts) > len(weights):
        raise ValueError(f"derive_seed: {len(parts)} parts, only {len(weights)} weights")
    return sum(int(p) * w for p, w in zip(parts, weights)) % SEED_MODULUS
