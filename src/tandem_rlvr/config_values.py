"""How a value from YAML or a ``key=value`` override becomes its config field's type (:func:`coerce`), for the
training config and the options of ``tandem-rlvr eval`` alike: YAML 1.1's readings (``off`` as False,
``1e-6`` as a string) mapped back to what the user wrote, anything else an error naming the key."""

from __future__ import annotations

import types
import typing
from typing import Any

from tandem_rlvr.errors import ConfigError


def coerce(value: Any, tp: Any, key: str) -> Any:
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        args = typing.get_args(tp)
        if value is None and type(None) in args:
            return None
        inner = [a for a in args if a is not type(None)]
        return coerce(value, inner[0], key)
    if tp is bool:
        if isinstance(value, bool):
            return value
        word = _bool_word(value)
        if word is not None:
            return word
    elif tp is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        if isinstance(value, (float, str)) and not isinstance(value, bool):  # 1e3 (YAML 1.1: a string), 8.0
            try:
                if float(value) == int(float(value)):
                    return int(float(value))
            except (ValueError, OverflowError):
                pass
    elif tp is float:
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return float(value)
        if isinstance(value, str):  # YAML 1.1 reads 1e-6 (no dot) as a string
            try:
                return float(value)
            except ValueError:
                pass
    elif tp is str:
        if isinstance(value, str):
            return value
        word = _str_word(value, key)
        if word is not None:
            return word
    elif tp is list or origin is list:
        if isinstance(value, (list, tuple)):
            return list(value)
        if isinstance(value, str):  # train.trackers=tensorboard or a,b: a comma-separated list
            return [v.strip() for v in value.split(",") if v.strip()]
    else:
        return value
    raise ConfigError(f"config key {key!r} must be {getattr(tp, '__name__', tp)}, got {value!r} ({type(value).__name__})")


def _bool_word(value: Any) -> bool | None:
    """A quoted or numeric boolean ("off", "yes", 0, 1, ...) as a bool; None if it is none."""
    if isinstance(value, int) and value in (0, 1):
        return bool(value)
    if isinstance(value, str):
        return {"true": True, "yes": True, "on": True, "1": True,
                "false": False, "no": False, "off": False, "0": False}.get(value.strip().lower())
    return None


def _str_word(value: Any, key: str) -> str | None:
    """The word a user typed for a word-valued key that YAML read as something else.

    YAML 1.1 reads off/no/false as False (all "off": train.fsdp=off works, unquoted, in files and
    overrides), and the overrides read none/null as None (handoff.schedule=none). yes/on/true have
    no word to map to in any key; they get an error that says so.
    """
    if value is False:
        return "off"
    if value is None:
        return "none"
    if value is True:
        raise ConfigError(f"config key {key!r} takes a word, got True: YAML reads yes/on/true as a boolean; "
                          f"write the word you mean (quoted if it is one of those)")
    if isinstance(value, (int, float)):
        return str(value)
    return None
