"""Fixtures the evaluation tests share."""

import pytest


@pytest.fixture
def no_weights(monkeypatch):
    """Loading any model's weights fails the test: the refusal must come first."""
    import tandem_rlvr.models as models

    def refuse(name, **_):
        raise AssertionError(f"weights of {name!r} were loaded before the refusal")

    monkeypatch.setattr(models, "load_causal_lm", refuse)
