"""Tandem RLVR: GRPO on rollouts a trainable senior co-writes with a frozen junior."""

from importlib.metadata import PackageNotFoundError, version

try:  # the one source of the version: pyproject.toml's, as installed
    __version__ = version("tandem-rlvr")
except PackageNotFoundError:  # sources on the path without an install
    __version__ = "0+unknown"
