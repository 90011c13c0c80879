"""How a value from YAML, a ``key=value`` override or a flag becomes its config field's type (:func:`coerce`), for
the training config and the options of ``tandem-rlvr eval`` alike: YAML 1.1's readings (``off`` as False,
``1e-6`` as a string) mapped back to what the user wrote, a comma-separated text as a list (each element of a
``list[float]`` a float), ``[NAME=]PATH`` items as a :data:`NamedPaths` map; anything else an error naming the
key."""

from __future__ import annotations

import types
import typing
from pathlib import Path
from typing import Any

from tandem_rlvr.errors import ConfigError

__all__ = ["NamedPaths", "coerce", "named_paths"]

NamedPaths = typing.NewType("NamedPaths", dict)
"""A field of models or files by name: ``name -> path`` (``--senior [NAME=]PATH``, repeatable; a YAML mapping)."""


def coerce(value: Any, tp: Any, key: str) -> Any:
    """``value`` as type ``tp``; ``key`` names the field in the error (``config key 'algo.lr'``)."""
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
        items = _items(value)
        if items is not None:
            args = typing.get_args(tp)
            return [coerce(v, args[0], key) for v in items] if args else items
    elif tp is NamedPaths:
        return named_paths(value, key)
    elif tp is dict and isinstance(value, str):  # a flag's text: {enable_thinking: false}
        import yaml

        try:
            parsed = yaml.safe_load(value)
        except yaml.YAMLError:
            parsed = None
        return parsed if isinstance(parsed, dict) else value  # not a mapping: the field's own check names it
    else:
        return value
    raise ConfigError(f"{key} must be {getattr(tp, '__name__', tp)}, got {value!r} ({type(value).__name__})")


def _items(value: Any) -> list | None:
    """A list as given, or a comma-separated text (train.trackers=tensorboard,wandb) as its items; else None."""
    if isinstance(value, (list, tuple)):
        return list(value)
    if isinstance(value, str):
        return [v.strip() for v in value.split(",") if v.strip()]
    return None


def named_paths(value: Any, key: str) -> dict[str, str]:
    """``{name: path}`` of a mapping, or of ``[NAME=]PATH`` items (one text or a list of them): a missing name is
    the path's last part (``runs/x/best`` is ``best``), a name given twice gets ``_2``, ``_3``, ..."""
    if isinstance(value, dict):
        items = [(str(k), str(v)) for k, v in value.items()]
    elif isinstance(value, (str, list, tuple)):
        items = []
        for text in [value] if isinstance(value, str) else value:
            name, _, path = str(text).partition("=")
            items.append((name, path) if path and name and "/" not in name else ("", str(text)))
    else:
        raise ConfigError(f"{key} must be [NAME=]PATH items or a mapping of names to paths, got {value!r}")
    out: dict[str, str] = {}
    for name, path in items:
        base = name or Path(path.rstrip("/")).name or path
        name, i = base, 2
        while name in out:
            name, i = f"{base}_{i}", i + 1
        out[name] = path
    return out


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
        raise ConfigError(f"{key} takes a word, got True: YAML reads yes/on/true as a boolean; "
                          f"write the word you mean (quoted if it is one of those)")
    if isinstance(value, (int, float)):
        return str(value)
    return None
