"""Tandem RLVR: GRPO on rollouts a trainable senior co-writes with a frozen junior."""

__version__ = "0.1.0"
