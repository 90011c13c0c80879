"""The user-facing error types, gathered so the CLI can print them as one clear line."""

from __future__ import annotations


def _collect() -> tuple[type[BaseException], ...]:
    from tandem_rlvr.config import ConfigError
    from tandem_rlvr.models import ModelLoadError
    from tandem_rlvr.trainer import TandemError

    found: list[type[BaseException]] = [ConfigError, ModelLoadError, TandemError, FileNotFoundError]
    try:
        from tandem_rlvr.data import DataError

        found.append(DataError)
    except ImportError:  # pragma: no cover - data layer always present in releases
        pass
    return tuple(found)


USER_ERRORS = _collect()
