"""Tandem RLVR: GRPO on rollouts a trainable senior co-writes with a frozen junior."""

__version__ = "0.1.0"

from tandem_rlvr.world import problems as _world  # noqa: E402,F401 (registers the data source "world/<split>")
