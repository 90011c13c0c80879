"""Shared fixtures: a locally trained tokenizer and tiny random causal LMs (no hub, CPU)."""

from __future__ import annotations

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import pytest
import torch

from helpers.tiny_models import CORPUS, make_tiny_model

# Tiny models: one intra-op thread is faster than two and immune to a busy machine.
torch.set_num_threads(1)


def pytest_configure(config):
    """TANDEM_SLOW=1 runs the slow tests too: it lifts pyproject's default ``-m 'not slow'``."""
    if os.environ.get("TANDEM_SLOW") == "1" and config.option.markexpr == "not slow":
        config.option.markexpr = ""


@pytest.fixture(scope="session")
def tokenizer_dir(tmp_path_factory):
    from tandem_rlvr.world.tokenizer import build_tokenizer

    d = tmp_path_factory.mktemp("tok")
    build_tokenizer(CORPUS, vocab_size=320, out_dir=d)
    return d


@pytest.fixture(scope="session")
def tokenizer(tokenizer_dir):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(tokenizer_dir))
    tok.padding_side = "left"
    return tok


MUTANT_TEST_WALL_S = 30.0  # under mutmut: a test running longer than this has hung or spins (the mutant is caught)


@pytest.fixture(autouse=True)
def _mutant_wall_clock():
    """Under mutmut (``MUTANT_UNDER_TEST`` names a mutant), end the test process once a test runs past
    ``MUTANT_TEST_WALL_S``: mutmut limits only CPU time, and a mutant that makes the reward scorer wait
    forever uses none (the slowest selected test takes ~4 s). Not armed in ordinary runs or mutmut's stats run."""
    mutant = os.environ.get("MUTANT_UNDER_TEST", "")
    if not mutant or mutant == "stats":
        yield
        return
    import faulthandler

    faulthandler.dump_traceback_later(MUTANT_TEST_WALL_S, exit=True)
    try:
        yield
    finally:
        faulthandler.cancel_dump_traceback_later()


@pytest.fixture(scope="session")
def model_dirs(tmp_path_factory, tokenizer, tokenizer_dir):
    """Two tiny saved models (senior, junior) sharing the fixture tokenizer; returns (senior_dir, junior_dir)."""
    out = []
    for name, seed, hidden in (("senior", 0, 48), ("junior", 1, 32)):
        d = tmp_path_factory.mktemp(name)
        m = make_tiny_model(len(tokenizer), seed=seed, hidden=hidden)
        m.generation_config.eos_token_id = tokenizer.eos_token_id
        m.generation_config.pad_token_id = tokenizer.pad_token_id
        m.save_pretrained(str(d))
        tokenizer.save_pretrained(str(d))
        out.append(d)
    return tuple(out)


@pytest.fixture(scope="session")
def world(tmp_path_factory):
    """The built-in world as a user gets it: the shipped copy, installed once per test session into a
    temporary cache: (paths, install seconds). Rebuilds are tested in world/test_world.py (slow)."""
    import time

    from tandem_rlvr.world.build import build_world

    cache = tmp_path_factory.mktemp("world_cache")
    start = time.time()
    paths = build_world(cache, progress=False)
    return paths, time.time() - start
