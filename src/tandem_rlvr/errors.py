"""User-facing error types, and the tuple of them the CLI prints as one clear line."""

from __future__ import annotations


class TandemError(RuntimeError):
    """A run that must stop rather than train the wrong thing (fails closed)."""


def user_errors() -> tuple[type[BaseException], ...]:
    """Every exception type whose message is meant for the user (no traceback needed)."""
    from tandem_rlvr.config import ConfigError
    from tandem_rlvr.data import DataError
    from tandem_rlvr.models import ModelLoadError

    # OS errors that name a path the user chose (e.g. train.out_dir under a file, or read-only)
    paths = (FileNotFoundError, NotADirectoryError, IsADirectoryError, PermissionError)
    return (ConfigError, DataError, ModelLoadError, TandemError, *paths)
