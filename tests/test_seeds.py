"""The derived seeds: one hash (tandem_rlvr.seeds.derive_seed), its values pinned so a seeded run
samples the same rollouts as before the hash had a name."""

from __future__ import annotations

import zlib

import pytest

from tandem_rlvr.evaluation.evaluate import batch_seed
from tandem_rlvr.seeds import ROW_WEIGHTS, derive_seed
from tandem_rlvr.training.trainer import _step_seed


@pytest.mark.parametrize("seed,tag,b", [(0, "solo", 0), (1234, "handoff", 3), (2**31, "curve-p0.5", 7)])
def test_the_evaluation_batch_seed_keeps_its_values(seed, tag, b):
    assert batch_seed(seed, tag, b) == (seed * 1_000_003 + zlib.crc32(tag.encode()) * 7919 + b * 104_729) % (2**31 - 1)


def test_pinned_values():
    assert batch_seed(0, "solo", 0) == zlib.crc32(b"solo") * 7919 % (2**31 - 1)
    assert batch_seed(1234, "handoff", 3) == 1180860459
    assert _step_seed(1234, 5) == 1234043297  # the trainer's seed of step 5
    assert _step_seed(2**40, 0) == 2**40 * 1_000_003 % (2**31 - 1)
    assert derive_seed(1234, 3, weights=ROW_WEIGHTS) == 9772049  # the vLLM request of row 3
    assert derive_seed(2**31, 5, weights=ROW_WEIGHTS) == (2**31 * 7919 + 5) % (2**31 - 1)


def test_more_parts_than_weights_is_an_error():
    with pytest.raises(ValueError, match="3 parts, only 2 weights"):
        derive_seed(1, 2, 3, weights=ROW_WEIGHTS)
