"""Every user-facing error type, in one module that imports nothing (the CLI prints them as one line)."""

from __future__ import annotations


class TandemError(RuntimeError):
    """A run that must stop rather than train the wrong thing (fails closed)."""


class ConfigError(ValueError):
    """A configuration problem; the message names the offending key."""


class DataError(ValueError):
    """A data source that cannot be used as given (the message names the file, column or name)."""


class ModelLoadError(ValueError):
    """A model or tokenizer could not be loaded or paired; the message names it."""


class EngineError(ValueError):
    """A rollout engine asked for something it does not serve; the message names the engine and the schedule."""


class BridgeError(EngineError):
    """A tandem setting the text bridge cannot serve; the message says why and what to use."""


def user_errors() -> tuple[type[BaseException], ...]:
    """Every exception type whose message is meant for the user (no traceback needed)."""
    # OS errors that name a path the user chose (e.g. train.out_dir under a file, or read-only)
    paths = (FileNotFoundError, NotADirectoryError, IsADirectoryError, PermissionError)
    return (ConfigError, DataError, ModelLoadError, TandemError, EngineError, *paths)
