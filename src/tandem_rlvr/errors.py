"""Every user-facing error type, in one module that imports nothing (the CLI prints them as one line)."""

from __future__ import annotations


# Exit codes of `tandem-rlvr train` (docs/faults.md): 0 done, 2 a problem you fix
# (config, data, disk full), 75 a peer process vanished, 124 the watchdog stopped a hung step,
# train.preempt_exit_code (143) preempted by a signal after writing a checkpoint.
EXIT_USER, EXIT_PEER_LOST, EXIT_HUNG = 2, 75, 124


class TandemError(RuntimeError):
    """A run that must stop rather than train the wrong thing (fails closed)."""

    exit_code = EXIT_USER


class DiskFull(TandemError):
    """Writing a checkpoint or result file ran out of space; the message names the path and the space needed."""


class PeerLost(TandemError):
    """Another process of a multi-process run vanished or stopped answering collectives."""

    exit_code = EXIT_PEER_LOST


class VerifierUnavailable(TandemError):
    """No answer-checker worker could start (math-verify missing or broken, no processes allowed): every answer
    would score 0, so the run stops; the message names the reward and the cause."""


class Preempted(Exception):
    """A scheduler's signal stopped the run after a checkpoint was written (not an error: requeue it)."""

    def __init__(self, message: str, exit_code: int):
        super().__init__(message)
        self.exit_code = exit_code


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
